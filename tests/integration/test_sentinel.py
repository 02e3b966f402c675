"""Runs through Redis Sentinel survive the loss of their primary: real redis-server processes
(one primary, one replica, three sentinels on loopback ports, tests/fixtures/sentinel.py), real
``rq worker`` processes, real CartPole training, the primary killed with SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
import redis
from rq import Queue

from common import keys
from common.connection import connect, connect_checked, primary_changes, write_replicated
from common.embedded_redis import binary_version
from tests.conftest import REPO, kill_leftovers, rq_bin, wait_event, worker_env
from tests.fixtures.sentinel import SentinelSet, stop_launcher, wait_for
from common.rq_json import TaskSerializer

# The runs are bounded by env steps; the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.timeout(900)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
PASSWORD = "s3nt-pw"


@pytest.mark.every_redis
def test_a_sentinel_address_reaches_the_primary_and_follows_a_failover(redis_exe, tmp_path):
    with SentinelSet(exe=redis_exe, password=PASSWORD) as s:
        url = s.url
        env = worker_env(url)
        conn = connect_checked(url)  # PING and the version check, through the sentinels
        first = s.primary_port()
        # The stock `rq worker` command line, as docs/deploy.md gives it.
        job = Queue(keys.COLLECTOR_QUEUE, connection=conn, serializer=TaskSerializer).enqueue_call("builtins.len", args=([1, 2, 3],))
        res = subprocess.run([rq_bin(), "worker", keys.COLLECTOR_QUEUE, "--burst", "--url", url, "--connection-class",
                              "common.connection.RQConnection", "-w", "workers.worker.PreloadWorker"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-2000:]
        job.refresh()
        assert job.get_status() == "finished" and job.return_value() == 3
        status = subprocess.run([sys.executable, "-m", "coordinator.cli", "status", "--redis-url", url], env=env,
                                cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert f"redis {binary_version(redis_exe)} " in status.stdout and f"127.0.0.1:{first}" in status.stdout
        assert PASSWORD not in status.stdout + status.stderr
        # A write that must survive waits for the replica's acknowledgement.
        assert write_replicated(conn, lambda c: c.set("rqrl:kept", "1")) == (True, 1)

        # A command in flight when the primary dies is retried on the new primary (redis-py alone
        # would reconnect its connection to the dead address: redis/redis-py#3874).
        got: list = []
        blocked = threading.Thread(target=lambda: got.append(conn.blpop(["rqrl:wake"], timeout=60)), daemon=True)
        blocked.start()
        wait_for(lambda: any(c.get("cmd") == "blpop" for c in s.client(first).client_list()), 10, "the BLPOP")
        assert s.kill_primary() == first
        second = s.wait_failover(first)
        s.client(second).rpush("rqrl:wake", "after")
        blocked.join(timeout=60)
        assert got == [(b"rqrl:wake", b"after")]
        assert [(c["from"], c["to"]) for c in primary_changes(conn)] == [(f"127.0.0.1:{first}", f"127.0.0.1:{second}")]
        assert conn.get("rqrl:kept") == b"1"
        assert write_replicated(conn, lambda c: c.incr("rqrl:n")) == (1, -1)  # no replica left to wait for


def _train(s: SentinelSet, tmp_path, name: str, *sets: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", s.url, "--name", "r1",
            "--set", f"exp_name={name}", "--set", "commander.max_wall_seconds=0",
            "--set", "commander.max_env_step=60000"]
    for kv in sets:
        args += ["--set", kv]
    return subprocess.Popen(args, cwd=tmp_path, env=worker_env(""), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _accounting(conn: redis.Redis, exp: str, buffer_id: str) -> dict[str, int]:
    """The buffer's chunk accounting on the (new) primary: stats hash, pending and undelivered entries."""
    stream = keys.buffer_meta(exp, buffer_id)
    raw = {k.decode(): int(v) for k, v in conn.hgetall(keys.buffer_stats(exp, buffer_id)).items()}
    group = next(g for g in conn.xinfo_groups(stream) if g["name"] == keys.LEARNER_GROUP.encode())
    undelivered = len(conn.xrange(stream, min=f"({group['last-delivered-id'].decode()}", max="+"))
    acc = {k: raw.get(k, 0) for k in ("produced", "consumed", "expired", "corrupt", "malformed", "trimmed", "duplicate")}
    acc["unconsumed"] = undelivered + int(group["pending"])
    return acc


def _finish(proc: subprocess.Popen, tmp_path, name: str, conn: redis.Redis) -> tuple[dict, str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, (out[-2000:], err[-3000:])
    run = tmp_path / name / "r1"
    summary = json.loads((run / "summary.json").read_text())
    log = (run / "log" / "coordinator.log").read_text()
    acc = _accounting(conn, f"{name}/r1", summary["buffer_id"])
    # Each chunk counted once: every produced chunk is consumed, expired, corrupt, malformed,
    # trimmed or still unconsumed, on the primary the run ended on.
    assert acc["produced"] == (acc["consumed"] + acc["expired"] + acc["corrupt"] + acc["malformed"] + acc["trimmed"]
                               + acc["unconsumed"]), acc
    assert acc["corrupt"] == acc["malformed"] == 0
    # The learner inserted every chunk Redis counts as consumed once (tests/integration/
    # test_duplicate_delivery.py: never a second time), plus any the failover lost after it read them.
    assert summary["learner_chunks"] >= acc["consumed"] and "learner_redelivered" in summary, (summary, acc)
    return summary, log


@pytest.mark.slow
def test_a_run_survives_its_primary_killed_after_the_first_eval(tmp_path):
    name = f"sent_{os.getpid()}"
    with SentinelSet(password=PASSWORD) as s:
        conn = connect(s.url)
        proc = _train(s, tmp_path, name)
        try:
            wait_event(conn, f"{name}/r1", lambda ev: ev.get("type") == "finished" and ev.get("eval_flag"), 150)
            first = s.kill_primary()
            second = s.wait_failover(first)
            summary, log = _finish(proc, tmp_path, name, conn)
        finally:
            stop_launcher(proc)
            kill_leftovers(name)  # rqrl train's background teardown would outlive the servers
        assert summary["exit_code"] == 0 and summary["converged"] is True
        named = f"primary 127.0.0.1:{first} -> 127.0.0.1:{second}"
        assert summary["redis_failovers"] == 1 and summary["redis_failover"].startswith(named), summary
        assert re.search(rf"Redis failover: {re.escape(named)}", log), log[-3000:]
        assert PASSWORD not in log


@pytest.mark.slow
def test_a_run_survives_its_primary_killed_during_a_checkpoint_write(tmp_path):
    """The replica is paused (SIGSTOP) and 32 MB are written ahead of the learner's next checkpoint,
    more than the sockets between primary and replica buffer, so the checkpoint stays in the
    primary's memory; the primary is killed while the learner's write waits for the replica
    (WAIT), the replica resumes and is promoted. It lacks that checkpoint and everything the run
    wrote after the ballast (chunks, acks, events, policy versions): the learner writes the
    checkpoint again on the new primary and the run converges."""
    name = f"sentck_{os.getpid()}"
    with SentinelSet(password=PASSWORD) as s:
        conn = connect(s.url)
        ckpt = keys.ckpt(f"{name}/r1", "latest")
        proc = _train(s, tmp_path, name, "policy.learn.learner.hook.save_ckpt_after_iter=100")
        try:
            primary = s.client(s.primary_port())
            wait_for(lambda: primary.hget(ckpt, "version"), 120, "the first checkpoint")
            on_replica = int(s.client(s.replica.port).hget(ckpt, "version"))
            os.kill(s.replica.proc.pid, signal.SIGSTOP)
            try:
                primary.set("rqrl:ballast", b"x" * (32 << 20))
                wait_for(lambda: any(c.get("cmd") == "wait" for c in primary.client_list()), 60,
                         "the learner's checkpoint WAIT", poll_s=0.01)
                written = int(primary.hget(ckpt, "version"))
                first = s.kill_primary()
            finally:
                os.kill(s.replica.proc.pid, signal.SIGCONT)
            assert written > on_replica  # the checkpoint in flight never reached the replica
            second = s.wait_failover(first)
            # The same version again (the learner's next checkpoint would come 100 iterations later).
            seen = wait_for(lambda: (v := int(s.client(second).hget(ckpt, "version") or 0)) >= written and v, 60,
                            "the checkpoint written again on the new primary", poll_s=0.01)
            assert seen == written
            summary, log = _finish(proc, tmp_path, name, conn)
        finally:
            stop_launcher(proc)
            kill_leftovers(name)  # rqrl train's background teardown would outlive the servers
        assert summary["exit_code"] == 0 and summary["redis_failovers"] == 1
        learner_log = (tmp_path / name / "r1" / "log" / "learner" / "learner.txt").read_text()
        assert "written again after the failover" in learner_log and "published again" in learner_log, learner_log[-3000:]
