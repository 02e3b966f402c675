"""Single-process baseline: the same config, policy, adder and data rule as a distributed run, in
one loop with no Redis — what the distributed run is compared to.

    python -m tests.bench.bench_serial --seeds 0 1 2 [--config deploy/configs/cartpole_dqn.py]

Loop, for any registered algorithm: act with ``policy.act`` (collect setting from the
algorithm, as the commander hands it out), turn steps into rows with the policy's adder, then
``replay``: insert into a replay buffer and train while the replay ratio allows, by the learner's
own rule (``workers.sources.replay.ratio_allows``: from ``replay_start_size`` env steps on, one
iteration, then ``train_iter_per_env_step`` per env step); ``on_policy``: train once on every
``n_sample`` rows (one rollout of the current policy). Evaluate deterministically every
``commander.eval_every_train_iter`` iterations on ``env.n_evaluator_episode`` episodes; stop at
``env.stop_value`` by the commander's rule (a confirming eval of the same weights on
``commander.confirm_eval_episodes`` episodes, by ``confirm_margin_se`` standard errors). Prints
env steps, train iterations and wall seconds to solve per seed, the loop's train iterations per
second (from its first train iteration, eval time left out: what a learner that only trains is
compared with) and when its first train iteration ended (unix seconds, for runs timed from a
fresh process: tests/bench/bench_start.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from common import spaces
from common.config import apply_overrides, load_config
from common.policy import algorithm_of, create_policy
from workers.envs import make_vector_env, true_next_obs
from workers.replay_buffer import ReplayBuffer
from workers.sources.replay import ratio_allows

REPO = Path(__file__).resolve().parents[2]


def evaluate(policy, cfg, spec, seed: int, episodes: int | None = None) -> np.ndarray:
    """Returns of ``episodes`` (default ``env.n_evaluator_episode``) eval episodes, one env each
    (acting as the run's evals: ``policy.eval``, its randomness seeded by ``seed``)."""
    n = int(episodes or cfg.env.n_evaluator_episode)
    env = make_vector_env(cfg.env, n, train=False)
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    returns, ret, done_once = np.zeros(n), np.zeros(n), np.zeros(n, bool)
    while not done_once.all():
        obs, r, te, tr, _ = env.step(policy.act_eval(spec.obs_batch(obs), rng))
        ret += r * ~done_once
        finished = (te | tr) & ~done_once
        returns[finished] = ret[finished]
        done_once |= te | tr
    env.close()
    return returns


def converged(policy, cfg, spec, seed: int) -> bool:
    """The commander's rule: an eval reaches stop_value, then (``confirm_eval_episodes`` > 0) an eval
    of the same weights on that many other episodes does so by ``confirm_margin_se`` standard errors."""
    stop = float(cfg.env.stop_value)
    if evaluate(policy, cfg, spec, seed).mean() < stop:
        return False
    n = int(cfg.commander.confirm_eval_episodes)
    if n <= 0:
        return True
    r = evaluate(policy, cfg, spec, seed + 1_000_003, n)
    return r.mean() - float(cfg.commander.confirm_margin_se) * r.std() / np.sqrt(n) >= stop


def solve(cfg, seed: int, max_env_steps: int = 300_000) -> dict:
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    algo = algorithm_of(cfg)
    policy = create_policy(cfg, spec, device="cpu")
    replay = algo.data_source == "replay"
    buf = ReplayBuffer(cfg.policy.other.replay_buffer.replay_buffer_size, policy.schema()) if replay else None
    n_env = int(cfg.env.collector_env_num)
    env = make_vector_env(cfg.env, n_env)
    obs, _ = env.reset(seed=seed)
    obs = spec.obs_batch(obs)
    envstep = it = 0
    passed = False
    ratio = float(cfg.policy.learn.train_iter_per_env_step)
    start = max(int(cfg.policy.other.replay_buffer.replay_start_size), 1)  # as the learner's ReplayFeeder
    if replay and ratio <= 0:
        raise ValueError("bench_serial needs policy.learn.train_iter_per_env_step > 0 (it paces the serial loop)")
    eval_every = int(cfg.commander.eval_every_train_iter) or 200
    t0 = time.perf_counter()
    first_train: float | None = None  # perf_counter and unix time of the first train iteration's end
    first_train_unix = 0.0
    eval_s = 0.0  # seconds spent evaluating after the first train iteration
    next_eval = eval_every
    setting = algo.collect_setting(cfg.policy, {"envstep": 0, "train_iter": 0, "collectors": 1})
    adder = policy.make_adder(n_env, setting)
    while envstep < max_env_steps:
        setting = algo.collect_setting(cfg.policy, {"envstep": envstep, "train_iter": it, "collectors": 1})
        parts, got = [], 0
        while got < cfg.policy.collect.n_sample:
            a, record = policy.act(obs, setting, rng)
            nxt, r, te, tr, info = env.step(a)
            nxt = spec.obs_batch(nxt)
            rows = adder.add(obs, record, r, true_next_obs(nxt, te | tr, info, spec), te, tr)
            obs = nxt
            envstep += n_env
            if rows is not None:
                parts.append(rows)
                got += len(rows["obs"])
        batch = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        if replay:
            buf.extend(batch)
            while ratio_allows(it, envstep, start, ratio):
                policy.learn(buf.sample(cfg.policy.learn.batch_size, rng))
                it += 1
                if first_train is None:
                    first_train, first_train_unix = time.perf_counter(), time.time()
        else:
            policy.learn(batch)
            it += 1
            if first_train is None:
                first_train, first_train_unix = time.perf_counter(), time.time()
        if it >= next_eval:
            next_eval = it + eval_every
            t_eval = time.perf_counter()
            passed = converged(policy, cfg, spec, seed + it)
            eval_s += time.perf_counter() - t_eval
            if passed:
                break
    end = time.perf_counter()
    training = end - (first_train or end) - eval_s
    return {"seed": seed, "envstep": envstep, "train_iter": it, "wall_s": round(end - t0, 2),
            "solved": bool(passed),
            "train_iter_per_s": round(it / training, 1) if training > 0 else None,
            "first_train_unix": round(first_train_unix, 3)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "deploy" / "configs" / "cartpole_dqn.py"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cfg = load_config(args.config)
    if args.overrides:
        cfg = apply_overrides(cfg, args.overrides)
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
