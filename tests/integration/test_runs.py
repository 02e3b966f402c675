"""Two runs of one config (seeds 1 and 2) at once on one Redis and one worker fleet: each has its
own run folder and its own keys, and neither sees the other's tasks, data or evals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from common import keys, streams
from common.connection import connect
from tests.conftest import REPO, rq_bin, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _task_ids(conn, ns: str) -> dict[str, set[str]]:
    """Task ids per event type on the run's events stream."""
    out: dict[str, set[str]] = {}
    for _, raw in conn.xrange(keys.events(ns)):
        ev = streams.decode_fields(raw)
        out.setdefault(ev["type"], set()).add(ev["task_id"])
    return out


def test_two_seeds_share_one_redis_and_one_fleet(tmp_path, real_redis, redis_server):
    url, exp = redis_server.url, f"runs_{os.getpid()}"
    env = worker_env(url)
    # One fleet for both runs: a learner worker each (a learner task lasts the run) and collectors.
    workers = [subprocess.Popen([rq_bin(), "worker", q, "-w", "workers.worker.PreloadWorker", "--name", f"{exp}-{q}-{i}"],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for i, q in enumerate(["learner", "learner", "collector", "collector"])]
    budget = ["--set", f"exp_name={exp}", "--set", "env.stop_value=100000", "--set", "commander.max_env_step=700",
              "--set", "commander.collector_task_space=1", "--set", "commander.eval_task_space=0",
              "--set", "commander.eval_every_train_iter=50", "--set", "policy.collect.collector.task_env_steps=200",
              "--set", "commander.max_wall_seconds=120"]
    try:
        # The default run names (UTC time + seed): started in the same second, they differ by seed.
        coords = [subprocess.Popen([sys.executable, "-m", "coordinator", CONFIG, "--redis-url", url, "--seed", str(s),
                                    *budget], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True) for s in (1, 2)]
        outs = [c.communicate(timeout=180)[0] for c in coords]
        for c, out in zip(coords, outs):
            assert c.returncode == 2, out[-3000:]  # the env-step budget ends each run
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=20)
            except subprocess.TimeoutExpired:
                w.kill()
    runs = sorted(p for p in (tmp_path / exp).iterdir() if not p.is_symlink())
    assert [p.name[-3:] for p in runs] == ["-s1", "-s2"], runs
    assert (tmp_path / exp / "latest").resolve() in runs
    summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
    namespaces = [keys.namespace(exp, r.name) for r in runs]
    assert sorted(n.decode() for n in real_redis.smembers(keys.runs())) == namespaces
    seen = [_task_ids(real_redis, ns) for ns in namespaces]
    for r, s, ns, ids in zip(runs, summaries, namespaces, seen):
        assert s["run_name"] == r.name and s["envstep"] >= 700, s
        assert any(t.startswith("learner") for t in ids["started"]) and any(t.startswith("collector") for t in ids["started"])
        for name in ("final.pt", "evals.jsonl", "curve.png", "log/commander/coordinator.txt", "log/learner/learner.txt"):
            assert (r / name).is_file(), (r, name)
        assert list((r / "log" / "commander").glob("events.out.tfevents.*")), "no TensorBoard events in the run folder"
        # Each run's evals are its own (one run id), and its env-step counter only counts its own chunks.
        evals = [json.loads(x) for x in (r / "evals.jsonl").read_text().splitlines()]
        assert evals and {e["run_id"] for e in evals} == {s["run_id"]}
        stats = {k.decode(): int(v) for k, v in real_redis.hgetall(keys.buffer_stats(ns, s["buffer_id"])).items()}
        assert int(real_redis.get(keys.envstep(ns))) == stats["produced_env_steps"] > 0, stats
    # No task of one run shows on the other's stream; the two runs used different buffers and policies.
    all_a, all_b = (set().union(*ids.values()) for ids in seen)
    assert not all_a & all_b
    assert summaries[0]["buffer_id"] != summaries[1]["buffer_id"] and summaries[0]["run_id"] != summaries[1]["run_id"]
