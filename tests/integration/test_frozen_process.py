"""A frozen or cut-off process is fenced (issue 36, items 2 and 3): SIGSTOP a real task past the heartbeat timeout,
let the coordinator hand its task to a replacement, SIGCONT it: every late write it tries is
refused by its revoked lease, it drops the task with a log line, and its worker serves on.

Real coordinator, real ``rq worker`` processes, a private Redis; every wait is bounded by an
event (XREAD BLOCK on the events or buffer stream, pub/sub on the policy's updates channel).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import keys, streams
from tests.proxy import CuttableProxy
from tests.conftest import REPO, WORKER_CLASS, rq_bin, start_rq_workers, stop_run, wait_event, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(180)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
HEARTBEAT_S = 3


def _start(conn, url: str, exp: str, cwd: Path, queues: list[str], *sets: str) -> list[subprocess.Popen]:
    """The rq workers of ``queues`` (output in ``cwd/{exp}-{i}.log``), then the coordinator of run
    ``{exp}/r1``: one collector task at a time, no evals, a short heartbeat timeout."""
    env = worker_env(url)
    argvs = [[rq_bin(), "worker", q, "-w", WORKER_CLASS[q], "--name", f"{exp}-{i}"] for i, q in enumerate(queues)]
    procs = start_rq_workers(conn, argvs, env=env, cwd=cwd, stderr=subprocess.STDOUT,
                             stdout=open(cwd / f"{exp}-workers.log", "w"))
    overrides = [f"exp_name={exp}", "env.stop_value=100000", "commander.collector_task_space=1",
                 "commander.eval_task_space=0", "commander.eval_every_train_iter=0", "commander.eval_interval=0",
                 f"commander.heartbeat_timeout={HEARTBEAT_S}", "commander.max_wall_seconds=120", *sets]
    procs.append(subprocess.Popen([sys.executable, "-m", "coordinator", CONFIG, "--redis-url", url, "--run-name", "r1",
                                   *[a for s in overrides for a in ("--set", s)]],
                                  cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def _first_sending_collector(conn, ns: str) -> tuple[str, int, str, str]:
    """The run's first collector task once it has sent a chunk (mid-task): its id, pid, buffer id
    and the buffer's stream."""
    first = wait_event(conn, ns, lambda e: e["type"] == "started" and e["task_type"] == "collector", 60)
    tid = first["task_id"]
    buffer_id = _task(conn, ns, tid)["buffer_id"]
    stream = keys.buffer_meta(ns, buffer_id)
    _wait_chunk(conn, stream, tid, 60)
    return tid, int(first["pid"]), buffer_id, stream


def _task(conn, ns: str, tid: str) -> dict:
    return json.loads(conn.hget(keys.tasks(ns), tid))["task"]


def _wait_chunk(conn, stream: str, task_id: str, timeout: float) -> None:
    """Block on the buffer's stream until a chunk of ``task_id`` is on it."""
    last, deadline = b"0", time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, entries in conn.xread({stream: last}, block=500) or []:
            for eid, raw in entries:
                last = eid
                if streams.decode_fields(raw).get("task_id") == task_id:
                    return
    raise AssertionError(f"no chunk of task {task_id} on {stream} within {timeout} s")


def _chunks_of(conn, stream: str, task_id: str) -> int:
    return sum(streams.decode_fields(f).get("task_id") == task_id for _, f in conn.xrange(stream))


def _entry_id(eid: bytes) -> tuple[int, int]:
    ms, _, seq = eid.partition(b"-")
    return int(ms), int(seq)


def _accounting(conn, ns: str, buffer_id: str) -> dict[str, int]:
    """One consistent snapshot: the buffer's stats hash, its stream's length and the entries not
    acked yet (pending for a learner, or not delivered to one)."""
    meta = keys.buffer_meta(ns, buffer_id)
    pipe = conn.pipeline(transaction=True)
    pipe.hgetall(keys.buffer_stats(ns, buffer_id))
    pipe.xrange(meta)
    pipe.xinfo_groups(meta)
    stats_raw, entries, groups = pipe.execute()
    group = next(g for g in groups if g["name"].decode() == keys.LEARNER_GROUP)
    delivered = group["last-delivered-id"]
    undelivered = sum(1 for eid, _ in entries if _entry_id(eid) > _entry_id(delivered))
    stats = {k.decode(): int(v) for k, v in stats_raw.items()}
    return dict(stats, stream=len(entries), unacked=int(group["pending"]) + undelivered)


def _assert_balanced(acc: dict[str, int]) -> None:
    """Every chunk sent is on the stream once and counted once: acked under one status or not yet acked."""
    assert acc["produced"] == acc["stream"], acc
    assert acc.get("duplicate", 0) == 0 and acc.get("resent", 0) == 0, acc
    acked = sum(acc.get(s, 0) for s in ("consumed", "expired", "corrupt", "malformed", "trimmed"))
    assert acked + acc["unacked"] == acc["produced"], acc


def test_frozen_collector_is_fenced_and_its_worker_serves_on(real_redis, redis_server, tmp_path):
    conn, exp = real_redis, f"frozen_c_{os.getpid()}"
    ns = f"{exp}/r1"
    procs = _start(conn, redis_server.url, exp, tmp_path, ["learner", "collector", "collector"],
                   "policy.collect.collector.task_env_steps=3000")
    frozen = None
    try:
        tid, frozen, buffer_id, stream = _first_sending_collector(conn, ns)
        os.kill(frozen, signal.SIGSTOP)
        # One collector task at a time: a second one starts only once the first was declared dead.
        repl = wait_event(conn, ns, lambda e: e["type"] == "started" and e["task_type"] == "collector"
                          and e["task_id"] != tid, 30)
        assert not conn.hexists(keys.tasks(ns), tid) and not conn.exists(keys.lease(ns, tid))
        sent = _chunks_of(conn, stream, tid)

        os.kill(frozen, signal.SIGCONT)  # it resumes mid-task and tries its next chunk send
        failed = wait_event(conn, ns, lambda e: e["type"] == "failed" and e["task_id"] == tid
                            and e.get("source") != "rq_on_failure", 30)
        assert "LeaseRevoked" in failed["error"] and keys.lease(ns, tid) in failed["error"], failed
        assert _chunks_of(conn, stream, tid) == sent, "a chunk of the revoked task was accepted"
        log = (tmp_path / f"{exp}-workers.log").read_text()
        assert f"task {tid} dropped" in log, log[-3000:]
        # The worker that was frozen takes a later task of the run.
        later = wait_event(conn, ns, lambda e: e["type"] == "started" and e["task_type"] == "collector"
                           and int(e["pid"]) == frozen and e["task_id"] != tid, 60)
        assert later["task_id"] != repl["task_id"]
        _wait_chunk(conn, stream, later["task_id"], 30)
        _assert_balanced(_accounting(conn, ns, buffer_id))
    finally:
        stop_run(conn, ns, procs, frozen)


def _chunks_during(conn, stream: str, task_id: str, until: float) -> int:
    """Block on the buffer's stream until the monotonic time ``until``; the chunks of ``task_id``
    that arrived meanwhile."""
    last, got = "$", 0
    while (left := until - time.monotonic()) > 0:
        for _, entries in conn.xread({stream: last}, block=max(1, int(min(left, 1.0) * 1000))) or []:
            last = entries[-1][0]
            got += sum(streams.decode_fields(raw).get("task_id") == task_id for _, raw in entries)
    return got


def _pending_for(conn, stream: str, consumer: str) -> int:
    """Entries of ``stream`` delivered to learner ``consumer`` and not acked."""
    summary = conn.xpending(stream, keys.LEARNER_GROUP)
    return sum(int(c["pending"]) for c in summary["consumers"] if c["name"].decode() == consumer)


def _versions(sub, until, timeout: float) -> list[int]:
    """Policy versions announced on ``sub`` until ``until(versions)`` holds."""
    got: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = sub.get_message(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
        if msg is not None and msg["type"] == "message":
            got.append(int(msg["data"].split()[0]))
            if until(got):
                return got
    raise AssertionError(f"policy versions {got[-20:]} never met the condition within {timeout} s")


def test_frozen_learner_is_fenced_and_versions_never_interleave(real_redis, redis_server, tmp_path):
    conn, exp = real_redis, f"frozen_l_{os.getpid()}"
    ns = f"{exp}/r1"
    procs = _start(conn, redis_server.url, exp, tmp_path, ["learner", "learner", "collector"],
                   "policy.learn.learner.hook.save_ckpt_after_iter=100")
    frozen, sub = None, conn.pubsub(ignore_subscribe_messages=True)
    try:
        first = wait_event(conn, ns, lambda e: e["type"] == "started" and e["task_type"] == "learner", 60)
        tid, frozen = first["task_id"], int(first["pid"])
        task = _task(conn, ns, tid)
        sub.subscribe(keys.policy_updates(ns, task["policy_id"]))
        ckpt = keys.ckpt(ns, task.get("ckpt_name") or "latest")
        # 40-80 train iters past a checkpoint (one every 100): the replacement starts well behind.
        _versions(sub, lambda v: conn.exists(ckpt) and 40 <= v[-1] - int(conn.hget(ckpt, "train_iter")) < 80, 60)
        os.kill(frozen, signal.SIGSTOP)
        resumed_at = int(conn.hget(ckpt, "train_iter"))
        while sub.get_message(timeout=0.2) is not None:  # what it announced before the stop
            pass
        last_old = int(conn.hget(keys.policy(ns, task["policy_id"]), "version"))
        repl = wait_event(conn, ns, lambda e: e["type"] == "started" and e["task_type"] == "learner"
                          and e["task_id"] != tid, 30)
        new = _versions(sub, lambda v: True, 60)  # the replacement's first publication
        assert new == [resumed_at] and resumed_at < last_old, (new, resumed_at, last_old)

        os.kill(frozen, signal.SIGCONT)  # it resumes mid-iteration: its next ack or publish is refused
        failed = wait_event(conn, ns, lambda e: e["type"] == "failed" and e["task_id"] == tid
                            and e.get("source") != "rq_on_failure", 30)
        assert "LeaseRevoked" in failed["error"], failed
        # Its emergency checkpoint (learner.start's, on the way out) was refused too.
        lines = [streams.decode_fields(f).get("lines", "") for _, f in conn.xrange(keys.events(ns))
                 if streams.decode_fields(f)["task_id"] == tid]
        assert any("emergency checkpoint failed" in s and "revoked" in s for s in lines), lines[-5:]
        # The replacement carries on past where the frozen one stood; what collectors saw since its
        # first publication is its own rising sequence, never a version of the frozen learner.
        new += _versions(sub, lambda v: v[-1] > last_old + 8, 60)
        assert all(a < b for a, b in zip(new, new[1:])), new
        log = (tmp_path / f"{exp}-workers.log").read_text()
        assert f"task {tid} dropped" in log, log[-3000:]
        # Chunks it read after the replacement's start are not lost: the replacement claims them.
        stream = keys.buffer_meta(ns, task["buffer_id"])
        if _pending_for(conn, stream, tid):
            wait_event(conn, ns, lambda e: e["type"] == "log" and e["task_id"] == repl["task_id"]
                       and "frozen past this learner's start" in e["lines"], 30)
        assert _pending_for(conn, stream, tid) == 0
        acc = _accounting(conn, ns, task["buffer_id"])
        assert acc["produced"] == acc["stream"] and acc.get("duplicate", 0) == 0, acc
    finally:
        sub.close()
        stop_run(conn, ns, procs, frozen)


CUT_S = 20


def test_collector_cut_off_from_redis_for_20_s_drops_its_task_cleanly(real_redis, redis_server, tmp_path):
    """Issue 36 item 3: one collector's connection to Redis blackholed for 20 s (its machine
    partitioned) past the heartbeat timeout: its task goes to a replacement; at the heal the cut-off
    collector's late writes are refused by lease, it drops the task, its worker serves on, and no
    chunk is counted twice."""
    conn, exp = real_redis, f"cut_c_{os.getpid()}"
    ns = f"{exp}/r1"
    proxy = CuttableProxy(("127.0.0.1", redis_server.port))
    log = open(tmp_path / f"{exp}-cut.log", "w")
    procs = start_rq_workers(conn, [[rq_bin(), "worker", "collector", "-w", WORKER_CLASS["collector"],
                                     "--url", proxy.url(), "--name", f"{exp}-cut"]],
                             env=worker_env(proxy.url()), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    procs += _start(conn, redis_server.url, exp, tmp_path, ["learner"], "policy.collect.collector.task_env_steps=3000")
    try:
        tid, cut_pid, buffer_id, stream = _first_sending_collector(conn, ns)
        proxy.cut()
        cut_at = time.monotonic()
        # A directly connected collector takes the replacement once the task is declared dead.
        procs += start_rq_workers(conn, [[rq_bin(), "worker", "collector", "-w", WORKER_CLASS["collector"],
                                          "--name", f"{exp}-direct"]],
                                  env=worker_env(redis_server.url), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
        repl = wait_event(conn, ns, lambda e: e["type"] == "started" and e["task_type"] == "collector"
                          and e["task_id"] != tid, 30)
        assert int(repl["pid"]) != cut_pid and not conn.exists(keys.lease(ns, tid))
        sent = _chunks_of(conn, stream, tid)
        # The run carries on without it for the whole cut: the replacement's chunks arrive meanwhile.
        assert _chunks_during(conn, stream, repl["task_id"], cut_at + CUT_S) > 0
        proxy.heal()

        failed = wait_event(conn, ns, lambda e: e["type"] == "failed" and e["task_id"] == tid
                            and e.get("source") != "rq_on_failure", 60)
        assert "LeaseRevoked" in failed["error"], failed
        assert _chunks_of(conn, stream, tid) == sent, "a chunk of the revoked task was accepted"
        log.flush()
        assert f"task {tid} dropped" in (tmp_path / f"{exp}-cut.log").read_text()
        later = wait_event(conn, ns, lambda e: e["type"] == "started" and e["task_type"] == "collector"
                           and int(e["pid"]) == cut_pid and e["task_id"] != tid, 90)
        _wait_chunk(conn, stream, later["task_id"], 30)  # the healed worker serves the run again
        _assert_balanced(_accounting(conn, ns, buffer_id))
    finally:
        proxy.heal()
        stop_run(conn, ns, procs)
        proxy.close()

