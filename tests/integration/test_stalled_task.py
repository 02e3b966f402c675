"""A stalled but alive task (SIGSTOP, not SIGKILL) is fenced off once the coordinator declares it dead.

Real coordinator, real ``rq worker`` processes, real Redis. A collector task's process (the
CollectorWorker that runs it) is stopped with SIGSTOP: its heartbeat expires, the coordinator declares it dead (its record
leaves ``rqrl:{exp}:tasks``, its lease is deleted) and issues a replacement. It is then
resumed with SIGCONT and carries on where it stood: every write it tries must be refused (no
chunk of it reaches the buffer stream), and it fails naming the revoked lease.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from common import keys, streams
from tests.conftest import REPO, WORKER_CLASS, rq_bin, stop_run, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(240)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def wait_for(pred, timeout, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return None


def events(conn, exp):
    return [streams.decode_fields(f) for _, f in conn.xrange(keys.events(exp))]


def chunks_of(conn, exp, buffer_id, task_id):
    entries = conn.xrange(keys.buffer_meta(exp, buffer_id))
    return sum(streams.decode_fields(f).get("task_id") == task_id for _, f in entries)


def test_stalled_collector_is_fenced_after_being_declared_dead(real_redis, redis_server, tmp_path):
    conn, url = real_redis, redis_server.url
    exp = f"stall_{os.getpid()}"
    ns = f"{exp}/r1"  # the run's key namespace (--run-name r1)
    env = worker_env(url)
    procs = [subprocess.Popen([sys.executable, "-m", "coordinator", CONFIG, "--redis-url", url, "--run-name", "r1",
                               "--set", f"exp_name={exp}", "--set", "env.stop_value=100000",
                               "--set", "commander.collector_task_space=1", "--set", "commander.eval_task_space=0",
                               "--set", "commander.eval_every_train_iter=0", "--set", "commander.eval_interval=0",
                               "--set", "commander.heartbeat_timeout=3",
                               "--set", "commander.max_wall_seconds=150",
                               "--set", "policy.collect.collector.task_env_steps=1000000"],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    # Two collector workers: the stalled horse keeps one busy, the replacement takes the other.
    for q in ("learner", "collector", "collector"):
        procs.append(subprocess.Popen([rq_bin(), "worker", q, "-w", WORKER_CLASS[q],
                                       "--name", f"{exp}-{q}-{len(procs)}"], cwd=tmp_path, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    pid = None
    try:
        def running_collector():
            tasks = {k.decode(): json.loads(v) for k, v in conn.hgetall(keys.tasks(ns)).items()}
            for tid, rec in tasks.items():
                if rec["kind"] == "collector" and rec["started"]:
                    buf = rec["task"]["buffer_id"]
                    if chunks_of(conn, ns, buf, tid) >= 2:
                        return tid, buf
            return None

        found = wait_for(running_collector, 90)
        assert found, "no collector task sent data within 90 s"
        tid, buf = found
        pid = next(int(e["pid"]) for e in events(conn, ns) if e["type"] == "started" and e["task_id"] == tid)
        os.kill(pid, signal.SIGSTOP)
        declared = wait_for(lambda: not conn.hexists(keys.tasks(ns), tid), 30)
        assert declared, f"the coordinator never declared stalled task {tid} dead"
        assert not conn.exists(keys.lease(ns, tid)), "the dead task's lease was not revoked"
        sent_before = chunks_of(conn, ns, buf, tid)
        replacement = wait_for(lambda: [e for e in events(conn, ns) if e["type"] == "started"
                                        and e["task_type"] == "collector" and e["task_id"] != tid], 30)
        assert replacement, "no replacement collector task started"

        os.kill(pid, signal.SIGCONT)  # the zombie resumes mid-task
        failed = wait_for(lambda: [e for e in events(conn, ns) if e["type"] == "failed" and e["task_id"] == tid], 20)
        assert failed, f"the resumed task {tid} did not fail on its revoked lease"
        # Its failed event is the task's last act: every write it tried before was checked against the lease.
        assert chunks_of(conn, ns, buf, tid) == sent_before, "a write of the revoked task was accepted"
        assert "LeaseRevoked" in failed[0]["error"] and keys.lease(ns, tid) in failed[0]["error"], failed[0]
        # The replacement still delivers.
        new_tid = replacement[0]["task_id"]
        assert wait_for(lambda: chunks_of(conn, ns, buf, new_tid) > 0, 30), "the replacement sent nothing"
    finally:
        stop_run(conn, ns, procs, pid)
