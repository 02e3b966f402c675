"""PPO with the clipped surrogate objective and GAE(lambda), in one file (Schulman et al. 2017).

Chunk rows (``B`` rows, all produced by one policy version; ``*O`` the stored observation shape)::

    obs     float32 (B, *O) | uint8 (B, *O) image | int64 (B,)   observation at t
    action  int64 (B,) | float32 (B, A)    action index (Discrete) or the unclipped Gaussian sample in
                                           normalised units (Box; the env gets it mapped onto its bounds)
    logp    float32 (B,)     log pi_old(action | obs)
    value   float32 (B,)     V_old(obs)
    adv     float32 (B,)     GAE advantage
    ret     float32 (B,)     adv + value, the value target

The collector computes GAE with the same weights that acted (the rollout's version), per env
over a segment of ``T`` steps::

    next_v_t = 0                    if the episode terminated at t
             = V(final_obs_t)       if it was truncated at t (time limit: not a terminal state)
             = V(obs_{t+1})         otherwise (V of the segment's last next obs for t = T-1)
    delta_t  = r_t + gamma * next_v_t - V(obs_t)
    adv_t    = delta_t + gamma * lambda * (1 - done_t) * adv_{t+1}

Learn step, ``epoch_per_collect`` epochs of shuffled minibatches of ``batch_size`` rows::

    ratio   = exp(logp_new - logp)
    L_clip  = -mean(min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A))      A normalised per minibatch
    L_value = 0.5 * mean(max((V - ret)^2, (value + clip(V - value, -eps, eps) - ret)^2))
    loss    = L_clip + value_weight * L_value - entropy_weight * entropy

With ``lr_anneal_iters`` N > 0 the learning rate of train iteration ``i`` (from 0) is
``learning_rate * max(0, 1 - i / N)``, as CleanRL's ``anneal_lr``. The policy's state keeps
``i``; ``learning_rate`` and N are the config's, so a resumed run with a new budget follows it.

With ``mirror_board`` (``policy.model.board`` set, one Discrete action per board column, the
observation the board then one flag per column: common/spaces.py checks) each minibatch row is
replaced, with probability 1/2 drawn afresh every epoch, by its left-right mirror: the mirrored
board and flags (``nets.mirror_board``) and action ``W - 1 - action``, with the row's own
``logp``, ``value``, ``adv`` and ``ret``. That ``logp`` is exactly the probability with which the
mirror image of the behaviour policy plays the mirrored move, so the ratio stays an importance
weight; the advantages carry over where the opponent plays the same mirrored (the heuristic's
rules do, up to their lowest-column tie-break; a snapshot's network need not). ``approx_kl``,
``clip_frac`` and the clip of a mirrored row compare the new policy with the old one's mirror
image, so they also count the network's own left-right asymmetry. The batch learns both images
of every position at no extra compute, as AlphaZero trains on a board's symmetries (Silver et
al. 2018), by a random draw per row instead of a doubled batch.

Discrete actions use a categorical head; Box actions a Gaussian with a state-independent
log-std over a normalised action ``a`` whose range [-1, 1] is mapped onto the space's bounds
when sent to the env, as SAC does (and as Stable-Baselines3 recommends for PPO)::

    env action = low + (clip(a, -1, 1) + 1) / 2 * (high - low)

so a fresh policy acts around the middle of any Box, centred on 0 or not (a Gaussian around
0 clipped to [100, 110] would always send 100 and learn nothing). The stored action is the
unclipped ``a``, so its log-probability stays exact.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import torch
import torch.nn as nn
from easydict import EasyDict
from torch.distributions import Categorical, Normal

from common.policy import nets
from common.policy.base import Policy, Schema
from common.spaces import SpaceSpec


def _init(layer: nn.Module, gain: float) -> None:
    if isinstance(layer, (nn.Linear, nn.Conv2d)):
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)


class ActorCritic(nn.Module):
    """Shared encoder (an MLP; conv torso + MLP for images), an actor head (logits or Gaussian mean)
    and a critic head.

    With ``policy.model.action_mask`` (Discrete actions, flat observations) the last ``action_n``
    observation entries are legal-action flags (1 legal, 0 not; common/games.py) and illegal
    actions get a logit of -1e8: probability 0, never sampled, and no share of the entropy.
    """

    def __init__(self, spec: SpaceSpec, m: EasyDict) -> None:
        super().__init__()
        self.encoder, last = nets.encoder(spec, m, list(m.encoder_hidden_size_list))
        self.continuous = spec.action_kind == "box"
        out = spec.action_dim if self.continuous else spec.action_n
        self.actor = nn.Sequential(nets.mlp([last, m.actor_head_hidden_size]), nn.Linear(m.actor_head_hidden_size, out))
        self.critic = nn.Sequential(nets.mlp([last, m.critic_head_hidden_size]), nn.Linear(m.critic_head_hidden_size, 1))
        self.mask_n = 0 if self.continuous or not m.get("action_mask", False) else spec.action_n
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((out,), float(m.init_log_std)))
        # Orthogonal init with a small actor output: near-uniform first policy (as CleanRL / DI-engine's ppo_param_init).
        for mod in (self.encoder, self.actor, self.critic):
            mod.apply(lambda layer: _init(layer, math.sqrt(2)))
        _init(self.actor[-1], 0.01)
        _init(self.critic[-1], 1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.distributions.Distribution, torch.Tensor]:
        """``x`` (``nets.obs_tensor`` output) -> (action distribution, value float32 (B,))."""
        h = self.encoder(x)
        head = self.actor(h)
        if self.continuous:
            dist: torch.distributions.Distribution = Normal(head, self.log_std.exp().expand_as(head))
        else:
            if self.mask_n:
                head = head.masked_fill(x[:, -self.mask_n:] < 0.5, -1e8)
            dist = Categorical(logits=head)
        return dist, self.critic(h).squeeze(-1)

    def value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(self.encoder(x)).squeeze(-1)


def _logp(dist: torch.distributions.Distribution, action: torch.Tensor, continuous: bool) -> torch.Tensor:
    lp = dist.log_prob(action)
    return lp.sum(-1) if continuous else lp


class PPOPolicy(Policy):
    """PPO (see the module docstring); acting network = the actor-critic (the collector needs V for GAE)."""

    def __init__(self, cfg: EasyDict, spec: SpaceSpec, modes: tuple[str, ...] = ("learn", "collect", "eval"),
                 device: Optional[str] = None) -> None:
        super().__init__(cfg, spec, modes, device)
        self.model = ActorCritic(spec, cfg.policy.model).to(self.device)
        self.continuous = self.model.continuous
        if spec.action_kind == "box":
            self._low = np.asarray(spec.action_low, np.float32)
            self._high = np.asarray(spec.action_high, np.float32)
        if "learn" in self.modes:
            self.optimizer = nets.adam(self.model.parameters(), cfg.policy.learn.learning_rate)
            self.updates = 0  # learn() calls: train iterations, the schedule's position
            self._rng = torch.Generator().manual_seed(int(cfg.seed))

    def schema(self) -> Schema:
        s, f32 = self.spec, np.dtype(np.float32)
        action = ((s.action_dim,), f32) if self.continuous else ((), np.dtype(np.int64))
        return {"obs": (s.obs_shape, s.obs_dtype), "action": action, "logp": ((), f32), "value": ((), f32),
                "adv": ((), f32), "ret": ((), f32)}

    # ------------------------------------------------------------------ collect / eval
    def _x(self, obs: np.ndarray) -> torch.Tensor:
        return nets.obs_tensor(self.spec, obs, self.device)

    def _to_env(self, action: np.ndarray) -> np.ndarray:
        """Policy actions -> env actions: a Box action in [-1, 1] (clipped) mapped onto [low, high]
        (float32 (B, A)), a Discrete index shifted by the space's ``start``."""
        if self.continuous:
            unit = np.clip(action, -1.0, 1.0)
            return (self._low + (unit + 1.0) * 0.5 * (self._high - self._low)).astype(np.float32)
        return action + self.spec.action_start

    @torch.no_grad()
    def act(self, obs: np.ndarray, setting: dict[str, Any], rng: np.random.Generator) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Sample from the current policy (torch's RNG, seeded per task); record action, logp and value."""
        dist, value = self.model(self._x(obs))
        action = dist.sample()
        logp = _logp(dist, action, self.continuous)
        a = action.cpu().numpy()
        a = a.astype(np.float32) if self.continuous else a.astype(np.int64)
        return self._to_env(a), {"action": a, "logp": logp.cpu().numpy().astype(np.float32),
                                 "value": value.cpu().numpy().astype(np.float32)}

    @torch.no_grad()
    def act_eval(self, obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The most likely action / the mean; with ``policy.eval.sample`` a sample drawn with ``rng``."""
        dist, _ = self.model(self._x(obs))
        if not self.cfg.policy.eval.sample:
            a = dist.mean if self.continuous else dist.probs.argmax(dim=-1)
            return self._to_env(a.cpu().numpy())
        if self.continuous:
            mean, std = dist.mean.cpu().numpy(), dist.stddev.cpu().numpy()
            return self._to_env((mean + std * rng.standard_normal(mean.shape)).astype(np.float32))
        # Inverse-CDF sampling: the first action whose cumulative probability exceeds a uniform draw.
        cdf = dist.probs.cpu().numpy().astype(np.float64).cumsum(axis=1)
        u = rng.random((len(cdf), 1)) * cdf[:, -1:]
        idx = np.minimum((cdf <= u).sum(axis=1), cdf.shape[1] - 1).astype(np.int64)
        return self._to_env(idx)

    @torch.no_grad()
    def values(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) float32 (B,) for stored observations (B, *O)."""
        return self.model.value(self._x(obs)).cpu().numpy().astype(np.float32)

    def make_adder(self, env_num: int, setting: dict[str, Any]) -> "GAEAdder":
        c = self.cfg.policy.collect
        return GAEAdder(self, env_num, setting, int(c.n_sample), float(c.discount_factor), float(c.gae_lambda))

    # ------------------------------------------------------------------ learn
    def learn(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        lc, dev = self.cfg.policy.learn, self.device
        image = self.spec.obs_kind == "image"
        # Images stay uint8 on the device (a quarter of float32) and are scaled per minibatch.
        x = nets.to_device(batch["obs"], dev) if image else self._x(batch["obs"])
        action = nets.to_device(batch["action"], dev)
        old_logp = nets.to_device(batch["logp"], dev, torch.float32)
        old_v = nets.to_device(batch["value"], dev, torch.float32)
        adv_all = nets.to_device(batch["adv"], dev, torch.float32)
        ret = nets.to_device(batch["ret"], dev, torch.float32)
        n, eps = len(x), float(lc.clip_ratio)
        mirror = bool(lc.get("mirror_board"))
        if mirror:
            hwc = tuple(int(v) for v in self.cfg.policy.model.board)
            x_mirror, a_mirror = nets.mirror_board(x, hwc), (hwc[1] - 1) - action
        self._set_lr()
        stats: dict[str, list[float]] = {k: [] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "total_loss")}
        for _ in range(int(lc.epoch_per_collect)):
            perm = torch.randperm(n, generator=self._rng).to(dev)
            for start in range(0, n, int(lc.batch_size)):
                mb = perm[start:start + int(lc.batch_size)]
                xb, ab = x[mb], action[mb]
                if mirror:
                    flip = (torch.rand(len(mb), generator=self._rng) < 0.5).to(dev)
                    xb = torch.where(flip[:, None], x_mirror[mb], xb)
                    ab = torch.where(flip, a_mirror[mb], ab)
                dist, v = self.model(nets.obs_tensor(self.spec, xb, dev) if image else xb)
                logp = _logp(dist, ab, self.continuous)
                entropy = dist.entropy()
                entropy = (entropy.sum(-1) if self.continuous else entropy).mean()
                adv = adv_all[mb]
                if lc.adv_norm and len(mb) > 1:
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
                log_ratio = logp - old_logp[mb]
                ratio = log_ratio.exp()
                policy_loss = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv).mean()
                if lc.value_clip:
                    v_clip = old_v[mb] + (v - old_v[mb]).clamp(-eps, eps)
                    value_loss = 0.5 * torch.max((v - ret[mb]) ** 2, (v_clip - ret[mb]) ** 2).mean()
                else:
                    value_loss = 0.5 * ((v - ret[mb]) ** 2).mean()
                loss = policy_loss + lc.value_weight * value_loss - lc.entropy_weight * entropy
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if lc.grad_clip_norm > 0:
                    nn.utils.clip_grad_norm_(self.model.parameters(), lc.grad_clip_norm)
                self.optimizer.step()
                with torch.no_grad():
                    stats["approx_kl"].append(((ratio - 1) - log_ratio).mean().item())
                    stats["clip_frac"].append(((ratio - 1).abs() > eps).float().mean().item())
                stats["policy_loss"].append(policy_loss.item())
                stats["value_loss"].append(value_loss.item())
                stats["entropy"].append(entropy.item())
                stats["total_loss"].append(loss.item())
        out = {k: float(np.mean(v)) for k, v in stats.items()}
        out["cur_lr"] = self.optimizer.param_groups[0]["lr"]
        out["rows"] = float(n)
        self.updates += 1
        return out

    def _set_lr(self) -> None:
        """The learning rate of train iteration ``self.updates`` (module docstring)."""
        lc = self.cfg.policy.learn
        anneal = int(lc.get("lr_anneal_iters", 0))
        lr = float(lc.learning_rate) * (max(0.0, 1.0 - self.updates / anneal) if anneal > 0 else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])  # its saved learning rate gives way to _set_lr's
        self.updates = int(state.get("updates", 0))  # absent from states saved before the schedule

    def get_weights(self) -> dict[str, np.ndarray]:
        return nets.get_weights(self.model)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        nets.set_weights(self.model, weights)


class GAEAdder:
    """Collects ``T`` steps per env, then emits the segment's ``T * E`` rows with GAE (module docstring).

    ``T`` = ceil(``setting["rollout_rows"]`` / E) (``n_sample`` without one), read at the start
    of every segment from the collector's live setting dict, so a change of the collector count
    mid-task changes the next segment's length.
    """

    def __init__(self, policy: PPOPolicy, env_num: int, setting: dict[str, Any], n_sample: int, gamma: float,
                 lam: float) -> None:
        self._policy, self._env_num, self._setting, self._n_sample = policy, env_num, setting, n_sample
        self._gamma, self._lam = gamma, lam
        self._reset()

    def _reset(self) -> None:
        self._steps: list[dict[str, np.ndarray]] = []
        self._final: list[tuple[int, int, np.ndarray]] = []  # (t, env, final obs) of truncated episodes
        self._horizon = 0  # the segment under way's length, fixed at its first step

    @property
    def horizon(self) -> int:
        """Steps per env of the segment under way, or of the next one when none is."""
        if self._steps:
            return self._horizon
        return max(1, math.ceil(int(self._setting.get("rollout_rows", self._n_sample)) / self._env_num))

    def add(self, obs: np.ndarray, record: dict[str, np.ndarray], reward: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, truncated: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        t = len(self._steps)
        if t == 0:  # a new segment: its length from the setting as it is now
            self._horizon = self.horizon
        self._steps.append(dict(record, obs=obs.copy(), reward=np.asarray(reward, np.float32),
                                terminated=np.asarray(terminated, bool), truncated=np.asarray(truncated, bool)))
        for i in np.flatnonzero(truncated & ~terminated):
            self._final.append((t, int(i), next_obs[i].copy()))
        if len(self._steps) == self._horizon:
            return self._finish(next_obs)
        return None

    def flush(self, obs: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        return self._finish(obs) if self._steps else None

    def _finish(self, last_next_obs: np.ndarray) -> dict[str, np.ndarray]:
        steps, T = self._steps, len(self._steps)
        value = np.stack([s["value"] for s in steps])                      # (T, E)
        reward = np.stack([s["reward"] for s in steps])
        term = np.stack([s["terminated"] for s in steps])
        done = term | np.stack([s["truncated"] for s in steps])
        # One forward for the segment's bootstrap values and every truncated episode's final obs.
        extra = [o for _, _, o in self._final]
        boot = self._policy.values(np.concatenate([last_next_obs, np.stack(extra)]) if extra else last_next_obs)
        next_v = np.empty_like(value)
        next_v[:-1] = value[1:]
        next_v[-1] = boot[: self._env_num]
        next_v[done] = 0.0
        for k, (t, i, _) in enumerate(self._final):
            next_v[t, i] = boot[self._env_num + k]
        adv = np.zeros_like(value)
        running = np.zeros(self._env_num, np.float32)
        for t in range(T - 1, -1, -1):
            delta = reward[t] + self._gamma * next_v[t] - value[t]
            running = delta + self._gamma * self._lam * (~done[t]) * running
            adv[t] = running
        rows = {"obs": np.concatenate([s["obs"] for s in steps]),
                "action": np.concatenate([s["action"] for s in steps]),
                "logp": np.concatenate([s["logp"] for s in steps]),
                "value": value.reshape(-1), "adv": adv.reshape(-1).astype(np.float32),
                "ret": (adv + value).reshape(-1).astype(np.float32)}
        self._reset()
        return rows
