"""``rqrl sweep``: two seeds of one config at once on one Redis and one worker fleet. Each run has
its own folder and its own keys, neither sees the other's tasks, data or evals, and the table and
plot across seeds agree with the runs."""

from __future__ import annotations

import json
import os
import statistics

import pytest

from common import keys, streams
from coordinator.sweep import band, parse_seeds
from tests.conftest import REPO, run_rqrl

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.server_agnostic]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _task_ids(conn, ns: str) -> dict[str, set[str]]:
    """Task ids per event type on the run's events stream."""
    out: dict[str, set[str]] = {}
    for _, raw in conn.xrange(keys.events(ns)):
        ev = streams.decode_fields(raw)
        out.setdefault(ev["type"], set()).add(ev["task_id"])
    return out


def test_sweep_of_two_seeds_on_one_redis_and_fleet(tmp_path, real_redis, redis_server):
    exp = f"sweep_{os.getpid()}"
    # The Redis is the test's (not a private one), so the runs' keys can be inspected afterwards.
    res = run_rqrl("sweep", CONFIG, "--seeds", "1-2", "--collectors", "2", "--eval-episodes", "3",
                   "--redis-url", redis_server.url, "--set", f"exp_name={exp}", "--set", "env.stop_value=100000",
                   "--set", "commander.max_env_step=700", "--set", "commander.eval_every_train_iter=50",
                   "--set", "commander.eval_interval=2.0",
                   "--set", "policy.collect.collector.task_env_steps=200", "--set", "commander.max_wall_seconds=120",
                   cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]  # both used up their budget: results, not failures
    runs = sorted(p for p in (tmp_path / exp).iterdir() if p.is_dir() and not p.is_symlink()
                  and not p.name.startswith("sweep-") and p.name != "tensorboard")
    assert [p.name[-3:] for p in runs] == ["-s1", "-s2"], runs
    summaries = [json.loads((r / "summary.json").read_text()) for r in runs]
    namespaces = [keys.namespace(exp, r.name) for r in runs]
    assert sorted(n.decode() for n in real_redis.smembers(keys.runs())) == namespaces
    seen = [_task_ids(real_redis, ns) for ns in namespaces]
    for r, s, ns, ids in zip(runs, summaries, namespaces, seen):
        assert s["run_name"] == r.name and s["exit_code"] == 2 and s["envstep"] >= 700, s
        assert any(t.startswith("learner") for t in ids["started"]) and any(t.startswith("collector") for t in ids["started"])
        for name in ("final.pt", "evals.jsonl", "curve.png", "log/commander/coordinator.txt", "log/learner/learner.txt"):
            assert (r / name).is_file(), (r, name)
        assert list((r / "tensorboard").glob("events.out.tfevents.*")), "no TensorBoard events in the run folder"
        assert (tmp_path / exp / "tensorboard" / r.name).resolve() == (r / "tensorboard").resolve()
        # Each run's evals are its own (one run id), and its env-step counter counts only its own chunks.
        evals = [json.loads(x) for x in (r / "evals.jsonl").read_text().splitlines()]
        assert evals and {e["run_id"] for e in evals} == {s["run_id"]}
        stats = {k.decode(): int(v) for k, v in real_redis.hgetall(keys.buffer_stats(ns, s["buffer_id"])).items()}
        assert int(real_redis.get(keys.envstep(ns))) == stats["produced_env_steps"] > 0, stats
        # Fair share: at most one collector task of this run at once (commander.collector_task_space = 2 // 2).
        assert int(real_redis.hget(keys.commander(ns), "collector_task_space")) == 1
        # The collector workers serve both runs' tasks and keep each run's envs: one build per worker and run.
        evs = [streams.decode_fields(raw) for _, raw in real_redis.xrange(keys.events(ns))]
        builds: dict[str, int] = {}
        for e in evs:
            if e["type"] == "finished" and e["task_type"] == "collector" and not e["eval_flag"]:
                builds[e["worker"]] = builds.get(e["worker"], 0) + int(e["env_built"])
        assert builds and max(builds.values()) == 1, builds
    # No task of one run shows on the other's stream; different buffers, policies and run ids.
    assert not set().union(*seen[0].values()) & set().union(*seen[1].values())
    assert summaries[0]["buffer_id"] != summaries[1]["buffer_id"] and summaries[0]["run_id"] != summaries[1]["run_id"]

    # The table agrees with the runs; the plot exists.
    sweep_dir = next((tmp_path / exp).glob("sweep-*"))
    table = json.loads((sweep_dir / "sweep.json").read_text())
    assert [row["run_name"] for row in table["runs"]] == [r.name for r in runs]
    for row, s in zip(table["runs"], summaries):
        assert row["envstep"] == s["envstep"] and row["exit_code"] == 2 and row["solved"] is False
        assert row["reeval_episodes"] == 3 and row["reeval_mean"] is not None
        assert row["last_eval_reward_mean"] == s["last_eval_reward_mean"]
    # What docs/results.md shows beside the figures: the budget, the overrides and the machine.
    assert table["budget"] == {"max_env_step": 700, "max_train_iter": 0, "max_wall_seconds": 120}
    assert "commander.max_env_step=700" in table["overrides"] and table["algo"] == "dqn"
    assert table["machine"]["cpus"] >= 1 and table["machine"]["gpu"] is None and table["machine"]["torch"]
    env_steps = [row["envstep"] for row in table["runs"]]
    assert table["summary"]["env_steps"]["median"] == statistics.median(env_steps)
    assert table["summary"]["solved"] == 0 and table["summary"]["time_to_solve_s"]["median"] is None
    md = (sweep_dir / "sweep.md").read_text()
    assert md.count("| no |") == 2 and "0/2" in md
    assert (sweep_dir / "sweep.png").stat().st_size > 10_000


def test_seed_lists_and_the_band_across_seeds():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4] and parse_seeds("1,3,7") == [1, 3, 7] and parse_seeds("0-1,5") == [0, 1, 5]
    for bad in ("a", "3-1", "1,1", "-2"):
        with pytest.raises(ValueError):
            parse_seeds(bad)
    # Seed A covers env steps 0..100, seed B 0..200: past 100 only B counts.
    grid, mean, lo, hi = band([[(0, 0.0), (100, 100.0)], [(0, 0.0), (200, 50.0)]], points=5)
    assert grid == [0.0, 50.0, 100.0, 150.0, 200.0]
    assert mean == [0.0, 31.25, 62.5, 37.5, 50.0]
    assert lo == [0.0, 12.5, 25.0, 37.5, 50.0] and hi == [0.0, 50.0, 100.0, 37.5, 50.0]
