"""IMPALA: an actor-critic learning off-policy from its actors' trajectories with V-trace targets.

Espeholt, Soyer, Munos, et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
Weighted Actor-Learner Architectures" (ICML; arXiv:1802.01561), section 4.

Chunk rows: one row is one env's trajectory of ``T`` = ``unroll_length`` steps (``*O`` the stored
observation shape, ``A`` the Box action size)::

    obs          (T+1, *O)   obs[t] acted on at step t; obs[L] the true next observation after the
                             last valid step L-1 (the bootstrap state; copies of it pad the rest)
    action       int64 (T,) | float32 (T, A)   as PPO's (the unclipped Gaussian sample for a Box)
    logp         float32 (T,)   log mu(a_t | x_t) under the behaviour policy that acted
    reward       float32 (T,)
    terminated   bool (T,)      the episode ended in a terminal state at t (no bootstrap)
    truncated    bool (T,)      it was cut at t (time limit): bootstrap from V(final obs)
    trunc_value  float32 (T,)   the behaviour's V(final obs) where truncated, else 0
    mask         bool (T,)      step t is real (False: padding of a trajectory cut short at a task's end)

At a truncation inside a trajectory obs[t+1] is the next episode's first observation, so the
bootstrap value is the behaviour's (the final observation is not stored); a truncation is at most
once per episode, so the learner's own V bootstraps every other step.

V-trace (the paper's eq. 1 as its recursion, with rho_t = min(rho_bar, pi/mu), c_t = lambda *
min(c_bar, pi/mu), both 0 on padding), per trajectory, V the learner's current values::

    next_v_t  = trunc_value_t           if truncated at t
              = V(obs[t+1])             otherwise (V(obs[T]) for the last step)
    g_t       = gamma * (1 - terminated_t)
    delta_t   = rho_t * (r_t + g_t * next_v_t - V(x_t))
    acc_t     = delta_t + gamma * (1 - done_t) * c_t * acc_{t+1},   acc_T = 0   (done = terminated | truncated)
    vs_t      = V(x_t) + acc_t                                       the value target
    q_t       = r_t + g_t * (trunc_value_t if truncated else vs_{t+1})   (vs_T = V(obs[T]))
    adv_t     = min(pg_rho_bar, pi/mu) * (q_t - V(x_t))

The trace is cut at every episode end (the next step is another episode). On-policy (pi = mu,
rho_bar, c_bar >= 1) vs_t is the lambda-return; with lambda = 1 the n-step return to the end of
the trajectory or episode. Loss, averaged over the real steps::

    L = -adv * log pi(a_t | x_t) + value_weight * 0.5 * (vs_t - V(x_t))^2 - entropy_weight * H(pi(. | x_t))

APPO (``policy.learn.appo_clip`` = eps > 0; the asynchronous PPO of Sample Factory, Petrenko et al.
2020, and RLlib): the policy term is PPO's clipped surrogate of the ratio r_t = pi/mu to the
behaviour policy, on the V-trace advantage without its importance weight (the ratio carries it)::

    A_t   = q_t - V(x_t)
    L_pg  = -min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps) * A_t)

so a step whose policy already moved past the clip in the advantage's direction adds no gradient.
On-policy (r = 1) both losses have the same gradient.

The network, acting and evaluation are PPO's (common/policy/ppo/policy.py): same actor-critic,
same categorical / normalised-Gaussian heads; only the targets and the data differ.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch
import torch.nn as nn
from easydict import EasyDict

from common.policy import nets
from common.policy.base import Schema
from common.policy.ppo.policy import PPOPolicy
from common.spaces import SpaceSpec


def vtrace(values: torch.Tensor, log_rho: torch.Tensor, reward: torch.Tensor, terminated: torch.Tensor,
           truncated: torch.Tensor, trunc_value: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float,
           rho_bar: float, c_bar: float, pg_rho_bar: float, weighted: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace value targets and policy-gradient advantages (module docstring), no gradient.

    Args:
        values: float32 (N, T+1), V of obs[0..T] under the learner's current weights.
        log_rho: float32 (N, T), log pi(a_t | x_t) - log mu(a_t | x_t).
        reward, trunc_value: float32 (N, T).
        terminated, truncated, mask: bool (N, T).
        gamma, lam: discount and trace lambda in [0, 1]; rho_bar, c_bar, pg_rho_bar: clips > 0.
        weighted: False leaves out the advantage's importance weight min(pg_rho_bar, pi/mu)
            (APPO's ``q - V``: its surrogate's ratio weighs it).

    Returns:
        ``(vs, adv)``, float32 (N, T) each; 0 advantage on padding.
    """
    with torch.no_grad():
        valid = mask.to(values.dtype)
        ratio = log_rho.exp()
        rho = ratio.clamp(max=rho_bar) * valid
        c = lam * ratio.clamp(max=c_bar) * valid
        keep = (~(terminated | truncated)).to(values.dtype)  # 0 where the next step is another episode
        g = gamma * (~terminated).to(values.dtype)
        v, v_next = values[:, :-1], values[:, 1:]
        next_v = torch.where(truncated, trunc_value, v_next)
        delta = rho * (reward + g * next_v - v)
        acc = torch.zeros_like(values[:, 0])
        vs_minus_v = torch.empty_like(v)
        for t in range(v.shape[1] - 1, -1, -1):
            acc = delta[:, t] + gamma * keep[:, t] * c[:, t] * acc
            vs_minus_v[:, t] = acc
        vs = v + vs_minus_v
        vs_next = torch.cat([vs[:, 1:], values[:, -1:]], dim=1)
        q = reward + g * torch.where(truncated, trunc_value, vs_next)
        adv = (ratio.clamp(max=pg_rho_bar) if weighted else 1.0) * (q - v) * valid
    return vs, adv


def policy_term(logp: torch.Tensor, behaviour_logp: torch.Tensor, adv: torch.Tensor, appo_clip: float) -> torch.Tensor:
    """The policy loss per step (module docstring), float32 (N, T): IMPALA's ``-adv * log pi`` when
    ``appo_clip`` is 0, else APPO's clipped surrogate of ``pi/mu`` with clip ``appo_clip``. ``logp``
    carries the gradient; ``behaviour_logp`` and ``adv`` (from :func:`vtrace`) do not."""
    if appo_clip <= 0:
        return -adv * logp
    ratio = (logp - behaviour_logp).exp()
    return -torch.min(ratio * adv, ratio.clamp(1.0 - appo_clip, 1.0 + appo_clip) * adv)


class ImpalaPolicy(PPOPolicy):
    """IMPALA, or APPO with ``policy.learn.appo_clip`` > 0 (module docstring); acting, evaluation,
    weights and checkpoints as :class:`PPOPolicy`."""

    def __init__(self, cfg: EasyDict, spec: SpaceSpec, modes: tuple[str, ...] = ("learn", "collect", "eval"),
                 device: Optional[str] = None) -> None:
        super().__init__(cfg, spec, modes, device)
        self.unroll = int(cfg.policy.collect.unroll_length)

    def schema(self) -> Schema:
        s, T, f32, b = self.spec, self.unroll, np.dtype(np.float32), np.dtype(bool)
        action = ((T, s.action_dim), f32) if self.continuous else ((T,), np.dtype(np.int64))
        return {"obs": ((T + 1, *s.obs_shape), s.obs_dtype), "action": action, "logp": ((T,), f32),
                "reward": ((T,), f32), "terminated": ((T,), b), "truncated": ((T,), b), "trunc_value": ((T,), f32),
                "mask": ((T,), b)}

    def make_adder(self, env_num: int, setting: dict[str, Any]) -> "TrajectoryAdder":
        return TrajectoryAdder(self, env_num, self.unroll)

    def learn(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        lc, cc, dev = self.cfg.policy.learn, self.cfg.policy.collect, self.device
        obs = batch["obs"]
        n, t1 = obs.shape[:2]
        t = t1 - 1
        x = self._x(obs.reshape(n * t1, *obs.shape[2:]))
        h = self.model.encoder(x)
        values = self.model.critic(h).squeeze(-1).reshape(n, t1)
        head = self.model.actor(h.reshape(n, t1, -1)[:, :t].reshape(n * t, -1))
        if self.continuous:
            dist: torch.distributions.Distribution = torch.distributions.Normal(head, self.model.log_std.exp().expand_as(head))
        else:
            dist = torch.distributions.Categorical(logits=head)
        action = nets.to_device(batch["action"], dev)
        action = action.reshape(n * t, -1) if self.continuous else action.reshape(n * t)
        logp = dist.log_prob(action)
        logp = (logp.sum(-1) if self.continuous else logp).reshape(n, t)
        entropy = dist.entropy()
        entropy = (entropy.sum(-1) if self.continuous else entropy).reshape(n, t)
        f32 = {k: nets.to_device(batch[k], dev, torch.float32) for k in ("logp", "reward", "trunc_value")}
        flags = {k: nets.to_device(batch[k], dev, torch.bool) for k in ("terminated", "truncated", "mask")}
        appo_clip = float(lc.appo_clip)
        vs, adv = vtrace(values.detach(), logp.detach() - f32["logp"], f32["reward"], flags["terminated"],
                         flags["truncated"], f32["trunc_value"], flags["mask"], float(cc.discount_factor),
                         float(cc.vtrace_lambda), float(lc.rho_bar), float(lc.c_bar), float(lc.pg_rho_bar),
                         weighted=appo_clip <= 0)
        valid = flags["mask"].to(torch.float32)
        steps = valid.sum().clamp(min=1.0)
        policy_loss = (policy_term(logp, f32["logp"], adv, appo_clip) * valid).sum() / steps
        value_loss = 0.5 * (((vs - values[:, :t]) ** 2) * valid).sum() / steps
        mean_entropy = (entropy * valid).sum() / steps
        loss = policy_loss + lc.value_weight * value_loss - lc.entropy_weight * mean_entropy
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), lc.grad_clip_norm if lc.grad_clip_norm > 0 else math.inf)
        self.optimizer.step()
        with torch.no_grad():
            ratio = (logp.detach() - f32["logp"]).exp()
            clipped = ((ratio > lc.rho_bar).to(torch.float32) * valid).sum() / steps
            rho_mean = (ratio * valid).sum() / steps
        return {"policy_loss": policy_loss.item(), "value_loss": value_loss.item(), "entropy": mean_entropy.item(),
                "total_loss": loss.item(), "rho_mean": rho_mean.item(), "rho_clip_frac": clipped.item(),
                "grad_norm": float(grad_norm), "cur_lr": self.optimizer.param_groups[0]["lr"], "rows": float(n),
                "steps": steps.item()}


class TrajectoryAdder:
    """Collects ``T`` steps per env, then emits one trajectory row per env (module docstring);
    :meth:`flush` emits the steps so far padded to ``T`` (``mask`` False on the padding)."""

    def __init__(self, policy: ImpalaPolicy, env_num: int, unroll: int) -> None:
        self._policy, self._env_num, self._unroll = policy, env_num, unroll
        self._reset()

    def _reset(self) -> None:
        self._steps: list[dict[str, np.ndarray]] = []
        self._final: list[tuple[int, int, np.ndarray]] = []  # (t, env, final obs) of truncated episodes

    def add(self, obs: np.ndarray, record: dict[str, np.ndarray], reward: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
        t = len(self._steps)
        self._steps.append({"obs": obs.copy(), "action": record["action"], "logp": record["logp"],
                            "reward": np.asarray(reward, np.float32), "terminated": terminated,
                            "truncated": truncated & ~terminated})
        for i in np.flatnonzero(truncated & ~terminated):
            self._final.append((t, int(i), next_obs[i].copy()))
        return self._finish(next_obs) if len(self._steps) == self._unroll else None

    def flush(self, obs: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        """The task stopped at ``obs`` (the next observation of the last step): it bootstraps there."""
        return self._finish(obs) if self._steps else None

    def _finish(self, last_next_obs: np.ndarray) -> dict[str, np.ndarray]:
        steps, T, L = self._steps, self._unroll, len(self._steps)
        pad = T - L

        def stack(key: str, fill: Any) -> np.ndarray:  # (L, E, ...) -> (E, T, ...), padded with ``fill``
            a = np.stack([s[key] for s in steps], axis=1)
            if pad:
                a = np.concatenate([a, np.full((a.shape[0], pad, *a.shape[2:]), fill, a.dtype)], axis=1)
            return a

        obs = np.stack([s["obs"] for s in steps] + [last_next_obs] * (pad + 1), axis=1)
        trunc_value = np.zeros((self._env_num, T), np.float32)
        if self._final:  # one forward for every truncated episode's final observation
            boot = self._policy.values(np.stack([o for _, _, o in self._final]))
            for k, (t, i, _) in enumerate(self._final):
                trunc_value[i, t] = boot[k]
        mask = np.zeros((self._env_num, T), bool)
        mask[:, :L] = True
        rows = {"obs": obs, "action": stack("action", 0), "logp": stack("logp", 0.0), "reward": stack("reward", 0.0),
                "terminated": stack("terminated", False), "truncated": stack("truncated", False),
                "trunc_value": trunc_value, "mask": mask}
        self._reset()
        return rows
