"""Single-process baseline: the same config, policy, n-step packing, replay buffer and replay
ratio as a distributed run, in one loop with no Redis — what the distributed run is compared to.

    python -m tests.bench.bench_serial --seeds 0 1 2 [--config deploy/configs/cartpole_dqn.py]

Loop: collect ``n_sample`` transitions with epsilon-greedy (epsilon from the command mode),
train while ``train_iter < train_iter_per_env_step * env steps``, evaluate greedily every
``commander.eval_every_train_iter`` iterations on ``env.n_evaluator_episode`` episodes, stop at
``env.stop_value``. Prints env steps, train iterations and wall seconds to solve per seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from common.config import load_config
from common.policy import create_policy
from common.policy.dqn import TRANSITION_FIELDS, transition_schema
from workers.envs import make_vector_env, true_next_obs
from workers.replay_buffer import ReplayBuffer

REPO = Path(__file__).resolve().parents[2]


def evaluate(policy, cfg, seed: int) -> float:
    n = int(cfg.env.n_evaluator_episode)
    env = make_vector_env(cfg.env.env_id, n)
    obs, _ = env.reset(seed=seed)
    returns, ret, done_once = np.zeros(n), np.zeros(n), np.zeros(n, bool)
    while not done_once.all():
        obs, r, te, tr, _ = env.step(policy.greedy(obs))
        ret += r * ~done_once
        finished = (te | tr) & ~done_once
        returns[finished] = ret[finished]
        done_once |= te | tr
    env.close()
    return float(returns.mean())


def solve(cfg, seed: int, max_env_steps: int = 200_000) -> dict:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    policy = create_policy(cfg)
    buf = ReplayBuffer(cfg.policy.other.replay_buffer.replay_buffer_size, transition_schema(cfg.policy.model.obs_shape))
    n_env = int(cfg.env.collector_env_num)
    env = make_vector_env(cfg.env.env_id, n_env)
    adder = policy.make_adder(n_env)
    obs, _ = env.reset(seed=seed)
    envstep = it = 0
    ratio = float(cfg.policy.learn.train_iter_per_env_step)
    eval_every = int(cfg.commander.eval_every_train_iter) or 200
    t0 = time.perf_counter()
    next_eval = eval_every
    while envstep < max_env_steps:
        eps = policy.get_setting_collect({"envstep": envstep})["eps"]
        rows = []
        while len(rows) < cfg.policy.collect.n_sample:
            a = policy.act(obs, eps, rng)
            nxt, r, te, tr, info = env.step(a)
            rows += adder.add(obs, a, r, true_next_obs(nxt, te | tr, info), te, tr)
            obs = nxt
            envstep += n_env
        cols = list(zip(*rows))
        buf.extend({k: np.asarray(v) for k, v in zip(TRANSITION_FIELDS, cols)})
        if len(buf) < cfg.policy.other.replay_buffer.replay_start_size:
            continue
        while it < ratio * envstep:
            policy.forward(buf.sample(cfg.policy.learn.batch_size, rng))
            it += 1
            if it >= next_eval:
                next_eval += eval_every
                if evaluate(policy, cfg, seed + it) >= cfg.env.stop_value:
                    return {"seed": seed, "envstep": envstep, "train_iter": it,
                            "wall_s": round(time.perf_counter() - t0, 2), "solved": True}
    return {"seed": seed, "envstep": envstep, "train_iter": it, "wall_s": round(time.perf_counter() - t0, 2),
            "solved": False}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "deploy" / "configs" / "cartpole_dqn.py"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    runs = []
    for seed in args.seeds:
        r = solve(cfg, seed)
        runs.append(r)
        print(json.dumps(r), flush=True)
    ok = [r for r in runs if r["solved"]]
    res = {"solved": f"{len(ok)}/{len(runs)}",
           "median_envstep": statistics.median(r["envstep"] for r in ok) if ok else None,
           "median_train_iter": statistics.median(r["train_iter"] for r in ok) if ok else None,
           "median_wall_s": statistics.median(r["wall_s"] for r in ok) if ok else None, "runs": runs}
    print(f"serial: solved {res['solved']}, median env steps {res['median_envstep']}, "
          f"median train iters {res['median_train_iter']}, median wall {res['median_wall_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
