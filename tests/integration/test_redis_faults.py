"""Redis as a database that fails (issue 19): a stall, a wipe, server limits, pickled payloads.

Each test drives the coordinator's or the workers' parts against a private redis-server and
checks that the fault is reported as what it is, never as a dead worker, and that nothing the
docs promise is lost.
"""

from __future__ import annotations

import copy
import queue
import threading

import pytest
from easydict import EasyDict

from common import keys
from common.connection import connect
from common.embedded_redis import EmbeddedRedis, binary_version
from coordinator.daemon import Coordinator


def _major(exe: str) -> int:
    return int((binary_version(exe) or "0").split(".")[0])


@pytest.fixture(scope="module")
def debug_redis(redis_exe):
    """A private redis-server that accepts ``DEBUG SLEEP`` (Redis 7 needs ``--enable-debug-command``)."""
    extra = ["--enable-debug-command", "local"] if _major(redis_exe) >= 7 else []
    server = EmbeddedRedis(exe=redis_exe, extra_args=extra).start()
    yield server
    server.stop()


def _next_pass(c: Coordinator) -> list[tuple[str, str]]:
    """The next liveness pass's verdict (the thread hands one list per pass)."""
    return c._dead.get(timeout=30)  # a hang guard only: a pass comes every second


def test_a_redis_stall_longer_than_the_heartbeat_timeout_kills_no_task(debug_redis, small_cfg, tmp_path):
    """``DEBUG SLEEP`` 2x the heartbeat TTL expires a live task's heartbeat while its worker
    cannot refresh it. The liveness read that spanned the stall must not declare the task dead;
    a task whose heartbeat really stops is still declared dead afterwards."""
    conn = connect(debug_redis.url)
    conn.flushall()
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(heartbeat_timeout=1.5, collector_task_space=2, eval_every_train_iter=0, eval_interval=0.0)
    c = Coordinator(cfg, conn, tmp_path)
    c.commander.get_learner_task()
    task = c.commander.get_collector_task()
    tid = task["task_id"]
    c.running[tid] = {"task": task, "kind": "collector", "started": True}
    beat_key = keys.heartbeat(c.exp, tid)
    worker = connect(debug_redis.url)
    worker.set(beat_key, "w", px=1500)
    thread = threading.Thread(target=c._liveness_thread, daemon=True)
    thread.start()
    try:
        assert _next_pass(c) == []  # the task's heartbeat is fresh
        # The whole server sleeps 3 s: the heartbeat (1.5 s TTL) expires and nobody can write.
        # The liveness thread's next read is queued behind the sleep (it reads every second).
        connect(debug_redis.url, socket_timeout=30).execute_command("DEBUG", "SLEEP", 3)
        # The worker's first beat once Redis answers again (sent after the queued read).
        worker.set(beat_key, "w", px=1500)
        stop_beating = threading.Event()

        def beat() -> None:
            while not stop_beating.wait(0.4):
                worker.set(beat_key, "w", px=1500)

        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        verdicts = [_next_pass(c) for _ in range(4)]
        assert verdicts == [[]] * 4, f"a Redis stall was taken for a worker death: {verdicts}"
        # A real death is still one: the worker stops beating, its key expires.
        stop_beating.set()
        beater.join()
        for _ in range(10):
            dead = _next_pass(c)
            if dead:
                break
        assert [t for t, _ in dead] == [tid] and "heartbeat lost" in dead[0][1]
    finally:
        c._stop_liveness.set()
        thread.join(timeout=10)
        c.tb.close()
        worker.close()
        conn.close()
