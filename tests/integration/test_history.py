"""History and stream trimming: eval results survive any number of later events, unread events
are never trimmed while the coordinator is away, and a trimmed stream is reported, not misread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from common import events, keys, streams
from common.connection import connect
from coordinator.curve import events_trimmed
from coordinator.daemon import Coordinator
from tests.conftest import REPO, worker_env

pytestmark = [pytest.mark.redis_server]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _flood(conn, exp: str, n: int) -> None:
    pipe = conn.pipeline(transaction=False)
    for i in range(n):
        events.emit(pipe, exp, "learner_info", f"learner_task_flood{i % 7}", "learner", n=i)
        if i % 10_000 == 9_999:
            pipe.execute()
    pipe.execute()


@pytest.mark.slow
def test_evals_survive_100k_later_events(tmp_path, redis_server):
    exp = f"hist_{os.getpid()}"
    conn = connect(redis_server.url)
    conn.flushall()
    env = worker_env(redis_server.url)
    res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", redis_server.url,
                          "--set", f"exp_name={exp}", "--set", "env.stop_value=100000",
                          # Deterministic mode: evals at 500, 1000, 1500 and 2000 env steps whatever the
                          # learner's and the eval worker's speeds (an asynchronous run skips an eval
                          # trigger while one runs: a fast learner once got 2 evals in 400 iterations).
                          "--deterministic", "--set", "commander.eval_every_env_step=500",
                          "--set", "commander.max_env_step=2000"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = (tmp_path / exp / "latest" / "evals.jsonl").read_text().splitlines()
    evals = [json.loads(x) for x in lines]
    assert len(evals) >= 3 and all(e["run_id"] == evals[0]["run_id"] for e in evals)
    _flood(conn, f"{exp}/{(tmp_path / exp / 'latest').resolve().name}", 100_000)  # the run's events
    curve = subprocess.run([sys.executable, "-m", "coordinator.cli", "curve", "--exp", exp, "--redis-url",
                            redis_server.url, "--out", str(tmp_path / "c.png")], env=env, capture_output=True,
                           text=True, timeout=120)
    assert curve.returncode == 0, curve.stderr
    assert f": {len(evals)} evals," in curve.stdout, (curve.stdout, len(evals))
    assert "warning" not in curve.stderr


@pytest.mark.every_redis
def test_unread_events_are_never_trimmed(real_redis):
    exp = "unread"
    stream = keys.events(exp)
    streams.ensure_group(real_redis, stream, keys.COORDINATOR_GROUP, start_id="0")
    _flood(real_redis, exp, 120_000)  # the coordinator is away for all of them
    got = 0
    while entries := streams.read_group(real_redis, stream, keys.COORDINATOR_GROUP, "c", 10_000, 10):
        got += len(entries)
    assert got == 120_000


@pytest.mark.every_redis
def test_a_trimmed_stream_is_reported(real_redis, small_cfg, tmp_path, redis_server):
    """Redis 7.0 leaves XINFO's max-deleted-entry-id at 0-0 after XTRIM; the check must not read
    that as "nothing removed" (it did: this test failed on 7.0.15 and passed on 6.2.14)."""
    exp = keys.namespace(small_cfg.exp_name, "r1")
    for i in range(5):
        events.emit(real_redis, exp, "finished", f"collector_task_{i}", "collector", eval_flag=True,
                    reward_mean=float(i), reward_std=0.0, train_iter=i)
    real_redis.hset(keys.commander(exp), "state", json.dumps({"t0": time.time() - 30}))
    assert events_trimmed(real_redis, exp) == ""  # whole, on every version
    real_redis.xtrim(keys.events(exp), maxlen=2, approximate=False)
    real_redis.hset(keys.commander(exp), "state", json.dumps({"t0": time.time() - 300}))  # the run began earlier
    assert "trimmed" in events_trimmed(real_redis, exp)
    curve = subprocess.run([sys.executable, "-m", "coordinator.cli", "curve", "--exp", exp, "--redis-url",
                            redis_server.url, "--out", str(tmp_path / "c.png")], env=worker_env(redis_server.url),
                           capture_output=True, text=True, timeout=120)
    assert "warning: rqrl:test_exp/r1:events" in curve.stderr and "trimmed" in curve.stderr, curve.stderr
    # The coordinator sees the same when it has not read what was removed.
    coord = Coordinator(small_cfg, real_redis, tmp_path, run_name="r1")
    coord.event_reader.last_id = real_redis.xrange(keys.events(exp))[0][0].decode()
    coord.event_reader.check_trimmed()
    assert not coord.event_reader.lost  # what was removed was older than what it read
    coord.event_reader.last_id = "1-0"
    coord.event_reader.check_trimmed()
    assert "was trimmed past the last event read" in coord.event_reader.lost
    coord.tb.close()
