"""rqrl's DQN (policy, n-step adder, replay buffer) in Stable-Baselines3's DQN loop, one process, no
Redis: what a DQN preset learns when the only thing that changes is how many envs step at once and
how often the acting policy is updated.

    python -m tests.bench.bench_dqn_loop [--config deploy/configs/mountaincar_dqn.py]
                                         [--envs 1] [--train-freq 16] [--gradient-steps 8]
                                         [--budget 120000] [--seeds 0 1 2 3 4] [--json out.json]

The loop is SB3's ``OffPolicyAlgorithm.learn`` for DQN: one vector step of ``--envs`` envs
(epsilon-greedy with the preset's schedule over env steps), its transitions into the replay
buffer, and, once more than ``replay_start_size`` env steps were taken, ``--gradient-steps``
updates after every ``--train-freq`` env steps (rl-zoo's ``train_freq`` / ``gradient_steps``).
``--train-freq`` counts env steps of all envs (a multiple of ``--envs``), so more envs keep the
replay ratio; SB3 counts vector steps (4 envs and ``train_freq: 16`` update after every 64 env
steps), so with ``--envs`` > 1 this is not SB3's loop with ``n_envs`` envs. The target is
the plain max (``policy.learn.double=False``) as SB3's. At the budget, one greedy eval of
``env.n_evaluator_episode`` episodes (tests/bench/bench_sb3.py's closing eval) gives the seed's
last eval. docs/performance.md has what it measured on MountainCar: 1 env against 4.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import spaces
from common.config import apply_overrides, load_config
from common.policy import algorithm_of, create_policy
from tests.bench.bench_serial import evaluate
from workers.envs import make_vector_env, true_next_obs
from workers.replay_buffer import ReplayBuffer

REPO = Path(__file__).resolve().parents[2]


def run(cfg: Any, seed: int, n_env: int, train_freq: int, gradient_steps: int, budget: int) -> dict[str, Any]:
    """One seed of the loop (module docstring): ``train_freq`` and ``budget`` in env steps of all
    ``n_env`` envs. Returns ``seed``, ``last_eval`` (mean return of the closing eval), ``envstep``
    and ``train_iter``. Torch's global seed and thread count are restored afterwards.

    Raises:
        ValueError: ``train_freq`` is not a multiple of ``n_env``.
    """
    if train_freq % n_env:
        raise ValueError(f"--train-freq {train_freq} must be a multiple of --envs {n_env} (env steps of all envs)")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a learner worker trains
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return _run(cfg, seed, n_env, train_freq, gradient_steps, budget)
    finally:
        torch.set_num_threads(threads)


def _run(cfg: Any, seed: int, n_env: int, train_freq: int, gradient_steps: int, budget: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    spec = spaces.probe(cfg)
    algo = algorithm_of(cfg)
    policy = create_policy(cfg, spec, device="cpu")
    buf = ReplayBuffer(int(cfg.policy.other.replay_buffer.replay_buffer_size), policy.schema())
    start = int(cfg.policy.other.replay_buffer.replay_start_size)
    env = make_vector_env(cfg.env, n_env)
    obs, _ = env.reset(seed=seed)
    obs = spec.obs_batch(obs)
    adder = policy.make_adder(n_env, {})
    envstep = it = 0
    while envstep < budget:
        setting = algo.collect_setting(cfg.policy, {"envstep": envstep})
        action, record = policy.act(obs, setting, rng)
        nxt, reward, terminated, truncated, info = env.step(action)
        nxt = spec.obs_batch(nxt)
        rows = adder.add(obs, record, reward, true_next_obs(nxt, terminated | truncated, info, spec),
                         terminated, truncated)
        obs = nxt
        envstep += n_env
        if rows is not None:
            buf.extend(rows)
        if envstep > start and envstep % train_freq == 0:
            for _ in range(gradient_steps):
                policy.learn(buf.sample(int(cfg.policy.learn.batch_size), rng))
                it += 1
    last = float(np.mean(evaluate(policy, cfg, spec, seed + 1_000_003)))
    return {"seed": seed, "last_eval": round(last, 1), "envstep": envstep, "train_iter": it}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "deploy" / "configs" / "mountaincar_dqn.py"))
    ap.add_argument("--envs", type=int, default=1, help="envs stepped at once (SB3's n_envs)")
    ap.add_argument("--train-freq", type=int, default=16, help="env steps (all envs) between update bursts")
    ap.add_argument("--gradient-steps", type=int, default=8, help="updates per burst")
    ap.add_argument("--budget", type=int, default=120_000, help="env steps")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cfg = apply_overrides(load_config(args.config), [f"env.collector_env_num={args.envs}", "policy.learn.double=False",
                                                     "policy.eval.eps=0.0", *args.overrides])
    runs = []
    for seed in args.seeds:
        runs.append(run(cfg, seed, args.envs, args.train_freq, args.gradient_steps, args.budget))
        print(json.dumps(runs[-1]), flush=True)
    lasts = [r["last_eval"] for r in runs]
    out = {"config": Path(args.config).name, "envs": args.envs, "train_freq": args.train_freq,
           "gradient_steps": args.gradient_steps, "budget": args.budget, "overrides": args.overrides,
           "median_last_eval": statistics.median(lasts), "runs": runs}
    print(f"{out['config']}: {args.envs} env(s), {args.gradient_steps} updates per {args.train_freq} env steps, "
          f"{args.budget:,} env steps: last eval median {out['median_last_eval']:.1f} [{min(lasts):.1f}, {max(lasts):.1f}]")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
