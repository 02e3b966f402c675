"""Redis as a database that fails (issue 19): a stall, a wipe, a full Redis, server limits, clock
skew, RQ's registry lost, eval bundles kept, pickled payloads.

Each test drives the coordinator's or the workers' parts against a private redis-server and
checks that the fault is reported as what it is, never as a dead worker, and that nothing the
docs promise is lost.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time

import pytest
import redis
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
    return c.liveness.dead.get(timeout=30)  # a hang guard only: a pass comes every second


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
    c.tasks.running[tid] = {"task": task, "kind": "collector", "started": True}
    beat_key = keys.heartbeat(c.exp, tid)
    worker = connect(debug_redis.url)
    worker.set(beat_key, "w", px=1500)
    c.liveness.start()
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
        c.liveness.stop()
        c.tb.close()
        worker.close()
        conn.close()


def _passing_eval_run(conn, cfg, tmp_path) -> tuple[str, bytes]:
    """A run whose eval reached stop_value (best.pt written, not yet confirmed), left unfinished in
    Redis by a coordinator that then went away (its lock released, as after a crash). Returns the
    run name and the weights the eval played."""
    from common import blobstore

    c1 = Coordinator(cfg, conn, tmp_path, run_name="r1")
    c1._claim()
    cm = c1.commander
    cm.get_learner_task()
    cm.update_learner_info("L", {"train_iter": 5, "consumed_env_steps": 100})
    task = cm.get_collector_task()
    while not task["eval_flag"]:
        task = cm.get_collector_task()
    c1.tasks.running[task["task_id"]] = {"task": task, "kind": "collector", "started": True}
    weights = f"weights of {task['task_id']}".encode()
    blobstore.put_versioned(conn, keys.evaluated_policy(c1.exp, task["task_id"]), weights, 5)
    c1.router.route({"type": "finished", "task_id": task["task_id"], "task_type": "collector", "eval_flag": True,
                     "buffer_id": task["buffer_id"], "policy_version": 5, "real_episode_count": 4, "env_steps": 800,
                     "avg_time_per_step": 0.001, "reward_mean": 200.0, "reward_std": 1.0, "avg_step_per_episode": 200.0,
                     "avg_time_per_episode": 0.2, "ts": 1_700_000_000.0})
    c1._persist(conn.pipeline(transaction=True)).execute()
    c1.exports.export_best()
    c1._persist(conn.pipeline(transaction=True)).execute()  # the loop's next write records best.pt's eval
    assert (c1.out / "best.pt").read_bytes() == weights
    c1.ownership.release()
    c1.tb.close()
    return "r1", weights


def test_a_run_whose_redis_state_was_wiped_writes_its_summary_and_final_pt(real_redis, redis_server, small_cfg,
                                                                          tmp_path, capsys):
    """Redis restarted without persistence mid-run (here FLUSHALL, the same empty server): the
    coordinator stops with the reason, writes summary.json, and final.pt from best.pt since an eval
    had reached stop_value; it writes nothing into the emptied Redis."""
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.env.stop_value = 195.0
    cfg.commander.update(collector_task_space=2, eval_every_train_iter=1, eval_interval=0.0,
                         confirm_eval_episodes=20)
    run_name, weights = _passing_eval_run(real_redis, cfg, tmp_path)
    c2 = Coordinator(cfg, real_redis, tmp_path, run_name=run_name)
    commander_key = keys.commander(c2.exp)
    real_redis.config_set("notify-keyspace-events", "Kh")
    sub = connect(redis_server.url).pubsub()
    sub.subscribe(f"__keyspace@0__:{commander_key}")
    wiped = threading.Event()

    def wipe_once_running() -> None:
        # The resumed coordinator's first write of its state (its loop runs): then Redis loses everything.
        for msg in sub.listen():
            if msg["type"] == "message":
                connect(redis_server.url).flushall()
                wiped.set()
                return

    threading.Thread(target=wipe_once_running, daemon=True).start()
    try:
        code = c2.run()
    finally:
        sub.close()
        real_redis.config_set("notify-keyspace-events", "")
    assert wiped.is_set() and code == 1
    summary = json.loads((c2.out / "summary.json").read_text())
    assert "Redis lost the state of run" in summary["status"] and summary["exit_code"] == 1
    assert summary["best_eval_reward_mean"] == 200.0 and summary["train_iter"] == 5
    assert (c2.out / "final.pt").read_bytes() == weights
    assert f"rqrl {c2.exp}: Redis lost the state of run" in capsys.readouterr().out
    # Nothing of the run was written back into the emptied Redis.
    assert not real_redis.exists(keys.stop(c2.exp)), "the wrap-up wrote into a Redis that lost the run"


class _RunsOnUnpickle:
    """A payload that runs code while it is unpickled: it creates the file ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return open, (self.path, "w")


@pytest.mark.parametrize("queue_name,worker_class", [("collector", "workers.worker.CollectorWorker"),
                                                     ("learner", "workers.worker.PreloadWorker")])
def test_a_pickled_job_pushed_onto_an_rqrl_queue_is_refused_not_run(real_redis, redis_server, tmp_path,
                                                                     queue_name, worker_class):
    """RQ's default serializer is pickle: a job hand-pushed with it must not run anything on an
    rqrl worker (not even while its payload is decoded) and fails naming the JSON serializer; a
    JSON job on the same queue still runs."""
    import subprocess

    from rq import Queue
    from rq.job import Job

    from common.rq_json import TaskSerializer
    from tests.conftest import rq_bin, worker_env

    marker = tmp_path / "pwned"
    evil = Queue(queue_name, connection=real_redis).enqueue_call("builtins.len", args=(_RunsOnUnpickle(str(marker)),),
                                                                 job_id="evil")
    good = Queue(queue_name, connection=real_redis, serializer=TaskSerializer).enqueue_call(
        "builtins.len", args=([1, 2, 3],), job_id="good")
    res = subprocess.run([rq_bin(), "worker", queue_name, "--burst", "-w", worker_class], cwd=tmp_path,
                         env=worker_env(redis_server.url), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not marker.exists(), "a pickled payload was unpickled: it ran code on the worker"
    evil = Job.fetch("evil", connection=real_redis, serializer=TaskSerializer)
    assert evil.get_status() == "failed"
    assert "is not JSON" in (evil.latest_result().exc_string or ""), evil.latest_result().exc_string
    assert Job.fetch(good.id, connection=real_redis, serializer=TaskSerializer).return_value() == 3


def test_workers_still_count_after_redis_lost_rqs_registry(real_redis, redis_server, tmp_path):
    """RQ registers a worker only at its birth: after a Redis restart without persistence (here
    FLUSHALL) its registry is empty while the workers serve. The coordinator's count comes back
    within one refresh of rqrl's alive keys."""
    import signal
    import subprocess

    from rq import Queue

    from common import worker_presence
    from coordinator.daemon import live_workers
    from tests.conftest import rq_bin, worker_env

    queue = Queue(keys.COLLECTOR_QUEUE, connection=real_redis)
    real_redis.config_set("notify-keyspace-events", "Ks")
    sub = connect(redis_server.url).pubsub()
    # Both sets' keyspace events: rqrl's alive keys and RQ's registry (written at a worker's birth).
    sub.subscribe(f"__keyspace@0__:{keys.workers_alive(keys.COLLECTOR_QUEUE)}", "__keyspace@0__:rq:workers:collector")

    def until(pred, what: str) -> None:
        """Block on those keyspace events until ``pred()`` holds."""
        for _ in range(20):  # a hang guard only: each worker refreshes every 10 s
            if pred():
                return
            sub.get_message(timeout=worker_presence.REFRESH_S + 5)
        raise AssertionError(f"never: {what} (live collector workers: {live_workers(real_redis, queue)})")

    def until_count(n: int) -> None:
        until(lambda: live_workers(real_redis, queue) == n, f"{n} live collector workers")

    procs = [subprocess.Popen([rq_bin(), "worker", keys.COLLECTOR_QUEUE, "-w", "workers.worker.CollectorWorker",
                               "--name", f"wipe-{i}"], cwd=tmp_path, env=worker_env(redis_server.url),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    try:
        until_count(2)
        # Both born in RQ's registry too (a worker's alive key may come first), so the wipe below empties it for good.
        until(lambda: real_redis.scard("rq:workers:collector") == 2, "both workers in RQ's registry")
        real_redis.flushall()  # what a restart without persistence leaves
        until_count(2)
        assert real_redis.scard("rq:workers:collector") == 0  # RQ's registry is still empty
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)
        sub.close()
        real_redis.config_set("notify-keyspace-events", "")
    assert live_workers(real_redis, queue) == 0  # a worker that stops leaves at once


def test_only_the_eval_bundles_that_can_still_be_exported_stay_in_redis(real_redis, small_cfg, tmp_path, monkeypatch):
    """Each eval stores the bundle it played. Superseded ones are deleted at once: what stays is
    the best (best.pt), the one under confirmation and the converged one (final.pt); the eval
    list in Redis is capped (evals.jsonl keeps every eval)."""
    from common import blobstore
    from coordinator import eval_log

    monkeypatch.setattr(eval_log, "_EVALS_KEPT", 3)
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.env.stop_value = 195.0
    cfg.commander.update(collector_task_space=2, eval_every_train_iter=1, eval_interval=0.0,
                         confirm_eval_episodes=20)
    c = Coordinator(cfg, real_redis, tmp_path, run_name="r1")
    c._claim()
    cm = c.commander
    cm.get_learner_task()

    def evaluate(reward: float) -> str:
        cm.update_learner_info("L", {"train_iter": cm.train_iter + 1, "consumed_env_steps": 100})
        task = cm.get_collector_task()
        while not task["eval_flag"]:
            task = cm.get_collector_task()
        tid = task["task_id"]
        c.tasks.running[tid] = {"task": task, "kind": "collector", "started": True}
        blobstore.put_versioned(real_redis, keys.evaluated_policy(c.exp, tid), f"weights of {tid}".encode(),
                                cm.train_iter)
        ev = {"type": "finished", "task_id": tid, "task_type": "collector", "eval_flag": True,
              "buffer_id": task["buffer_id"], "policy_version": cm.train_iter, "real_episode_count": 20,
              "env_steps": 800, "avg_time_per_step": 0.001, "reward_mean": reward, "reward_std": 1.0,
              "avg_step_per_episode": 200.0, "avg_time_per_episode": 0.2, "ts": 1_700_000_000.0,
              "confirmation": bool(task.get("eval_policy_key"))}
        real_redis.xadd(keys.events(c.exp), {k: json.dumps(v) if not isinstance(v, str) else v for k, v in ev.items()})
        c._process_events(block_ms=100)
        return tid

    def stored() -> set[str]:
        return {tid for tid in all_evals if real_redis.exists(keys.evaluated_policy(c.exp, tid))}

    all_evals = [evaluate(10.0)]
    assert stored() == {all_evals[0]}  # the best so far
    all_evals.append(evaluate(20.0))
    assert stored() == {all_evals[1]}  # superseded: the first is deleted
    all_evals.append(evaluate(5.0))
    assert stored() == {all_evals[1]}  # never the best: deleted at once
    all_evals.append(evaluate(200.0))  # passes: under confirmation (and the best)
    all_evals.append(evaluate(199.0))  # the confirmation replays it and passes: converged
    assert cm.final_eval_task == all_evals[4]  # final.pt: the confirming eval's copy of those weights
    assert stored() == {all_evals[3], all_evals[4]}, "only best.pt's and final.pt's bundles are left"
    assert (c.out / "best.pt").read_bytes() == f"weights of {all_evals[3]}".encode()
    assert real_redis.llen(keys.evals(c.exp)) == 3
    assert len((c.out / "evals.jsonl").read_text().splitlines()) == 5
    c.ownership.release()
    c.tb.close()


def test_a_worker_outlives_a_full_redis_and_serves_once_it_has_room(tmp_path):
    """A full noeviction Redis refuses RQ's own bookkeeping writes; stock RQ quits on the first
    such error (31-42 s into a full Redis, or at once when a job ends into it, as the chaos run
    found). rqrl's worker lives through a job that ends into a full Redis and serves the next one
    once it has room (RQ's idle-loop writes waited out: tests/unit/test_worker_full_redis.py)."""
    import queue as queue_mod
    import signal
    import subprocess

    from rq import Queue

    from common.rq_json import TaskSerializer
    from tests.conftest import rq_bin, worker_env

    with EmbeddedRedis() as server:
        conn = connect(server.url)
        proc = subprocess.Popen([rq_bin(), "worker", keys.COLLECTOR_QUEUE, "-w", "workers.worker.CollectorWorker"],
                                cwd=tmp_path, env=worker_env(server.url), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # RQ logs to stdout
        lines: queue_mod.SimpleQueue = queue_mod.SimpleQueue()
        threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout] + [lines.put(None)], daemon=True).start()
        seen: list[str] = []

        def until_line(marker: str) -> None:
            while True:
                line = lines.get(timeout=90)  # a hang guard only
                if line is None:
                    raise AssertionError(f"the worker exited ({proc.wait()}) before {marker!r}:\n" + "".join(seen[-80:]))
                seen.append(line)
                if marker in line:
                    return

        try:
            until_line("Listening on")
            queue = Queue(keys.COLLECTOR_QUEUE, connection=conn, serializer=TaskSerializer)
            # Full as a job ends (maxmemory 1 byte, noeviction): RQ's record of the end is refused.
            queue.enqueue_call("tests.fixtures.redis_jobs.fill_redis")
            until_line("ended while Redis is full")
            assert proc.poll() is None
            conn.config_set("maxmemory", 0)
            job = queue.enqueue_call("builtins.len", args=([1, 2, 3],))
            result = job.latest_result(timeout=60)
            assert result is not None and result.return_value == 3, "".join(seen[-20:])
            assert proc.poll() is None
        finally:
            conn.config_set("maxmemory", 0)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def test_a_transaction_refused_at_exec_by_a_full_redis_stops_the_run_naming_it(redis_exe, small_cfg, tmp_path,
                                                                              monkeypatch):
    """A MULTI whose commands were queued while Redis had room, and that is full by its EXEC, is
    refused whole (``EXECABORT ... OOM``: redis-py's ExecAbortError, not OutOfMemoryError; the
    chaos run's coordinator died on it with a traceback). The run stops naming the full Redis."""
    with EmbeddedRedis(exe=redis_exe) as server:
        conn = connect(server.url)
        c = Coordinator(EasyDict(copy.deepcopy(small_cfg)), conn, tmp_path, run_name="full")

        def loop():
            raw = conn.connection_pool.get_connection()
            try:
                for command in (("MULTI",), ("HSET", keys.commander(c.exp), "x", 1)):
                    raw.send_command(*command)
                    raw.read_response()
                conn.config_set("maxmemory", 1)  # full between the queueing and the EXEC
                raw.send_command("EXEC")
                raw.read_response()
            finally:
                conn.connection_pool.release(raw)

        monkeypatch.setattr(c, "_loop", loop)
        try:
            assert c.run() == 1
        finally:
            conn.config_set("maxmemory", 0)
        summary = json.loads((tmp_path / c.exp / "summary.json").read_text())
        assert summary["status"].startswith("Redis out of memory") and summary["exit_code"] == 1, summary


@pytest.mark.parametrize("limit,extra,named", [
    (["--maxclients", "20"], [], "Redis maxclients is 20; this run may open ~29 connections"),
    (["--proto-max-bulk-len", "1mb"], ["--set", "policy.model.hidden_size_list=[512, 512]"],
     "Redis proto-max-bulk-len is 1.0 MB (1048576 bytes); this run writes values of up to ~4.1 MB"),
])
def test_a_redis_whose_limits_the_run_cannot_fit_is_refused_naming_the_limit(tmp_path, redis_exe, limit, extra, named):
    import subprocess
    import sys

    from tests.conftest import REPO, worker_env

    with EmbeddedRedis(exe=redis_exe, extra_args=limit) as server:
        res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train",
                              str(REPO / "deploy" / "configs" / "cartpole_dqn.py"), "--redis-url", server.url,
                              "--dry-run", *extra], cwd=tmp_path, env=worker_env(server.url), capture_output=True,
                             text=True, timeout=120)
    assert res.returncode == 1 and named in res.stderr, res.stdout + res.stderr[-2000:]


def test_a_limit_hit_mid_run_is_the_stop_reason(redis_exe, small_cfg, tmp_path):
    """maxclients reached mid-run (a connection refused) stops the run naming it, and a task that
    failed on proto-max-bulk-len is fatal (a retry would fail the same way), naming it."""
    with EmbeddedRedis(exe=redis_exe, extra_args=["--proto-max-bulk-len", "1mb"]) as server:
        conn = connect(server.url)
        cfg = EasyDict(copy.deepcopy(small_cfg))
        cfg.commander.update(collector_task_space=2, max_wall_seconds=120)
        c = Coordinator(cfg, conn, tmp_path, run_name="r1")
        task = c.commander.get_learner_task()
        c.tasks.running[task["task_id"]] = {"task": task, "kind": "learner", "started": True}
        c.router.route({"type": "failed", "task_id": task["task_id"], "task_type": "learner",
                        "error": "ResponseError: Protocol error: invalid bulk length"})
        assert "Redis proto-max-bulk-len (1.0 MB, 1048576 bytes) is below a value this run writes" in c.router.fatal
        c.tb.close()

        c = Coordinator(cfg, conn, tmp_path, run_name="r2")
        conn.config_set("notify-keyspace-events", "Kh")
        sub = connect(server.url).pubsub()
        sub.subscribe(f"__keyspace@0__:{keys.commander(c.exp)}")

        def refuse_a_connection_once_running() -> None:
            for msg in sub.listen():
                if msg["type"] == "message":
                    conn.config_set("maxclients", int(conn.info("clients")["connected_clients"]))
                    # Connections the run closed meanwhile free slots: take them until one is refused.
                    held = []
                    try:
                        for _ in range(100):
                            extra = redis.Redis.from_url(server.url, socket_timeout=5)
                            extra.ping()  # raises once the max number of clients is reached
                            held.append(extra)
                    except redis.ConnectionError:
                        pass
                    finally:
                        conn.config_set("maxclients", 10000)
                        for extra in held:
                            extra.close()
                    return

        threading.Thread(target=refuse_a_connection_once_running, daemon=True).start()
        try:
            code = c.run()
        finally:
            sub.close()
        summary = json.loads((c.out / "summary.json").read_text())
        assert code == 1 and re.match(r"Redis refused \d+ connections: maxclients \d+ reached", summary["status"]), \
            summary["status"]


def test_rqs_abandoned_job_verdict_never_fails_a_task_whose_heartbeat_is_fresh(real_redis, redis_server, small_cfg,
                                                                              tmp_path):
    """A worker whose clock runs 2 h ahead runs RQ's abandoned-job cleanup: it finds a live task's
    job past its timeout and fires the job's failure callback. The coordinator keeps the task
    (its heartbeat is fresh); one whose heartbeat is gone is failed as before."""
    import signal
    import subprocess

    from rq.registry import StartedJobRegistry

    from common.rq_json import TaskSerializer
    from tests.conftest import rq_bin, wait_event, worker_env

    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(collector_task_space=1, eval_every_train_iter=0, eval_interval=0.0)
    c = Coordinator(cfg, real_redis, tmp_path, run_name="r1")
    c._claim()
    c._dispatch()  # a learner task (no learner worker: no policy is ever published) and a collector task
    worker = subprocess.Popen([rq_bin(), "worker", keys.COLLECTOR_QUEUE, "-w", "workers.worker.CollectorWorker"],
                              cwd=tmp_path, env=worker_env(redis_server.url), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        started = wait_event(real_redis, c.exp, lambda e: e["type"] == "started", timeout=60)
        tid = started["task_id"]  # running: waiting for the learner's first policy, heartbeat beating
        c._process_events(block_ms=100)
        assert c.tasks.running[tid]["started"]
        # What the skewed worker's maintenance does with the live task's job.
        StartedJobRegistry(keys.COLLECTOR_QUEUE, connection=real_redis, serializer=TaskSerializer).cleanup(
            timestamp=time.time() + 7200)
        verdict = wait_event(real_redis, c.exp, lambda e: e["type"] == "failed", timeout=30)
        assert verdict["source"] == "rq_on_failure" and verdict["task_id"] == tid
        c._process_events(block_ms=100)
        assert tid in c.tasks.running, "RQ's verdict overrode a fresh heartbeat"
        # The same verdict about a task whose heartbeat is gone fails it.
        real_redis.delete(keys.heartbeat(c.exp, tid))
        from common import events as events_mod

        events_mod.emit(real_redis, c.exp, "failed", tid, "collector", error="AbandonedJobError: ",
                        source="rq_on_failure")
        c._process_events(block_ms=100)
        assert tid not in c.tasks.running
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        c.ownership.release()
        c.tb.close()


def test_a_workers_clock_off_redis_is_named_and_run_times_use_one_clock(real_redis, small_cfg, tmp_path, caplog):
    """A worker 2 h ahead: its own log warns (events.emit compares its clock with the entry id
    Redis gives), the coordinator names it in its log and in rqrl status, and the eval record's
    time is the coordinator's, not the worker's."""
    import logging
    from unittest import mock

    from common import events as events_mod
    from coordinator.eval_log import eval_record
    from coordinator.status import collect_status, render

    exp = keys.namespace("skew_exp", "r1")
    real_t = time.time
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.exp_name = "skew_exp"
    c = Coordinator(cfg, real_redis, tmp_path, run_name="r1")
    c._claim()
    with mock.patch.object(events_mod.time, "time", lambda: real_t() + 7200), caplog.at_level(logging.WARNING):
        events_mod._skew_warned = False
        events_mod.emit(real_redis, exp, "started", "t1", "collector", worker="w-ahead", host="h", pid=1)
    assert "this machine's clock is +7200" in caplog.text
    c._process_events(block_ms=100)
    assert "worker w-ahead's clock is +7200" in caplog.text
    c._write_summary()
    assert "clocks off Redis's: w-ahead +7200.0 s" in render(collect_status(real_redis, exp))
    record = eval_record({"task_id": "t1", "ts": real_t() + 7200}, "run", 0, 1.0)
    assert abs(record.time - real_t()) < 60
    c.ownership.release()
    c.tb.close()


def test_a_connection_refused_while_the_run_starts_is_the_stop_reason(redis_exe, small_cfg, tmp_path):
    """Refusals are counted from before the claim: one while the run starts (here inside the
    claim) stops it naming maxclients, as one mid-run does (the loaded suite once missed a refusal
    that came before the count's start and ran to its wall budget)."""
    with EmbeddedRedis(exe=redis_exe) as server:
        conn = connect(server.url)
        cfg = EasyDict(copy.deepcopy(small_cfg))
        cfg.commander.update(collector_task_space=2, max_wall_seconds=20)  # the budget the fault would run to
        c = Coordinator(cfg, conn, tmp_path, run_name="r1")
        claim = c._claim

        def claim_with_a_refusal() -> None:
            conn.config_set("maxclients", int(conn.info("clients")["connected_clients"]))
            try:
                with pytest.raises(redis.ConnectionError):
                    for _ in range(100):  # slots freed meanwhile are taken until one is refused
                        redis.Redis.from_url(server.url, socket_timeout=5).ping()
            finally:
                conn.config_set("maxclients", 10000)
            claim()

        c._claim = claim_with_a_refusal
        code = c.run()
        summary = json.loads((c.out / "summary.json").read_text())
        assert code == 1 and re.match(r"Redis refused \d+ connections: maxclients \d+ reached", summary["status"]), \
            summary["status"]
