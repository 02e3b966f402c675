"""Double DQN with a target network and n-step returns, in one file.

Data contract (one transition per row; ``B`` rows, ``O`` = obs size):

    obs       float32 (B, O)   observation at t
    action    int64   (B,)     action taken at t
    reward    float32 (B,)     n-step discounted return  r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}
    next_obs  float32 (B, O)   observation at t+k (the bootstrap state)
    done      bool    (B,)     an episode *terminated* within those k steps (truncation is not terminal)
    discount  float32 (B,)     g^k, the bootstrap discount (k <= nstep is shorter at episode ends)

Learn step (van Hasselt et al., double DQN)::

    a*     = argmax_a Q_online(next_obs, a)
    target = reward + discount * (1 - done) * Q_target(next_obs, a*)
    loss   = Huber(Q_online(obs, action), target)

The target network is copied from the online one every ``target_update_freq`` train iterations.
The collector builds the n-step rows (:class:`NStepAdder`), as DI-engine's collect mode does.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from easydict import EasyDict

from common.policy.base import Policy
from common.policy.dqn_command import DQN_CONFIG, DQNCommandMode
from common.registry import POLICY_REGISTRY

TRANSITION_FIELDS = ("obs", "action", "reward", "next_obs", "done", "discount")


def transition_schema(obs_shape: int) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Per-row shape and dtype of each transition field (the layout in the module docstring)."""
    f32, obs = np.dtype(np.float32), (int(obs_shape),)
    return {"obs": (obs, f32), "action": ((), np.dtype(np.int64)), "reward": ((), f32),
            "next_obs": (obs, f32), "done": ((), np.dtype(np.bool_)), "discount": ((), f32)}


class QNetwork(nn.Module):
    """MLP Q-network: obs float32 (B, obs_shape) -> Q values float32 (B, action_shape); optional dueling head."""

    def __init__(self, obs_shape: int, action_shape: int, hidden_size_list: list[int], dueling: bool = True) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        last = obs_shape
        for h in hidden_size_list:
            layers += [nn.Linear(last, h), nn.ReLU()]
            last = h
        self.encoder = nn.Sequential(*layers)
        self.dueling = dueling
        if dueling:
            self.advantage = nn.Linear(last, action_shape)
            self.value = nn.Linear(last, 1)
        else:
            self.head = nn.Linear(last, action_shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.encoder(obs)
        if self.dueling:
            adv = self.advantage(x)
            return self.value(x) + adv - adv.mean(dim=-1, keepdim=True)
        return self.head(x)


def _adam(params: Any, lr: float) -> torch.optim.Optimizer:
    """Adam, fused where this torch build supports it (one kernel instead of a loop per tensor)."""
    params = list(params)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.Adam(params, lr=lr)


@POLICY_REGISTRY.register("dqn")
class DQNPolicy(Policy):
    """DQN policy (learn / collect / eval / command modes). See the module docstring for the math."""

    config: dict[str, Any] = DQN_CONFIG

    def __init__(self, cfg: EasyDict, enable_field: tuple[str, ...] = ("learn", "collect", "eval", "command"),
                 device: str | None = None) -> None:
        super().__init__(cfg, enable_field)
        self._gamma = float(cfg.discount_factor)
        self._nstep = int(cfg.nstep)
        if self._nstep < 1:
            raise ValueError(f"policy.nstep must be >= 1, got {self._nstep}")
        if device is None:
            device = "cuda" if cfg.cuda and torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        needs_net = any(f in self._enable_field for f in ("learn", "collect", "eval"))
        if needs_net:
            m = cfg.model
            self.model = QNetwork(m.obs_shape, m.action_shape, list(m.hidden_size_list), m.dueling).to(self.device)
        if "learn" in self._enable_field:
            self.target_model = QNetwork(m.obs_shape, m.action_shape, list(m.hidden_size_list), m.dueling).to(self.device)
            self.target_model.load_state_dict(self.model.state_dict())
            self.target_model.requires_grad_(False)
            self.optimizer = _adam(self.model.parameters(), cfg.learn.learning_rate)
            self._iter = 0

    # ------------------------------------------------------------------ learn mode
    def get_attribute(self, name: str) -> Any:
        """``batch_size`` / ``device`` / ``nstep``, as the seed's ``policy.get_attribute``."""
        return {"batch_size": self._cfg.learn.batch_size, "device": self.device, "nstep": self._nstep}[name]

    def monitor_vars(self) -> list[str]:
        return ["cur_lr", "total_loss", "q_value", "target_q_value", "priority_mean"]

    def forward(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """One train iteration on ``batch`` (see module docstring for field shapes).

        Returns:
            log vars: ``total_loss``, ``q_value``, ``target_q_value``, ``cur_lr`` (floats) and
            ``priority`` (float32 (B,), |TD error|, for prioritised replay).
        """
        dev = self.device
        obs = torch.as_tensor(batch["obs"], dtype=torch.float32, device=dev)
        action = torch.as_tensor(batch["action"], dtype=torch.int64, device=dev)
        reward = torch.as_tensor(batch["reward"], dtype=torch.float32, device=dev)
        next_obs = torch.as_tensor(batch["next_obs"], dtype=torch.float32, device=dev)
        not_done = 1.0 - torch.as_tensor(batch["done"], dtype=torch.float32, device=dev)
        discount = torch.as_tensor(batch["discount"], dtype=torch.float32, device=dev)

        # One online forward over obs and next_obs together (half the op dispatches on small nets).
        q_all = self.model(torch.cat([obs, next_obs]))
        q = q_all[: len(obs)].gather(1, action.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            best_next = q_all[len(obs):].detach().argmax(dim=1, keepdim=True)
            next_q = self.target_model(next_obs).gather(1, best_next).squeeze(1)
            target = reward + discount * not_done * next_q
        loss = F.smooth_l1_loss(q, target, beta=self._cfg.learn.huber_delta)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self._cfg.learn.grad_clip_norm > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), self._cfg.learn.grad_clip_norm)
        self.optimizer.step()

        self._iter += 1
        if self._iter % self._cfg.learn.target_update_freq == 0:
            self.target_model.load_state_dict(self.model.state_dict())
        td = (q - target).detach().abs()
        return {
            "cur_lr": self.optimizer.param_groups[0]["lr"],
            "total_loss": loss.item(),
            "q_value": q.detach().mean().item(),
            "target_q_value": target.mean().item(),
            "priority_mean": td.mean().item(),
            "priority": td.cpu().numpy(),
        }

    def state_dict(self) -> dict[str, Any]:
        """Learn-mode state for checkpoints: model, target model, optimizer, iteration count."""
        return {
            "model": self.model.state_dict(),
            "target_model": self.target_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "policy_iter": self._iter,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (from ``torch.load(..., weights_only=True)``)."""
        self.model.load_state_dict(state["model"])
        self.target_model.load_state_dict(state["target_model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._iter = int(state["policy_iter"])

    def publishable_state(self) -> dict[str, np.ndarray]:
        return {k: v.detach().to("cpu", torch.float32).numpy() for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------------ collect / eval modes
    def load_weights(self, weights: dict[str, np.ndarray]) -> None:
        """Load collector weights (float32 arrays keyed like ``QNetwork.state_dict()``).

        Raises:
            ValueError: names a missing, unexpected or wrongly shaped tensor.
        """
        own = self.model.state_dict()
        missing = set(own) - set(weights)
        extra = set(weights) - set(own)
        if missing or extra:
            raise ValueError(f"policy weights do not match the model: missing {sorted(missing)}, unexpected {sorted(extra)}")
        for k, v in weights.items():
            if tuple(v.shape) != tuple(own[k].shape):
                raise ValueError(f"policy weight {k!r} has shape {tuple(v.shape)}, model expects {tuple(own[k].shape)}")
        self.model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in weights.items()})

    @torch.no_grad()
    def greedy(self, obs: np.ndarray) -> np.ndarray:
        """Eval mode: argmax actions, int64 (B,), for obs float32 (B, obs_shape)."""
        q = self.model(torch.as_tensor(obs, dtype=torch.float32, device=self.device))
        return q.argmax(dim=1).cpu().numpy()

    def act(self, obs: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
        """Collect mode: epsilon-greedy actions, int64 (B,), one batched forward for all envs."""
        actions = self.greedy(obs)
        explore = rng.random(len(actions)) < eps
        if explore.any():
            actions[explore] = rng.integers(0, self._cfg.model.action_shape, size=int(explore.sum()))
        return actions

    def make_adder(self, env_num: int) -> "NStepAdder":
        """Collect mode: an n-step transition builder for ``env_num`` parallel envs."""
        return NStepAdder(env_num, self._nstep, self._gamma)

    # ------------------------------------------------------------------ command mode
    def get_setting_collect(self, info: dict[str, Any]) -> dict[str, Any]:
        """Epsilon from the total env steps (see :class:`~common.policy.dqn_command.DQNCommandMode`)."""
        return DQNCommandMode(self._cfg).get_setting_collect(info)


class NStepAdder:
    """Turns per-env step streams into n-step transitions (see module docstring for the rows).

    ``add`` takes one vector-env step (arrays with a leading env axis) and returns the rows that
    became complete: the oldest pending step once ``nstep`` steps are pending, or every pending
    step when the episode ends. ``terminated`` marks ``done``; ``truncated`` only flushes.
    """

    def __init__(self, env_num: int, nstep: int, gamma: float) -> None:
        self.nstep = nstep
        self.gamma = gamma
        self._pending: list[deque] = [deque() for _ in range(env_num)]

    def add(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray) -> list[tuple]:
        out: list[tuple] = []
        for i, pending in enumerate(self._pending):
            pending.append((obs[i], int(action[i]), float(reward[i])))
            if terminated[i] or truncated[i]:
                while pending:
                    out.append(self._emit(pending, next_obs[i], bool(terminated[i])))
                    pending.popleft()
            elif len(pending) == self.nstep:
                out.append(self._emit(pending, next_obs[i], False))
                pending.popleft()
        return out

    def flush(self, bootstrap_obs: np.ndarray) -> list[tuple]:
        """Emit every pending step, bootstrapping from ``bootstrap_obs`` (B, O): the rollout stopped
        mid-episode, which is a truncation, not a terminal state."""
        out: list[tuple] = []
        for i, pending in enumerate(self._pending):
            while pending:
                out.append(self._emit(pending, bootstrap_obs[i], False))
                pending.popleft()
        return out

    def _emit(self, pending: deque, bootstrap_obs: np.ndarray, done: bool) -> tuple:
        ret = 0.0
        for k, (_, _, r) in enumerate(pending):
            ret += (self.gamma ** k) * r
        o, a, _ = pending[0]
        return (o, a, ret, bootstrap_obs, done, self.gamma ** len(pending))
