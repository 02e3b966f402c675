"""rqrl's worker classes wait out a full Redis in RQ's own loop (workers/worker.py): unit tests of
the waits that the real-process test (tests/integration/test_redis_faults.py) cannot reach quickly."""

from __future__ import annotations

import pytest
import redis
from rq.worker import base

from workers import worker as worker_mod

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

    monkeypatch.setattr(base, "is_suspended", is_suspended)
    worker.check_for_suspension(False)
    assert len(calls) == 3


def test_other_redis_errors_still_end_the_worker(worker, monkeypatch):
    def is_suspended(conn, wk=None):
        raise redis.exceptions.ExecAbortError("Transaction discarded because of: unknown command 'X'")

    monkeypatch.setattr(base, "is_suspended", is_suspended)
    with pytest.raises(redis.exceptions.ExecAbortError):
        worker.check_for_suspension(False)
    assert worker_mod.redis_full(redis.exceptions.OutOfMemoryError("OOM command not allowed"))
