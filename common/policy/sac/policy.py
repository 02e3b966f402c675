"""Soft Actor-Critic (Haarnoja et al. 2018, with automatic entropy tuning), in one file.

Rows are the n-step rows of common/policy/nstep.py with ``action`` float32 (B, A) in the
actor's squashed range [-1, 1]; the env receives ``low + (a + 1) / 2 * (high - low)``.

Actor: a Gaussian over pre-squash actions u ~ N(mu(s), sigma(s)), a = tanh(u), with the
change-of-variables correction

    log pi(a|s) = log N(u; mu, sigma) - sum_j log(1 - tanh(u_j)^2)

Learn step, twin critics Q1, Q2 with Polyak-averaged targets Q1', Q2'::

    a', logp' ~ pi(.|next_obs)
    y        = reward + discount * (1 - done) * (min(Q1', Q2')(next_obs, a') - alpha * logp')
    L_Q      = mean((Q1(obs, action) - y)^2) + mean((Q2(obs, action) - y)^2)      (IS-weighted with PER)
    a~, logp ~ pi(.|obs)   (reparameterised)
    L_pi     = mean(alpha * logp - min(Q1, Q2)(obs, a~))
    L_alpha  = -mean(log_alpha * (logp + target_entropy)),  target_entropy = -|A|
    Q' <- tau * Q + (1 - tau) * Q'

Image observations (uint8, see common/spaces.py) go through a conv torso (``policy.model.conv``,
the Nature DQN's by default) in the actor and in each critic, each with its own torso (as
Haarnoja et al.'s networks have no shared parts); pixels are scaled on the device.
"""

from __future__ import annotations

import math
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

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


class Actor(nn.Module):
    """Observations (:func:`nets.obs_tensor` output) -> (mu, log_std) of the pre-squash Gaussian,
    each float32 (B, A). ``model_cfg.conv`` is read for image observations only."""

    def __init__(self, spec: SpaceSpec, hidden: list[int], model_cfg: Any = None) -> None:
        super().__init__()
        self.body, last = nets.encoder(spec, model_cfg, hidden)
        self.mu = nn.Linear(last, spec.action_dim)
        self.log_std = nn.Linear(last, spec.action_dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.mu(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised squashed sample a float32 (B, A) in (-1, 1) and log pi(a|s) float32 (B,)."""
        mu, log_std = self(x)
        std = log_std.exp()
        u = mu + std * torch.randn_like(mu)
        a = torch.tanh(u)
        gauss = (-0.5 * ((u - mu) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log(1 - tanh(u)^2) written stably: 2 * (log 2 - u - softplus(-2u)).
        correction = (2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)
        return a, gauss - correction


class Critic(nn.Module):
    """(observations, actions in [-1, 1]) -> Q float32 (B,); images are encoded by a conv torso
    first, and the action joins the flattened features."""

    def __init__(self, spec: SpaceSpec, hidden: list[int], model_cfg: Any = None) -> None:
        super().__init__()
        self.torso: Optional[nn.Module] = None
        features = spec.obs_dim
        if spec.obs_kind == "image":
            self.torso = nets.ConvTorso(spec.image_chw, [list(layer) for layer in model_cfg.conv])
            features = self.torso.out_dim
        self.net = nn.Sequential(nets.mlp([features + spec.action_dim, *hidden]),
                                 nn.Linear(hidden[-1] if hidden else features + spec.action_dim, 1))

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        if self.torso is not None:
            x = self.torso(x)
        return self.net(torch.cat([x, a], dim=-1)).squeeze(-1)


class ActingModel(nn.Module):
    """What collectors load: the actor only (the critics never leave the learner)."""

    def __init__(self, spec: SpaceSpec, hidden: list[int], model_cfg: Any = None) -> None:
        super().__init__()
        self.actor = Actor(spec, hidden, model_cfg)


class SACPolicy(Policy):
    """SAC (see the module docstring); acting network = the actor."""

    def __init__(self, cfg: EasyDict, spec: SpaceSpec, modes: tuple[str, ...] = ("learn", "collect", "eval"),
                 device: Optional[str] = None) -> None:
        super().__init__(cfg, spec, modes, device)
        if spec.action_kind != "box":
            raise SpaceError(f"env {spec.env_id!r} has a Discrete action space; SAC needs Box actions "
                             "(use create_config.policy.type='dqn' or 'ppo')")
        p = cfg.policy
        self._low = np.asarray(spec.action_low, np.float32)
        self._high = np.asarray(spec.action_high, np.float32)
        self.model = ActingModel(spec, list(p.model.actor_hidden_size_list), p.model).to(self.device)
        if "learn" in self.modes:
            lc, hidden = p.learn, list(p.model.critic_hidden_size_list)
            self.q1 = Critic(spec, hidden, p.model).to(self.device)
            self.q2 = Critic(spec, hidden, p.model).to(self.device)
            self.q1_target, self.q2_target = nets.frozen_copy(self.q1), nets.frozen_copy(self.q2)
            self.q_optimizer = nets.adam([*self.q1.parameters(), *self.q2.parameters()], lc.learning_rate_q)
            self.actor_optimizer = nets.adam(self.model.parameters(), lc.learning_rate_policy)
            self.log_alpha = torch.tensor(math.log(lc.init_temperature), device=self.device, requires_grad=True)
            self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lc.learning_rate_alpha)
            self.target_entropy = -float(spec.action_dim)

    def schema(self) -> Schema:
        s, f32 = self.spec, np.dtype(np.float32)
        obs = (s.obs_shape, s.obs_dtype)
        return {"obs": obs, "action": ((s.action_dim,), f32), "reward": ((), f32), "next_obs": obs,
                "done": ((), np.dtype(np.bool_)), "discount": ((), f32)}

    # ------------------------------------------------------------------ collect / eval
    def _to_env(self, a: np.ndarray) -> np.ndarray:
        return (self._low + (a + 1.0) * 0.5 * (self._high - self._low)).astype(np.float32)

    @torch.no_grad()
    def act(self, obs: np.ndarray, setting: dict[str, Any], rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """A sample of the current policy, or uniform random actions while ``setting["random"]``."""
        if setting.get("random"):
            a = rng.uniform(-1.0, 1.0, size=(len(obs), self.spec.action_dim)).astype(np.float32)
        else:
            a, _ = self.model.actor.sample(nets.obs_tensor(self.spec, obs, self.device))
            a = a.cpu().numpy().astype(np.float32)
        return self._to_env(a), {"action": a}

    @torch.no_grad()
    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The deterministic tanh(mean) action, as in the SAC paper's evaluation (``rng`` unused)."""
        mu, _ = self.model.actor(nets.obs_tensor(self.spec, obs, self.device))
        return self._to_env(torch.tanh(mu).cpu().numpy())

    def make_adder(self, env_num: int, setting: dict[str, Any]) -> NStepAdder:
        return NStepAdder(env_num, int(self.cfg.policy.nstep), float(self.cfg.policy.discount_factor))

    # ------------------------------------------------------------------ learn
    def learn(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        """One SAC step; with a ``weight`` field the critic loss is importance-weighted per row and
        ``priority`` (float32 (B,), mean |TD error| of the twin critics) is returned."""
        dev, lc = self.device, self.cfg.policy.learn
        obs = nets.obs_tensor(self.spec, batch["obs"], dev)
        next_obs = nets.obs_tensor(self.spec, batch["next_obs"], dev)
        action = nets.to_device(batch["action"], dev, torch.float32)
        reward = nets.to_device(batch["reward"], dev, torch.float32)
        not_done = 1.0 - nets.to_device(batch["done"], dev, torch.float32)
        discount = nets.to_device(batch["discount"], dev, torch.float32)
        alpha = self.log_alpha.exp().detach()

        with torch.no_grad():
            next_a, next_logp = self.model.actor.sample(next_obs)
            next_q = torch.min(self.q1_target(next_obs, next_a), self.q2_target(next_obs, next_a))
            y = reward + discount * not_done * (next_q - alpha * next_logp)
        q1, q2 = self.q1(obs, action), self.q2(obs, action)
        td = (q1 - y) ** 2 + (q2 - y) ** 2
        w = nets.to_device(batch["weight"], dev, torch.float32) if "weight" in batch else None
        q_loss = (w * td).mean() if w is not None else td.mean()
        self.q_optimizer.zero_grad(set_to_none=True)
        q_loss.backward()
        if lc.grad_clip_norm > 0:
            nn.utils.clip_grad_norm_([*self.q1.parameters(), *self.q2.parameters()], lc.grad_clip_norm)
        self.q_optimizer.step()

        a, logp = self.model.actor.sample(obs)
        q_pi = torch.min(self.q1(obs, a), self.q2(obs, a))
        actor_loss = (alpha * logp - q_pi).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()

        alpha_loss = torch.zeros(())
        if lc.auto_alpha:
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad(set_to_none=True)
            alpha_loss.backward()
            self.alpha_optimizer.step()

        with torch.no_grad():
            tau = float(lc.target_theta)
            for net, target in ((self.q1, self.q1_target), (self.q2, self.q2_target)):
                for p, tp in zip(net.parameters(), target.parameters()):
                    tp.mul_(1.0 - tau).add_(p, alpha=tau)
        out: dict[str, Any] = {"q_loss": q_loss.item(), "actor_loss": actor_loss.item(), "alpha_loss": alpha_loss.item(),
                               "alpha": alpha.item(), "q_value": q1.detach().mean().item(), "entropy": -logp.detach().mean().item(),
                               "total_loss": q_loss.item() + actor_loss.item()}
        if w is not None:
            out["priority"] = (0.5 * ((q1 - y).abs() + (q2 - y).abs())).detach().cpu().numpy()
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "q1": self.q1.state_dict(), "q2": self.q2.state_dict(),
                "q1_target": self.q1_target.state_dict(), "q2_target": self.q2_target.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(), "q_optimizer": self.q_optimizer.state_dict(),
                "actor_optimizer": self.actor_optimizer.state_dict(), "alpha_optimizer": self.alpha_optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("model", "q1", "q2", "q1_target", "q2_target"):
            getattr(self, name).load_state_dict(state[name])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        for name in ("q_optimizer", "actor_optimizer", "alpha_optimizer"):
            getattr(self, name).load_state_dict(state[name])

    def get_weights(self) -> dict[str, np.ndarray]:
        return nets.get_weights(self.model)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        nets.set_weights(self.model, weights)
