"""Double DQN with a target network and n-step returns, in one file.

Chunk rows (``B`` rows, ``*O`` the stored observation shape, see common/spaces.py)::

    obs       float32 (B, *O) | uint8 (B, *O) image | int64 (B,)   observation at t
    action    int64   (B,)     action index at t (the env got index + the space's start)
    reward    float32 (B,)     n-step discounted return  r_t + g r_{t+1} + ... + g^{k-1} r_{t+k-1}
    next_obs  like obs         observation at t+k (the bootstrap state)
    done      bool    (B,)     an episode *terminated* within those k steps (truncation is not terminal)
    discount  float32 (B,)     g^k, the bootstrap discount (k <= nstep is shorter at episode ends)

Learn step (van Hasselt et al. 2016, double DQN; ``policy.learn.double``, True by default)::

    a*     = argmax_a Q_online(next_obs, a)
    target = reward + discount * (1 - done) * Q_target(next_obs, a*)
    loss   = Huber(Q_online(obs, action), target)

With ``double=False`` the target takes the target network's own max, as Nature DQN (Mnih et al.
2015) and SB3's DQN do: ``target = reward + discount * (1 - done) * max_a Q_target(next_obs, a)``.

The target network is copied from the online one every ``target_update_freq`` train iterations.
With prioritized replay the batch carries importance-sampling weights (field ``weight``) that
scale each row's loss, and ``learn`` returns the rows' |TD error| as new priorities.
Acting is epsilon-greedy with ``eps`` from the task's collect setting (common/policy/dqn/__init__.py);
evals too, with the fixed ``policy.eval.eps`` (0.05 as Nature DQN; 0 = greedy).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from easydict import EasyDict

from common.policy import nets
from common.policy.base import Policy, Schema
from common.policy.nstep import NStepAdder
from common.spaces import SpaceError, SpaceSpec


class QNetwork(nn.Module):
    """Q-network: observations -> Q values float32 (B, n_actions); an MLP (after the conv torso for
    images, see ``nets.encoder``), optional dueling head."""

    def __init__(self, spec: SpaceSpec, hidden_size_list: list[int], dueling: bool = True,
                 model_cfg: Any = None) -> None:
        super().__init__()
        self.spec = spec
        self.encoder, last = nets.encoder(spec, model_cfg, list(hidden_size_list))
        self.dueling = dueling
        if dueling:
            self.advantage = nn.Linear(last, spec.action_n)
            self.value = nn.Linear(last, 1)
        else:
            self.head = nn.Linear(last, spec.action_n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: observations as ``nets.obs_tensor`` makes them."""
        h = self.encoder(x)
        if self.dueling:
            adv = self.advantage(h)
            return self.value(h) + adv - adv.mean(dim=-1, keepdim=True)
        return self.head(h)


class DQNPolicy(Policy):
    """Double DQN (see the module docstring); acting network = the online Q-network."""

    def __init__(self, cfg: EasyDict, spec: SpaceSpec, modes: tuple[str, ...] = ("learn", "collect", "eval"),
                 device: Optional[str] = None) -> None:
        super().__init__(cfg, spec, modes, device)
        if spec.action_kind != "discrete":
            raise SpaceError(f"env {spec.env_id!r} has a Box action space; DQN needs Discrete actions "
                             "(use create_config.policy.type='ppo' for continuous control)")
        p = cfg.policy
        self._gamma = float(p.discount_factor)
        self._nstep = int(p.nstep)
        if self._nstep < 1:
            raise ValueError(f"config key 'policy.nstep' must be >= 1, got {self._nstep}")
        self._eval_eps = p.eval.eps
        if isinstance(self._eval_eps, bool) or not isinstance(self._eval_eps, (int, float)) \
                or not 0.0 <= self._eval_eps <= 1.0:
            raise ValueError(f"config key 'policy.eval.eps' must be in [0, 1], got {self._eval_eps!r}")
        self.model = QNetwork(spec, list(p.model.hidden_size_list), p.model.dueling, p.model).to(self.device)
        if "learn" in self.modes:
            self.target_model = nets.frozen_copy(self.model)
            self.optimizer = nets.adam(self.model.parameters(), p.learn.learning_rate)
            if not isinstance(p.learn.double, bool):
                raise ValueError(f"config key 'policy.learn.double' must be True or False, got {p.learn.double!r}")
            self._double = p.learn.double
            self._updates = 0

    def schema(self) -> Schema:
        s, f32 = self.spec, np.dtype(np.float32)
        obs = (s.obs_shape, s.obs_dtype)
        return {"obs": obs, "action": ((), np.dtype(np.int64)), "reward": ((), f32), "next_obs": obs,
                "done": ((), np.dtype(np.bool_)), "discount": ((), f32)}

    # ------------------------------------------------------------------ learn
    def learn(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """One DQN step (double DQN's target unless ``policy.learn.double`` is False); with a ``weight`` field (prioritized replay) the Huber loss is
        importance-weighted per row and ``priority`` (float32 (B,), |TD error|) is returned too."""
        dev, lc = self.device, self.cfg.policy.learn
        obs = nets.obs_tensor(self.spec, batch["obs"], dev)
        next_obs = nets.obs_tensor(self.spec, batch["next_obs"], dev)
        action = nets.to_device(batch["action"], dev, torch.int64)
        reward = nets.to_device(batch["reward"], dev, torch.float32)
        not_done = 1.0 - nets.to_device(batch["done"], dev, torch.float32)
        discount = nets.to_device(batch["discount"], dev, torch.float32)

        if self._double:
            # One online forward over obs and next_obs together (half the op dispatches on small nets).
            q_all = self.model(torch.cat([obs, next_obs]))
            q = q_all[: len(obs)].gather(1, action.unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                best_next = q_all[len(obs):].argmax(dim=1, keepdim=True)
                next_q = self.target_model(next_obs).gather(1, best_next).squeeze(1)
        else:
            q = self.model(obs).gather(1, action.unsqueeze(1)).squeeze(1)
            with torch.no_grad():
                next_q = self.target_model(next_obs).max(dim=1).values
        target = reward + discount * not_done * next_q
        if "weight" in batch:  # prioritized replay: importance-sampling weights per row
            w = nets.to_device(batch["weight"], dev, torch.float32)
            loss = (w * F.smooth_l1_loss(q, target, beta=lc.huber_delta, reduction="none")).mean()
        else:
            loss = F.smooth_l1_loss(q, target, beta=lc.huber_delta)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if lc.grad_clip_norm > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), lc.grad_clip_norm)
        self.optimizer.step()

        self._updates += 1
        if self._updates % lc.target_update_freq == 0:
            self.target_model.load_state_dict(self.model.state_dict())
        out: dict[str, Any] = {"cur_lr": self.optimizer.param_groups[0]["lr"], "total_loss": loss.item(),
                               "q_value": q.detach().mean().item(), "target_q_value": target.mean().item()}
        if "weight" in batch:
            out["priority"] = (q.detach() - target).abs().cpu().numpy()  # |TD error| (B,), new priorities
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "target_model": self.target_model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "updates": self._updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.target_model.load_state_dict(state["target_model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._updates = int(state["updates"])

    def get_weights(self) -> dict[str, np.ndarray]:
        return nets.get_weights(self.model)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        nets.set_weights(self.model, weights)

    # ------------------------------------------------------------------ collect / eval
    @torch.no_grad()
    def _greedy(self, obs: np.ndarray) -> np.ndarray:
        q = self.model(nets.obs_tensor(self.spec, obs, self.device))
        return q.argmax(dim=1).cpu().numpy()

    def _eps_greedy(self, obs: np.ndarray, eps: float, rng: np.random.Generator) -> np.ndarray:
        """Action indices int64 (E,): greedy, or uniform with probability ``eps`` per env."""
        idx = self._greedy(obs)
        explore = rng.random(len(idx)) < eps
        if explore.any():
            idx[explore] = rng.integers(0, self.spec.action_n, size=int(explore.sum()))
        return idx

    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Epsilon-greedy with ``policy.eval.eps`` (greedy at 0)."""
        return self._eps_greedy(obs, float(self._eval_eps), rng) + self.spec.action_start

    def act(self, obs: np.ndarray, setting: dict[str, Any], rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Epsilon-greedy over one batched forward; ``setting["eps"]`` is the exploration rate."""
        idx = self._eps_greedy(obs, float(setting["eps"]), rng)
        return idx + self.spec.action_start, {"action": idx}

    def make_adder(self, env_num: int, setting: dict[str, Any]) -> NStepAdder:
        return NStepAdder(env_num, self._nstep, self._gamma)
