"""rqrl's DQN update against Stable-Baselines3's, measured: the same weights, the same batches.

    pip install -e ".[bench]"
    python -m tests.bench.bench_dqn_update [--envs LunarLander-v3 ...] [--updates 50] [--rows 5000]
                                           [--check 1e-6] [--json out.json]

Per env of tests/bench/bench_sb3.py's DQN rows: SB3's ``DQN`` built with rl-zoo's hyperparameters
for the env (bench_sb3.zoo_kwargs), and rqrl's policy from the env's config (bench_sb3.CONFIGS)
with SB3's plain-max target (``policy.learn.double=False``). rqrl's online and target networks
start from SB3's weights; both then take ``--updates`` gradient steps on the same batches (rl-zoo's
batch size, drawn from transitions of a random policy on the env), SB3 through its own
``DQN.train`` with its replay buffer's ``sample`` handing it each batch, and each copies its target
network after every ``--updates // 2`` updates (rqrl by its own counter, SB3 as its ``_on_step``
does). Printed per env: the largest |difference| of any online or target weight after each update
(float32: a few 1e-8 is rounding; a wrong loss, learning rate or optimizer shows from the first
update on, a wrong target once the networks have moved apart), of the losses, and the gradient
norms before clipping (clipping is compared only on updates whose norm is above SB3's 10:
``--reward-scale 100`` gets there). When SB3 copies its target (every ``target_update_interval``
env steps) is not compared: the configs' docstrings convert it into rqrl's train iterations.
``--check TOL`` exits 1 past TOL.

Then the rows the update learns from (:func:`compare_rows`): one random action sequence of
``--rows`` env steps through rqrl's collector path and through SB3's ``DummyVecEnv`` and
``ReplayBuffer``, compared field by field (episode ends and truncations counted: MountainCar's
and Acrobot's random episodes all end by truncation, which must not be terminal).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.utils import polyak_update
from stable_baselines3.common.vec_env import DummyVecEnv

from common import spaces
from common.config import apply_overrides, load_config
from common.policy import create_policy
from tests.bench.bench_sb3 import CONFIGS, REPO, algo_of, zoo_kwargs, zoo_table
from workers.envs import make_vector_env, true_next_obs


def transitions(env_id: str, n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` transitions of a uniformly random policy on ``env_id``: obs float32 (n, *O), action
    int64 (n,), reward float32 (n,), next_obs, done bool (n,) (terminated; a truncation is not)."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    rows: dict[str, list[Any]] = {k: [] for k in ("obs", "action", "reward", "next_obs", "done")}
    for _ in range(n):
        action = env.action_space.sample()
        nxt, reward, terminated, truncated, _ = env.step(action)
        for k, v in zip(rows, (obs, action, reward, nxt, terminated)):
            rows[k].append(v)
        obs = env.reset()[0] if terminated or truncated else nxt
    env.close()
    return {"obs": np.asarray(rows["obs"], np.float32), "action": np.asarray(rows["action"], np.int64),
            "reward": np.asarray(rows["reward"], np.float32), "next_obs": np.asarray(rows["next_obs"], np.float32),
            "done": np.asarray(rows["done"], np.bool_)}


def compare(env_id: str, updates: int, seed: int = 0, reward_scale: float = 1.0) -> dict[str, Any]:
    """One env (module docstring), the batches' rewards times ``reward_scale``: ``{"env", "config",
    "batch_size", "updates", "target_copy_at", "max_weight_diff" (per update), "max_loss_diff",
    "grad_norms"}``; ``grad_norms`` are the total gradient norms before clipping, of both sides'
    updates (SB3's ``max_grad_norm`` is 10).

    Raises:
        ValueError: the config's batch size or discount is not rl-zoo's for the env.
    """
    torch.manual_seed(seed)
    kwargs, _ = zoo_kwargs(zoo_table("dqn")[env_id])
    sb3 = stable_baselines3.DQN(kwargs.pop("policy"), gym.make(env_id), seed=seed, device="cpu", **kwargs)
    # train() records its loss there (read below); no output formats, so no log folder.
    sb3.set_logger(Logger(folder=None, output_formats=[]))
    # Target copies every updates // 2 (halfway and at the end), on either side's own path: rqrl's
    # by its train-iteration counter, SB3's as its _on_step does it (a polyak update with tau 1).
    copy_at = max(updates // 2, 1)
    cfg = apply_overrides(load_config(str(REPO / "deploy" / "configs" / CONFIGS[env_id])),
                          [f"env.env_id={env_id}", "policy.learn.double=False",
                           f"policy.learn.target_update_freq={copy_at}"])
    ours = create_policy(cfg, spaces.probe(cfg), device="cpu")
    names = list(ours.model.state_dict())
    start = dict(zip(names, (t.clone() for t in sb3.q_net.state_dict().values())))
    ours.model.load_state_dict(start)
    ours.target_model.load_state_dict(start)
    sb3.q_net_target.load_state_dict(sb3.q_net.state_dict())

    data = transitions(env_id, 5000, seed)
    data["reward"] = data["reward"] * np.float32(reward_scale)
    rng = np.random.default_rng(seed)
    batch_size, gamma = int(sb3.batch_size), float(sb3.gamma)
    if batch_size != int(cfg.policy.learn.batch_size) or gamma != float(cfg.policy.discount_factor):
        raise ValueError(f"{CONFIGS[env_id]}: batch size / discount differ from rl-zoo's {batch_size} / {gamma}")
    diffs, norms = [], []
    clip = torch.nn.utils.clip_grad_norm_

    def recorded_clip(*a: Any, **k: Any) -> torch.Tensor:
        norm = clip(*a, **k)
        norms.append(float(norm))
        return norm

    torch.nn.utils.clip_grad_norm_ = recorded_clip  # both sides call it through the module
    try:
        for i in range(1, updates + 1):
            diffs.append(_one_update(sb3, ours, data, rng, batch_size, gamma, copy_target=i % copy_at == 0))
    finally:
        torch.nn.utils.clip_grad_norm_ = clip
    return {"env": env_id, "config": CONFIGS[env_id], "batch_size": batch_size, "updates": updates,
            "target_copy_at": copy_at, "max_weight_diff": [w for w, _ in diffs],
            "max_loss_diff": max(loss for _, loss in diffs),
            "grad_norms": [round(n, 4) for n in norms]}


def _one_update(sb3: Any, ours: Any, data: dict[str, np.ndarray], rng: np.random.Generator, batch_size: int,
                gamma: float, copy_target: bool) -> tuple[float, float]:
    """One batch through SB3's ``DQN.train`` and rqrl's ``learn`` (whose counter copies rqrl's
    target network; ``copy_target``: SB3's is copied too). Returns the largest |difference| of any
    weight of the online and target networks after it, and the |difference| of the two losses."""
    idx = rng.integers(0, len(data["action"]), batch_size)
    batch = {k: v[idx] for k, v in data.items()}
    batch["discount"] = np.full(batch_size, gamma, np.float32)
    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    sb3.replay_buffer.sample = lambda *_a, t=t, **_k: ReplayBufferSamples(
        t["obs"], t["action"].reshape(-1, 1), t["next_obs"], t["done"].float().reshape(-1, 1),
        t["reward"].reshape(-1, 1), None)
    sb3.train(gradient_steps=1, batch_size=batch_size)
    if copy_target:
        polyak_update(sb3.q_net.parameters(), sb3.q_net_target.parameters(), 1.0)
    out = ours.learn(batch)
    pairs = [*zip(sb3.q_net.state_dict().values(), ours.model.state_dict().values()),
             *zip(sb3.q_net_target.state_dict().values(), ours.target_model.state_dict().values())]
    return (max(float((a - b).abs().max()) for a, b in pairs),
            abs(out["total_loss"] - float(sb3.logger.name_to_value["train/loss"])))


def compare_rows(env_id: str, n: int, seed: int = 0) -> dict[str, Any]:
    """The replay rows of ``n`` env steps of one random action sequence: rqrl's (its vector env,
    ``true_next_obs`` and the config's n-step adder, as a collector makes them) against SB3's
    (``DummyVecEnv`` and its ``ReplayBuffer`` with timeouts kept apart, as its DQN stores them).
    Returns ``{"env", "rows", "episode_ends", "truncations", "equal": {field: bool}}`` over the fields of both sides
    (a field on one side only is unequal); ``done`` is compared with SB3's ``dones * (1 -
    timeouts)`` and ``discount`` with its ``gamma``, what its target uses. SB3's side calls its
    ``ReplayBuffer.add`` as its DQN's ``_store_transition`` does (the final observation of an
    ended episode as ``next_obs``), a copy of those lines, not its code."""
    cfg = apply_overrides(load_config(str(REPO / "deploy" / "configs" / CONFIGS[env_id])), [f"env.env_id={env_id}"])
    spec = spaces.probe(cfg)
    policy = create_policy(cfg, spec, device="cpu")
    actions = np.random.default_rng(seed).integers(0, spec.action_n, size=(n, 1))

    env = make_vector_env(cfg.env, 1)
    adder, chunks = policy.make_adder(1, {}), []
    obs = spec.obs_batch(env.reset(seed=seed)[0])
    for a in actions:
        nxt, reward, terminated, truncated, info = env.step(a)
        nxt = spec.obs_batch(nxt)
        rows = adder.add(obs, {"action": a}, reward, true_next_obs(nxt, terminated | truncated, info, spec),
                         terminated, truncated)
        if rows is not None:
            chunks.append(rows)
        obs = nxt
    ours = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}

    venv = DummyVecEnv([lambda: gym.make(env_id)])
    venv.seed(seed)
    theirs = SB3Buffer(n, venv.observation_space, venv.action_space, handle_timeout_termination=True)
    last = venv.reset()
    for a in actions:
        new, reward, done, infos = venv.step(a)
        nxt = new.copy()
        if done[0]:
            nxt[0] = infos[0]["terminal_observation"]
        theirs.add(last, nxt, a, reward, done, infos)
        last = new
    # SB3 stores no discount: its target takes gamma where a row has none (n = 1).
    got = {"obs": theirs.observations[:n, 0], "next_obs": theirs.next_observations[:n, 0],
           "action": theirs.actions[:n, 0, 0], "reward": theirs.rewards[:n, 0],
           "done": (theirs.dones[:n, 0] * (1 - theirs.timeouts[:n, 0])).astype(bool),
           "discount": np.full(n, float(cfg.policy.discount_factor))}
    equal = {k: bool(k in got and len(ours[k]) == n and np.array_equal(ours[k], got[k].astype(ours[k].dtype)))
             for k in sorted(set(ours) | set(got))}
    return {"env": env_id, "rows": len(ours["action"]), "episode_ends": int(theirs.dones[:n].sum()),
            "truncations": int(theirs.timeouts[:n].sum()), "equal": equal}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    dqn_envs = [e for e in CONFIGS if algo_of(e) == "dqn"]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=dqn_envs, choices=dqn_envs)
    ap.add_argument("--updates", type=int, default=50)
    ap.add_argument("--rows", type=int, default=5000, help="env steps of the rows part (0: skip it)")
    ap.add_argument("--reward-scale", type=float, default=1.0,
                    help="multiply the batches' rewards (both sides): 100 pushes gradient norms past the clip of 10")
    ap.add_argument("--check", type=float, default=None, metavar="TOL",
                    help="exit 1 when a weight differs by more than TOL or a rows field differs")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [compare(env_id, args.updates, reward_scale=args.reward_scale) for env_id in args.envs]
    for r in rows:
        print(f"{r['env']:<15} {r['config']:<22} batch {r['batch_size']:>3}, {r['updates']} updates: largest weight "
              f"difference after the first {r['max_weight_diff'][0]:.1e}, after any {max(r['max_weight_diff']):.1e} "
              f"(targets copied every {r['target_copy_at']} updates); "
              f"largest loss difference {r['max_loss_diff']:.1e}; "
              f"gradient norms {min(r['grad_norms']):.2f}-{max(r['grad_norms']):.2f}, "
              f"{sum(n > 10 for n in r['grad_norms'])} of {len(r['grad_norms'])} clipped")
    out: dict[str, Any] = {"updates": rows, "rows": []}
    if args.rows:
        out["rows"] = [compare_rows(env_id, args.rows) for env_id in args.envs]
        for r in out["rows"]:
            print(f"{r['env']:<15} rows of {args.rows} random env steps ({r['episode_ends']} episode ends, "
                  f"{r['truncations']} of them truncations): equal to SB3's replay buffer's in "
                  f"{', '.join(k for k, ok in r['equal'].items() if ok) or 'no field'}"
                  + ("" if all(r["equal"].values()) else
                     f"; DIFFERENT in {', '.join(k for k, ok in r['equal'].items() if not ok)}"))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    if args.check is not None:
        bad = [r["env"] for r in rows if max(r["max_weight_diff"]) > args.check]
        bad += [f"{r['env']} rows" for r in out["rows"] if not all(r["equal"].values())]
        if bad:
            print(f"FAILED --check {args.check:g}: {', '.join(bad)}")
            sys.exit(1)
    return out


if __name__ == "__main__":
    main()
