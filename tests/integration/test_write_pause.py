"""Redis pauses writes (``CLIENT PAUSE ... WRITE``, what FAILOVER does to clients) while reads
are served on time: no heartbeat can be written and every one expires, yet no worker died.

A real CartPole run (coordinator and ``rq worker`` processes) goes through a write pause 2.7x
its heartbeat timeout: no task is declared dead, none is replaced, the run converges and every
chunk is counted once. The probe the coordinator tells the pause by is checked on every Redis
version on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis

from common import keys
from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from coordinator.write_pause import WriteProbe
from tests.conftest import REPO, wait_event, worker_env
from tests.fixtures.sentinel import wait_for

pytestmark = [pytest.mark.redis_server, pytest.mark.timeout(600)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
HEARTBEAT_TIMEOUT_S = 3
PAUSE_MS = 8000


def _accounting(conn: redis.Redis, exp: str, buffer_id: str) -> dict[str, int]:
    """The buffer's chunk counts (``rqrl:{exp}:buffer:{id}:stats``) and those still in its stream."""
    stream = keys.buffer_meta(exp, buffer_id)
    raw = {k.decode(): int(v) for k, v in conn.hgetall(keys.buffer_stats(exp, buffer_id)).items()}
    group = next(g for g in conn.xinfo_groups(stream) if g["name"] == keys.LEARNER_GROUP.encode())
    undelivered = len(conn.xrange(stream, min=f"({group['last-delivered-id'].decode()}", max="+"))
    acc = {k: raw.get(k, 0) for k in ("produced", "consumed", "expired", "corrupt", "malformed", "trimmed",
                                      "duplicate")}
    acc["unconsumed"] = undelivered + int(group["pending"])
    return acc


@pytest.mark.slow
@pytest.mark.every_redis  # ~20 s a version: CLIENT PAUSE WRITE came with 6.2, and expiry in a pause differs
def test_a_write_pause_longer_than_the_heartbeat_timeout_kills_no_task(tmp_path, redis_exe):
    server = EmbeddedRedis(exe=redis_exe).start()
    try:
        conn = connect(server.url)
        exp = f"wpause_{os.getpid()}"
        ns = f"{exp}/r1"
        p = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", server.url,
                              "--name", "r1", "--set", f"exp_name={exp}", "--set", "commander.max_wall_seconds=0",
                              "--set", "commander.max_env_step=60000",
                              "--set", f"commander.heartbeat_timeout={HEARTBEAT_TIMEOUT_S}"],
                             cwd=tmp_path, env=worker_env(server.url), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        wait_event(conn, ns, lambda e: e["type"] == "learner_info", 120)
        conn.execute_command("CLIENT", "PAUSE", str(PAUSE_MS), "WRITE")
        # Reads are served: the heartbeats are seen to expire while the pause lasts.
        beats = list(conn.scan_iter(match=f"rqrl:{ns}:task:*:heartbeat"))
        assert beats
        wait_for(lambda: not any(conn.mget(beats)), PAUSE_MS / 1000, "every heartbeat expired in the pause")
        out, err = p.communicate(timeout=400)
        assert p.returncode == 0, out[-2000:] + err[-3000:]
        run = tmp_path / exp / "r1"
        log = (run / "log" / "coordinator.log").read_text()
        summary = json.loads((run / "summary.json").read_text())
        acc = _accounting(conn, ns, summary["buffer_id"])
    finally:
        server.stop()
    assert "heartbeat lost" not in log and "a replacement will be issued" not in log, log[-4000:]
    assert log.count("dispatched learner task") == 1, log[-4000:]
    assert "Redis paused writes (CLIENT PAUSE / failover) for" in log, log[-4000:]
    assert summary["exit_code"] == 0 and summary["converged"] is True, summary
    assert acc["produced"] == (acc["consumed"] + acc["expired"] + acc["corrupt"] + acc["malformed"] + acc["trimmed"]
                               + acc["unconsumed"]), acc
    assert acc["produced"] > 0 and acc["corrupt"] == acc["malformed"] == acc["duplicate"] == 0, acc


@pytest.mark.every_redis
def test_the_write_probe_names_a_pause_and_a_read_only_replica(redis_exe):
    server = EmbeddedRedis(exe=redis_exe).start()
    try:
        conn = connect(server.url)
        probe = WriteProbe(conn, "rqrl:probe_test:write_probe", wait_s=0.3)
        assert probe() is None and conn.get("rqrl:probe_test:write_probe") == b"1"
        conn.execute_command("CLIENT", "PAUSE", "1500", "WRITE")
        cause = probe()
        assert cause is not None and "no reply within 0.3 s" in cause
        assert conn.get("x") is None  # reads are still served
        connect(server.url).set("rqrl:probe_test:after", 1)  # held until the pause is over
        assert probe() is None  # the probe's connection is opened again
        # A demoted primary refuses writes with READONLY (its primary need not be reachable).
        conn.execute_command("REPLICAOF", "127.0.0.1", "1")
        cause = probe()
        assert cause is not None and "ReadOnlyError" in cause
        conn.execute_command("REPLICAOF", "NO", "ONE")
        assert probe() is None
        probe.close()
    finally:
        server.stop()
