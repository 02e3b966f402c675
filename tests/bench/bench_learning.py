"""Learning beyond CartPole, on the full stack: each run is ``rqrl train`` of a shipped config with
an env-step budget, on a private Redis whose events are read afterwards.

    python -m tests.bench.bench_learning minatar [--seeds 0 1 2] [--budget 250000]
    python -m tests.bench.bench_learning halfcheetah [--budget 50000]
    python -m tests.bench.bench_learning breakout [--budget 250000] [--bare-updates N]
    ... [--json OUT]

* ``minatar``: DQN on MinAtar Breakout (deploy/configs/minatar_breakout_dqn.py), the eval return
  reached by 100k and by the budget's env steps (the last eval at or before each), per seed.
* ``halfcheetah``: SAC on HalfCheetah-v5 (deploy/configs/halfcheetah_sac.py): the eval return
  by the budget, and the longest pause between two consecutive chunks of step data after the
  learner started training (the ``ts`` of the buffer stream's entries): a collector held back by
  the replay-ratio limiter shows as such a pause.
* ``breakout``: PPO on Atari Breakout (deploy/configs/breakout_ppo.py): frames/s of the full stack
  (env steps x frame skip over the coordinator's wall time, learning included) against a bare
  loop in one process with the same envs, network, GAE rows and update (``--bare-updates``
  updates, timed from its first reset); each process kind's share of the CPU (eval tasks,
  training collector tasks, the learner: ``cpu_s`` of their finish infos); the eval curve
  (``evals.jsonl``) in frames.

Returns and prints one JSON object per case; nothing is judged here (docs/performance.md sets
the figures beside published ones).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import keys, streams
from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from tests.bench.bench_start import wait_teardown

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "deploy" / "configs"


def train(config: str, seed: int, budget: int, overrides: list[str] = (), timeout: float = 4 * 3600) -> dict[str, Any]:
    """``rqrl train CONFIG --seed S`` until ``budget`` env steps on a private Redis; its summary,
    evals and events."""
    server = EmbeddedRedis().start()
    workdir = Path(tempfile.mkdtemp(prefix="rqrl-bench-learning-"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    try:
        res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", str(CONFIGS / config), "--redis-url",
                              server.url, "--seed", str(seed), "--name", "r", "--set", "env.stop_value=1e9",
                              "--set", f"commander.max_env_step={budget}", "--set", "commander.max_wall_seconds=0.0",
                              *[a for o in overrides for a in ("--set", o)]],
                             cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        exp = next(p for p in workdir.iterdir() if p.is_dir()).name
        ns = keys.namespace(exp, "r")
        wait_teardown(workdir / ns)  # the workers exit (after the return) before this Redis stops
        conn = connect(server.url)
        evs = [streams.decode_fields(raw) for _, raw in conn.xrange(keys.events(ns))]
        summary = json.loads((workdir / ns / "summary.json").read_text())
        buffer = [streams.decode_fields(raw) for _, raw in conn.xrange(keys.buffer_meta(ns, summary["buffer_id"]))]
    finally:
        server.stop()
    evals = [json.loads(line) for line in (workdir / ns / "evals.jsonl").read_text().splitlines() if line.strip()]
    return {"exit": res.returncode, "wall_s": round(wall, 1), "summary": summary, "evals": evals, "events": evs,
            "chunks": buffer, "stderr_tail": res.stderr[-1500:] if res.returncode not in (0, 2) else ""}


def _curve(evals: list[dict[str, Any]], scale: int = 1) -> list[list[float]]:
    return [[int(e["envstep"]) * scale, e.get("reward_mean")] for e in evals if not e.get("confirmation")]


def _at(evals: list[dict[str, Any]], envstep: int) -> float | None:
    """The return of the last eval at or before ``envstep`` env steps."""
    before = [e for e in evals if not e.get("confirmation") and int(e["envstep"]) <= envstep]
    return before[-1].get("reward_mean") if before else None


def minatar(seeds: list[int], budget: int) -> dict[str, Any]:
    rows = []
    for seed in seeds:
        r = train("minatar_breakout_dqn.py", seed, budget)
        rows.append({"seed": seed, "exit": r["exit"], "wall_s": r["wall_s"], "envstep": r["summary"].get("envstep"),
                     "eval_at_100k": _at(r["evals"], 100_000), f"eval_at_{budget // 1000}k": _at(r["evals"], budget),
                     "curve": _curve(r["evals"]), "stderr_tail": r["stderr_tail"]})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "curve"}), flush=True)
    return {"case": "minatar_breakout_dqn", "budget": budget, "runs": rows}


def halfcheetah(budget: int, seed: int = 0) -> dict[str, Any]:
    r = train("halfcheetah_sac.py", seed, budget)
    from common.config import load_config

    start = int(load_config(CONFIGS / "halfcheetah_sac.py").policy.other.replay_buffer.replay_start_size)
    ts = [float(c["ts"]) for c in r["chunks"] if "ts" in c]
    sent = 0
    warm_at = None
    for c in r["chunks"]:  # the first chunk past the learner's start: training is under way
        sent += int(c.get("env_steps", 0))
        if warm_at is None and sent > start:
            warm_at = float(c["ts"])
    gaps = [b - a for a, b in zip(ts, ts[1:]) if warm_at is not None and a >= warm_at]
    out = {"case": "halfcheetah_sac", "seed": seed, "budget": budget, "exit": r["exit"], "wall_s": r["wall_s"],
           "envstep": r["summary"].get("envstep"), "train_iter": r["summary"].get("train_iter"),
           "eval_at_budget": _at(r["evals"], budget), "replay_start_size": start,
           "max_chunk_gap_after_warmup_s": round(max(gaps), 2) if gaps else None,
           "chunk_gaps_over_5s": sum(g > 5 for g in gaps), "curve": _curve(r["evals"]), "stderr_tail": r["stderr_tail"]}
    print(json.dumps({k: v for k, v in out.items() if k != "curve"}), flush=True)
    return out


def _bare_ppo(updates: int, seed: int = 0) -> dict[str, Any]:
    """The PPO loop of breakout_ppo.py in one process: 8 envs, act, GAE rows, learn; env steps/s."""
    import numpy as np
    import torch

    from common import spaces
    from common.config import load_config
    from common.policy import create_policy
    from common.seeding import env_seeds
    from workers.envs import make_vector_env, step, true_next_obs

    torch.set_num_threads(1)
    cfg = load_config(CONFIGS / "breakout_ppo.py")
    n = int(cfg.env.collector_env_num)
    t0 = time.perf_counter()
    env = make_vector_env(cfg.env, n, train=True)
    spec = spaces.from_spaces(cfg.env.env_id, env.single_observation_space, env.single_action_space)
    spaces.check_model(cfg, spec)
    policy = create_policy(cfg, spec, modes=("learn", "collect"), device="cpu")
    setting = {"rollout_rows": int(cfg.policy.collect.n_sample)}
    adder = policy.make_adder(n, setting)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=env_seeds(seed, n))
    obs = spec.obs_batch(obs)
    steps = 0
    for _ in range(updates):
        rows = None
        while rows is None:
            action, record = policy.act(obs, setting, rng)
            nxt, reward, term, trunc, info = step(env, cfg.env.env_id, action)
            nxt = spec.obs_batch(nxt)
            rows = adder.add(obs, record, reward, true_next_obs(nxt, term | trunc, info, spec), term, trunc)
            obs = nxt
            steps += n
        policy.learn(rows)
    wall = time.perf_counter() - t0
    env.close()
    skip = int(cfg.env.atari.frame_skip)
    return {"updates": updates, "env_steps": steps, "wall_s": round(wall, 1), "frames_per_s": round(steps * skip / wall, 1)}


def breakout(budget: int, bare_updates: int, seed: int = 0) -> dict[str, Any]:
    r = train("breakout_ppo.py", seed, budget)
    s = r["summary"]
    skip = 4
    fin = [e for e in r["events"] if e["type"] == "finished"]
    cpu = {"eval": sum(float(e.get("cpu_s", 0)) for e in fin if e["task_type"] == "collector" and e.get("eval_flag")),
           "collect": sum(float(e.get("cpu_s", 0)) for e in fin if e["task_type"] == "collector" and not e.get("eval_flag")),
           "learner": max([float(e.get("cpu_s", 0)) for e in r["events"] if e["task_type"] == "learner"] or [0.0])}
    total = sum(cpu.values()) or 1.0
    wall = float(s.get("wall_seconds") or r["wall_s"])
    out = {"case": "breakout_ppo", "seed": seed, "budget": budget, "exit": r["exit"], "wall_s": r["wall_s"],
           "envstep": s.get("envstep"), "frames": int(s.get("envstep") or 0) * skip,
           "frames_per_s": round(int(s.get("envstep") or 0) * skip / wall, 1) if wall else None,
           "cpu_s": {k: round(v, 1) for k, v in cpu.items()},
           "cpu_share": {k: round(v / total, 3) for k, v in cpu.items()},
           "evals": len([e for e in r["evals"] if not e.get("confirmation")]),
           "curve_frames": _curve(r["evals"], skip), "stderr_tail": r["stderr_tail"]}
    if bare_updates:
        out["bare_loop"] = _bare_ppo(bare_updates, seed)
        out["full_stack_vs_bare"] = round(out["frames_per_s"] / out["bare_loop"]["frames_per_s"], 3) \
            if out["frames_per_s"] else None
    print(json.dumps({k: v for k, v in out.items() if k != "curve_frames"}), flush=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=["minatar", "halfcheetah", "breakout"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budget", type=int, default=None, help="env steps (default 250k, 50k for halfcheetah)")
    ap.add_argument("--bare-updates", type=int, default=30, help="breakout: updates of the in-process loop")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    budget = args.budget or (50_000 if args.case == "halfcheetah" else 250_000)
    if args.case == "minatar":
        res = minatar(args.seeds, budget)
    elif args.case == "halfcheetah":
        res = halfcheetah(budget, args.seeds[0])
    else:
        res = breakout(budget, args.bare_updates, args.seeds[0])
    res["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res["loadavg"] = list(os.getloadavg())
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
