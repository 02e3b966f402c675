"""rqrl's DQN update against Stable-Baselines3's, measured: the same weights, the same batches.

    pip install -e ".[bench]"
    python -m tests.bench.bench_dqn_update [--envs LunarLander-v3 ...] [--updates 50] [--rows 5000]
                                           [--json out.json]

Per env of tests/bench/bench_sb3.py's DQN rows: SB3's ``DQN`` built with rl-zoo's hyperparameters
for the env (bench_sb3.zoo_kwargs), and rqrl's policy from the env's config (bench_sb3.CONFIGS)
with SB3's plain-max target (``policy.learn.double=False``). rqrl's online and target networks
start from SB3's weights; both then take ``--updates`` gradient steps on the same batches (rl-zoo's
batch size, drawn from transitions of a random policy on the env), SB3 through its own
``DQN.train`` with its replay buffer's ``sample`` handing it each batch. Printed per env: the
largest |difference| of any weight after each update (float32: a few 1e-8 is rounding, a wrong
loss, optimizer, clip or target shows from the first update on) and of the losses.
Target copies are not compared: SB3 counts them in env steps, rqrl in train iterations (the
configs' docstrings convert one into the other).

Then the rows the update learns from (:func:`compare_rows`): one random action sequence of
``--rows`` env steps through rqrl's collector path and through SB3's ``DummyVecEnv`` and
``ReplayBuffer``, compared field by field (episode ends and truncations counted: MountainCar's
and Acrobot's random episodes all end by truncation, which must not be terminal).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.bench.bench_sb3 import CONFIGS, REPO, algo_of, zoo_kwargs, zoo_table


def transitions(env_id: str, n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` transitions of a uniformly random policy on ``env_id``: obs float32 (n, *O), action
    int64 (n,), reward float32 (n,), next_obs, done bool (n,) (terminated; a truncation is not)."""
    import gymnasium as gym

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


def compare(env_id: str, updates: int, seed: int = 0) -> dict[str, Any]:
    """One env (module docstring): ``{"env", "batch_size", "updates", "max_weight_diff" (per
    update), "max_loss_diff"}``."""
    import gymnasium as gym
    import stable_baselines3
    from stable_baselines3.common.logger import configure
    from stable_baselines3.common.type_aliases import ReplayBufferSamples

    from common import spaces
    from common.config import apply_overrides, load_config
    from common.policy import create_policy

    torch.manual_seed(seed)
    kwargs, _ = zoo_kwargs(zoo_table("dqn")[env_id])
    sb3 = stable_baselines3.DQN(kwargs.pop("policy"), gym.make(env_id), seed=seed, device="cpu", **kwargs)
    sb3.set_logger(configure(None, []))  # train() records its loss there (read below), as learn() would set it
    cfg = apply_overrides(load_config(str(REPO / "deploy" / "configs" / CONFIGS[env_id])),
                          [f"env.env_id={env_id}", "policy.learn.double=False"])
    ours = create_policy(cfg, spaces.probe(cfg), device="cpu")
    names = list(ours.model.state_dict())
    start = dict(zip(names, (t.clone() for t in sb3.q_net.state_dict().values())))
    ours.model.load_state_dict(start)
    ours.target_model.load_state_dict(start)
    sb3.q_net_target.load_state_dict(sb3.q_net.state_dict())

    data = transitions(env_id, 5000, seed)
    rng = np.random.default_rng(seed)
    batch_size, gamma = int(sb3.batch_size), float(sb3.gamma)
    if batch_size != int(cfg.policy.learn.batch_size) or gamma != float(cfg.policy.discount_factor):
        raise ValueError(f"{CONFIGS[env_id]}: batch size / discount differ from rl-zoo's {batch_size} / {gamma}")
    weight_diffs, loss_diffs = [], []
    for _ in range(updates):
        idx = rng.integers(0, len(data["action"]), batch_size)
        batch = {k: v[idx] for k, v in data.items()}
        batch["discount"] = np.full(batch_size, gamma, np.float32)
        t = {k: torch.as_tensor(v) for k, v in batch.items()}
        sb3.replay_buffer.sample = lambda *_a, t=t, **_k: ReplayBufferSamples(
            t["obs"], t["action"].reshape(-1, 1), t["next_obs"], t["done"].float().reshape(-1, 1),
            t["reward"].reshape(-1, 1), None)
        sb3.train(gradient_steps=1, batch_size=batch_size)
        out = ours.learn(batch)
        loss_diffs.append(abs(out["total_loss"] - float(sb3.logger.name_to_value["train/loss"])))
        weight_diffs.append(max(float((a - b).abs().max()) for a, b in
                                zip(sb3.q_net.state_dict().values(), ours.model.state_dict().values())))
    return {"env": env_id, "config": CONFIGS[env_id], "batch_size": batch_size, "updates": updates,
            "max_weight_diff": weight_diffs, "max_loss_diff": max(loss_diffs)}


def compare_rows(env_id: str, n: int, seed: int = 0) -> dict[str, Any]:
    """The replay rows of ``n`` env steps of one random action sequence: rqrl's (its vector env,
    ``true_next_obs`` and the config's n-step adder, as a collector makes them) against SB3's (``DummyVecEnv``
    and its ``ReplayBuffer`` with timeouts kept apart, as its DQN stores them). Returns ``{"env",
    "rows", "episode_ends", "truncations", "equal": {field: bool}}``; ``done`` is compared with
    SB3's ``dones * (1 - timeouts)``, what its target uses."""
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
    from stable_baselines3.common.vec_env import DummyVecEnv

    from common import spaces
    from common.config import apply_overrides, load_config
    from common.policy import create_policy
    from workers.envs import make_vector_env, true_next_obs

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
    got = {"obs": theirs.observations[:n, 0], "next_obs": theirs.next_observations[:n, 0],
           "action": theirs.actions[:n, 0, 0], "reward": theirs.rewards[:n, 0],
           "done": (theirs.dones[:n, 0] * (1 - theirs.timeouts[:n, 0])).astype(bool)}
    equal = {k: bool(len(ours[k]) == n and np.array_equal(ours[k], v.astype(ours[k].dtype))) for k, v in got.items()}
    return {"env": env_id, "rows": len(ours["action"]), "episode_ends": int(theirs.dones[:n].sum()),
            "truncations": int(theirs.timeouts[:n].sum()), "equal": equal}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    dqn_envs = [e for e in CONFIGS if algo_of(e) == "dqn"]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=dqn_envs, choices=dqn_envs)
    ap.add_argument("--updates", type=int, default=50)
    ap.add_argument("--rows", type=int, default=5000, help="env steps of the rows part (0: skip it)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = [compare(env_id, args.updates) for env_id in args.envs]
    for r in rows:
        print(f"{r['env']:<15} {r['config']:<22} batch {r['batch_size']:>3}, {r['updates']} updates: largest weight "
              f"difference after the first {r['max_weight_diff'][0]:.1e}, after any {max(r['max_weight_diff']):.1e}; "
              f"largest loss difference {r['max_loss_diff']:.1e}")
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
    return out


if __name__ == "__main__":
    main()
