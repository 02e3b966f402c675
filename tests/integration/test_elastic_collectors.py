"""Elastic collectors: the collector task space follows the live ``rq worker collector`` processes.

Real coordinator, real ``rq worker`` processes (CollectorWorker, PreloadWorker), real Redis, no cap
(``commander.collector_task_space`` unset) and the eval slot on (``eval_task_space=1``). The run
starts with two collector workers: one trains, one is kept free for evals. Two more join
mid-run: three training tasks then run at once, and evals still find a free worker. One worker
leaves (RQ's warm shutdown): the space shrinks to two and its slot is not refilled.

Concurrency is read from the events stream (``started`` / ``finished`` of non-eval collector
tasks), the coordinator's view from ``rqrl:{exp}:commander`` (``collector_workers``,
``collector_task_space``) and ``rqrl:{exp}:tasks``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from rq import Queue, Worker

from common import keys, streams
from tests.conftest import REPO, WORKER_CLASS, rq_bin, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(180)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


class Running:
    """Training (non-eval) collector tasks running now, followed on the events stream (XREAD BLOCK)."""

    def __init__(self, conn, exp: str) -> None:
        self.conn, self.stream, self.last = conn, keys.events(exp), b"0"
        self.training: set[str] = set()
        self.evals_started = 0
        self.peak = 0  # most training tasks at once since the last reset_peak()
        # When set: the training tasks the coordinator holds. A task it no longer holds is not
        # running in its space, whether or not its end event was read (the one way seen, once,
        # for the peak to count a task past its end).
        self.held = None
        self.forgotten: set[str] = set()
        self.at_peak: tuple = ()  # the tasks counted at the peak and the event that made it

    def reset_peak(self) -> None:
        self._prune()
        self.peak = len(self.training)

    def _prune(self) -> None:
        if self.held is not None:
            gone = self.training - self.held()
            self.forgotten |= gone
            self.training -= gone

    def read(self, block_ms: int = 500) -> None:
        for _, entries in self.conn.xread({self.stream: self.last}, block=block_ms) or []:
            for eid, raw in entries:
                self.last = eid
                ev = streams.decode_fields(raw)
                if ev.get("task_type") != "collector":
                    continue
                if ev["type"] == "started" and ev.get("eval_flag") is True:
                    self.evals_started += 1
                elif ev["type"] == "started":
                    self.training.add(ev["task_id"])
                    self._prune()
                    if len(self.training) > self.peak:
                        self.peak, self.at_peak = len(self.training), (sorted(self.training), eid)
                elif ev["type"] in ("finished", "failed"):
                    self.training.discard(ev["task_id"])

    def until(self, pred, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
            self.read()


def summary(conn, exp: str) -> dict:
    return streams.decode_fields(conn.hgetall(keys.commander(exp)))


def training_held(conn, exp: str) -> set[str]:
    """The training collector tasks the coordinator holds (queued or running)."""
    recs = [json.loads(v) for v in conn.hvals(keys.tasks(exp))]
    return {r["task"]["task_id"] for r in recs if r["kind"] == "collector" and not r["task"].get("eval_flag")}


def _history(conn, exp: str) -> list[tuple]:
    """The collector tasks' events so far, (entry id, type, task id, eval flag, worker), for a failure message."""
    return [(eid.decode(), ev["type"], ev.get("task_id"), ev.get("eval_flag"), ev.get("worker"))
            for eid, raw in conn.xrange(keys.events(exp))
            for ev in [streams.decode_fields(raw)] if ev.get("task_type") == "collector"]


def queued_or_running_training(conn, exp: str) -> int:
    return len(training_held(conn, exp))


def test_task_space_follows_collector_workers(real_redis, redis_server, tmp_path):
    conn, url = real_redis, redis_server.url
    exp = f"elastic_{os.getpid()}"
    ns = keys.namespace(exp, "r")  # the run's key namespace (--run-name r)
    env = worker_env(url)
    procs: dict[str, subprocess.Popen] = {}

    def worker(name: str, queue: str) -> None:
        procs[name] = subprocess.Popen([rq_bin(), "worker", queue, "-w", WORKER_CLASS[queue],
                                        "--name", f"{exp}-{name}"], cwd=tmp_path, env=env,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    procs["coordinator"] = subprocess.Popen(
        [sys.executable, "-m", "coordinator", CONFIG, "--redis-url", url, "--run-name", "r", "--set", f"exp_name={exp}",
         "--set", "env.stop_value=100000", "--set", "commander.eval_every_train_iter=100",
         "--set", "commander.max_wall_seconds=150", "--set", "policy.collect.collector.task_env_steps=200"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for name, queue in (("learner", "learner"), ("c0", "collector"), ("c1", "collector")):
        worker(name, queue)
    collector_queue = Queue(keys.COLLECTOR_QUEUE, connection=conn)
    run = Running(conn, ns)
    # A task the coordinator no longer holds is not running, even before its end event is read
    # (the 6.2 tier once counted four at once on three slots that way).
    run.held = lambda: training_held(conn, ns)
    try:
        # Two workers: one trains, one is kept free for evals.
        run.until(lambda: summary(conn, ns).get("collector_workers") == 2 and run.training, 60,
                  "a training task on the first two workers")
        assert summary(conn, ns)["collector_task_space"] == 1  # written with collector_workers
        run.until(lambda: run.evals_started >= 1, 30, "an eval on the spare worker")
        assert run.peak == 1, "one training task at a time on two workers (one kept for evals)"
        # Two more join mid-run.
        worker("c2", "collector")
        worker("c3", "collector")
        deadline = time.monotonic() + 60
        while Worker.count(queue=collector_queue) < 4:
            assert time.monotonic() < deadline, "the two new rq workers did not register"
            time.sleep(0.05)  # RQ's registry has no blocking read
        # The wait is a hang guard; how fast the coordinator reacts is tests/bench's business.
        run.until(lambda: run.peak >= 3, 60, "three training tasks at once after two workers joined")
        run.until(lambda: summary(conn, ns)["collector_task_space"] == 3, 30, "the summary (written every second)")
        evals = run.evals_started
        run.until(lambda: run.evals_started > evals, 30, "an eval while three training tasks run")
        # (A worker of an earlier test still registered on the suite's Redis counts as a fifth: the
        # data-shard tests kill their runs' leftovers for that reason.)
        assert run.peak == 3, f"never more training tasks than workers but one: {run.at_peak}, {_history(conn, ns)}"
        # One leaves (warm shutdown: it finishes its task, then leaves RQ's registry).
        procs["c3"].send_signal(signal.SIGTERM)
        procs["c3"].wait(timeout=60)
        run.until(lambda: summary(conn, ns).get("collector_workers") == 3, 30, "the coordinator sees three workers")
        assert summary(conn, ns)["collector_task_space"] == 2
        # Its slot is not refilled: the tasks the coordinator holds drain to two, then stay there.
        run.until(lambda: queued_or_running_training(conn, ns) <= 2 and len(run.training) <= 2, 30,
                  "the freed slot stays free")
        run.reset_peak()
        end = time.monotonic() + 3
        while time.monotonic() < end:
            run.read(block_ms=250)
            assert queued_or_running_training(conn, ns) <= 2
        assert run.peak <= 2, (run.training, run.forgotten)
        assert procs["coordinator"].poll() is None
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
