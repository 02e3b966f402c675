"""coordinator/event_reader.py: a restarted coordinator takes over the events its predecessor
read but never acked, and nothing else."""

from __future__ import annotations

import logging

from common import keys, streams
from coordinator.event_reader import EventReader


def test_reclaim_yields_the_unacked_events_of_a_dead_coordinator(fake_redis):
    exp = "cp/r1"
    old = EventReader(fake_redis, exp, "coordinator-old", logging.getLogger("test"))
    old.ensure_group()
    ids = [streams.add(fake_redis, keys.events(exp), {"type": "started", "task_id": f"t{i}"}) for i in range(3)]
    got = old.read(block_ms=1)
    assert [e for e, _ in got] == ids
    pipe = fake_redis.pipeline(transaction=True)
    old.ack(pipe, got[:1])  # the first was acked with its state, the other two not: the process died
    pipe.execute()
    new = EventReader(fake_redis, exp, "coordinator-new", logging.getLogger("test"))
    (batch,) = list(new.reclaim())
    assert [e for e, _ in batch] == ids[1:]
    pipe = fake_redis.pipeline(transaction=True)
    new.ack(pipe, batch)
    pipe.execute()
    assert list(new.reclaim()) == [] and new.last_id == ids[-1].decode()
