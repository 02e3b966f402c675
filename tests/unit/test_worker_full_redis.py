"""rqrl's worker classes wait out a full Redis in RQ's own loop (workers/worker.py): unit tests of
the waits that the real-process test (tests/integration/test_redis_faults.py) cannot reach quickly."""

from __future__ import annotations

import sys

import pytest
import redis
from rq.worker import Worker

from workers import worker as worker_mod

# Where RQ defines its worker loop (rq.worker or rq.worker.base, by rq version): is_suspended is
# looked up there.
RQ_WORKER_MODULE = sys.modules[Worker.check_for_suspension.__module__]


def rq_class_defining(worker, method: str) -> type:
    return next(c for c in type(worker).__mro__ if method in vars(c) and c.__module__.startswith("rq"))

OOM_ABORT = "Transaction discarded because of: OOM command not allowed when used memory > 'maxmemory'."


@pytest.fixture
def worker(fake_redis, monkeypatch):
    monkeypatch.setattr(worker_mod, "_FULL_REDIS_RETRY_S", 0.01)
    return worker_mod.CollectorWorker(["collector"], connection=fake_redis)


def test_rqs_suspension_check_aborted_by_a_full_redis_is_waited_out(worker, monkeypatch):
    """RQ's suspension check writes its heartbeat in a MULTI/EXEC; a full Redis aborts it whole
    (ExecAbortError, not OutOfMemoryError) and stock RQ quits (the chaos run's dead collector)."""
    calls = []

    def is_suspended(conn, wk=None):
        calls.append(1)
        if len(calls) < 3:
            raise redis.exceptions.ExecAbortError(OOM_ABORT)
        return False

    monkeypatch.setattr(RQ_WORKER_MODULE, "is_suspended", is_suspended)
    worker.check_for_suspension(False)
    assert len(calls) == 3


def test_other_redis_errors_still_end_the_worker(worker, monkeypatch):
    def is_suspended(conn, wk=None):
        raise redis.exceptions.ExecAbortError("Transaction discarded because of: unknown command 'X'")

    monkeypatch.setattr(RQ_WORKER_MODULE, "is_suspended", is_suspended)
    with pytest.raises(redis.exceptions.ExecAbortError):
        worker.check_for_suspension(False)


@pytest.mark.parametrize("method", ["dequeue_job_and_maintain_ttl", "heartbeat", "run_maintenance_tasks"])
def test_rqs_idle_loop_writes_refused_by_a_full_redis_are_tried_again(worker, monkeypatch, method):
    """Stock RQ quits 31-42 s into a full Redis (its idle loop's writes raise once the client's
    retries run out); rqrl's worker tries them again until Redis has room, then goes on."""
    calls = []

    def refused_twice(self, *args, **kwargs):
        calls.append(1)
        if len(calls) < 3:
            raise redis.exceptions.OutOfMemoryError("OOM command not allowed when used memory > 'maxmemory'.")
        return "done"

    monkeypatch.setattr(rq_class_defining(worker, method), method, refused_twice)
    assert getattr(worker, method)() == "done" and len(calls) == 3
