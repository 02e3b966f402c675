"""Learner train iterations/s in one process: uniform against prioritized replay, per algorithm.

    python -m tests.bench.bench_learner [--iters 2000] [--json out.json]

The loop is the learner's: sample a batch from a full buffer (20,000 rows of random data with
the policy's schema), ``policy.learn``, and with prioritized replay the priority update from the
returned |TD error|. One torch thread, as the workers. Goal: priorities cost <= 15 %.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from common import spaces
from common.config import load_config
from common.policy import create_policy
from workers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer

REPO = Path(__file__).resolve().parents[2]
GOAL_PRIORITY_COST = 0.15


def _fill(buf: ReplayBuffer, schema: dict, rng: np.random.Generator, n: int) -> None:
    chunk = {}
    for k, (shape, dt) in schema.items():
        if np.dtype(dt).kind == "f":
            chunk[k] = rng.normal(size=(n, *shape)).astype(dt)
        elif np.dtype(dt).kind == "b":
            chunk[k] = rng.random(size=(n, *shape)) < 0.05
        else:
            chunk[k] = rng.integers(0, 2, size=(n, *shape)).astype(dt)
    buf.extend(chunk)


def rate(config: str, prioritized: bool, iters: int) -> float:
    cfg = load_config(REPO / "deploy" / "configs" / f"{config}.py")
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, modes=("learn",), device="cpu")
    schema = policy.schema()
    rng = np.random.default_rng(0)
    buf = PrioritizedReplayBuffer(20_000, schema, beta_anneal_iters=10_000) if prioritized else ReplayBuffer(20_000, schema)
    _fill(buf, schema, rng, 20_000)
    bs = int(cfg.policy.learn.batch_size)

    def one(i: int) -> None:
        batch = buf.sample(bs, rng, i) if prioritized else buf.sample(bs, rng)
        info = policy.learn(batch)
        if prioritized:
            buf.update_last(info["priority"])

    for i in range(100):  # warm-up
        one(i)
    t0 = time.perf_counter()
    for i in range(iters):
        one(i)
    return iters / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["cartpole_dqn", "pendulum_sac"])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    out: dict = {}
    print(f"{'config':<14} {'uniform it/s':>12} {'prioritized it/s':>16} {'cost':>6}  goal <= {GOAL_PRIORITY_COST:.0%}")
    for name in args.configs:
        uni, pri = [], []
        for _ in range(args.repeats):  # interleaved, so drift in machine load hits both alike
            uni.append(rate(name, False, args.iters))
            pri.append(rate(name, True, args.iters))
        u, p = float(np.median(uni)), float(np.median(pri))
        out[name] = {"uniform_it_per_s": [round(x, 1) for x in uni], "prioritized_it_per_s": [round(x, 1) for x in pri],
                     "cost": round(1 - p / u, 3)}
        print(f"{name:<14} {u:>12.1f} {p:>16.1f} {1 - p / u:>6.1%}  (min/median/max uniform {min(uni):.0f}/{u:.0f}/"
              f"{max(uni):.0f}, prioritized {min(pri):.0f}/{p:.0f}/{max(pri):.0f})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
