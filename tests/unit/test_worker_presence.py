"""Live workers are counted once each (common/worker_presence.py), on fakeredis.

An rqrl worker is in two registries at once: RQ's (``rq:workers:{queue}``, written at its birth)
and rqrl's own (``rqrl:workers:{queue}`` with its alive key). Counted in both, the coordinator
would see twice the collectors there are and size the collector task space for workers that do
not exist (their tasks wait in the queue).
"""

from __future__ import annotations

import fakeredis
import pytest
from rq import Queue, Worker

from common import keys, worker_presence
from coordinator.liveness import live_workers

Q = keys.COLLECTOR_QUEUE


@pytest.fixture
def conn():
    return fakeredis.FakeRedis()


def _rq_worker(conn, name: str) -> Worker:
    """A worker in RQ's registry of the collector queue, as ``rq worker`` registers itself."""
    worker = Worker([Q], name=name, connection=conn)
    worker.register_birth()
    return worker


def test_a_worker_in_both_registries_counts_once(conn):
    _rq_worker(conn, "both")
    worker_presence.refresh(conn, "both", [Q])
    assert conn.sismember(f"rq:workers:{Q}", "rq:worker:both")  # really in both
    assert conn.sismember(keys.workers_alive(Q), "both") and conn.exists(keys.worker_alive("both"))
    assert worker_presence.count_live(conn, Q) == 1
    assert live_workers(conn, Queue(Q, connection=conn)) == 1  # what the coordinator sizes its task space by


def test_each_worker_counts_once_whichever_registries_hold_it(conn):
    _rq_worker(conn, "both")
    worker_presence.refresh(conn, "both", [Q])
    _rq_worker(conn, "stock")  # a stock `rq worker`: RQ's registry only
    worker_presence.refresh(conn, "ours", [Q])  # RQ's registry lost it (a wiped Redis): rqrl's only
    Worker([keys.LEARNER_QUEUE], name="learner", connection=conn).register_birth()  # another queue
    assert worker_presence.count_live(conn, Q) == 3


def test_an_rqrl_worker_whose_alive_key_expired_is_not_counted_from_rqs_lingering_key(conn):
    """It died without ``register_death`` (a full Redis refused it): RQ's key of it lingers for minutes."""
    _rq_worker(conn, "both")
    worker_presence.refresh(conn, "both", [Q])
    conn.delete(keys.worker_alive("both"))  # its alive key expired: it stopped refreshing
    assert worker_presence.count_live(conn, Q) == 0
