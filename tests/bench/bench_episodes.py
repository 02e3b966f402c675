"""Episodes and task ends: how many training episodes a collector task's end cuts, and how often
a worker builds a run's envs, with envs kept on the worker (``CollectorWorker``, what
``rqrl train`` runs) and with the old life cycle (RQ's forking worker: envs built and reset at
every task, at the task lengths the configs had before).

    python -m tests.bench.bench_episodes [--envs cartpole acrobot pong] [--json OUT]

Each case runs the coordinator and real ``rq worker`` processes (one learner, two collector
workers) on a private Redis until ``commander.max_env_step``, then reads the collectors'
``finished`` events: finished training episodes, their lengths, ``episodes_cut`` (episodes
a task left unfinished that no later task continues) and ``env_built`` per RQ worker.
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

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "deploy" / "configs"

# name -> (config, overrides, env-step budget, the task length the config had before envs were kept)
CASES: dict[str, tuple[str, list[str], int, int]] = {
    "cartpole": ("cartpole_dqn.py", ["env.stop_value=1e9"], 8_000, 1000),
    "acrobot": ("cartpole_dqn.py", ["env.env_id='Acrobot-v1'", "env.stop_value=1e9"], 12_000, 1000),
    "pong": ("pong_dqn.py", ["env.stop_value=1e9", "policy.other.replay_buffer.replay_start_size=500"], 16_000, 4096),
}
WORKER = {"kept": "workers.worker.CollectorWorker", "old": "workers.worker.PreloadWorker"}


def _until_tasks_end(conn: Any, stream: str, timeout: float = 120.0) -> list[dict[str, Any]]:
    """The run's events once every collector task that started has reported its end: the
    coordinator exits right after its summary, while long tasks are still flushing at the stop
    flag (XREAD BLOCK; ``timeout`` seconds is a hang guard)."""
    evs: list[dict[str, Any]] = []
    last, deadline = b"0", time.monotonic() + timeout
    while True:
        for _, entries in conn.xread({stream: last}, block=1000) or []:
            for last, raw in entries:
                evs.append(streams.decode_fields(raw))
        started = {e["task_id"] for e in evs if e["type"] == "started" and e.get("task_type") == "collector"}
        ended = {e["task_id"] for e in evs if e["type"] in ("finished", "failed")}
        if started <= ended or time.monotonic() > deadline:
            return evs


def run_case(name: str, mode: str, timeout: float = 1800.0) -> dict[str, Any]:
    """One run of case ``name`` with collector workers of ``mode`` (``kept`` or ``old``)."""
    config, overrides, budget, old_task = CASES[name]
    server = EmbeddedRedis().start()
    conn = connect(server.url)
    workdir = Path(tempfile.mkdtemp(prefix="rqrl-bench-episodes-"))
    env = dict(os.environ, RQRL_REDIS_URL=server.url, RQ_REDIS_URL=server.url, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    sets = [*overrides, f"commander.max_env_step={budget}", "commander.eval_interval=0.0",
            "commander.eval_every_train_iter=0", "exp_name=bench_episodes"]
    if mode == "old":
        sets.append(f"policy.collect.collector.task_env_steps={old_task}")
    rq = str(Path(sys.executable).with_name("rq"))
    workers = [subprocess.Popen([rq, "worker", q, "-w", WORKER[mode] if q == "collector" else WORKER["old"],
                                 "--name", f"bench-episodes-{q}-{i}-{time.time():.0f}"], cwd=workdir, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for i, q in enumerate(["learner", "collector", "collector"])]
    t0 = time.perf_counter()
    try:
        coord = subprocess.run([sys.executable, "-m", "coordinator", str(CONFIGS / config), "--run-name", "r",
                                "--set", "commander.eval_task_space=0", *[a for s in sets for a in ("--set", s)]],
                               cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - t0
        if coord.returncode != 2:
            raise RuntimeError(f"{name}/{mode}: coordinator exited {coord.returncode}: {coord.stderr[-2000:]}")
        evs = _until_tasks_end(conn, keys.events(keys.namespace("bench_episodes", "r")))
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                w.kill()
        server.stop()
    train = [e for e in evs if e["type"] == "finished" and e["task_type"] == "collector" and not e["eval_flag"]]
    builds: dict[str, int] = {}  # per RQ worker (a forking worker's tasks each run in a work-horse of their own)
    for e in train:
        builds[e["worker"]] = builds.get(e["worker"], 0) + int(e.get("env_built", True))
    finished = sum(int(e["real_episode_count"]) for e in train)
    steps = sum(int(e.get("avg_step_per_episode", 0) * e["real_episode_count"]) for e in train)
    return {"case": name, "mode": mode, "worker": WORKER[mode], "env_step_budget": budget,
            "task_env_steps": old_task if mode == "old" else None, "tasks": len(train),
            "episodes_finished": finished, "episodes_cut_by_task_ends": sum(int(e.get("episodes_cut", 0)) for e in train),
            "mean_episode_length": round(steps / finished, 1) if finished else None,
            "env_builds_per_worker": sorted(builds.values()), "wall_s": round(wall, 1)}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--modes", nargs="+", default=["kept", "old"], choices=list(WORKER))
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = []
    for name in args.envs:
        for mode in args.modes:
            rows.append(run_case(name, mode))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
