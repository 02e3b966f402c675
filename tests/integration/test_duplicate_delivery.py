"""Chunk delivery is idempotent by data_id, on a real private redis-server.

The Redis client retries a command after a connection error or timeout; when only the reply
was lost, the chunk script runs twice. Neither the retried send nor a second stream entry for
one ``data_id`` may give the learner a second trainable copy.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import redis

from common import keys, serialization, streams
from workers.comm_collector import RedisCommCollector
from workers.comm_learner import BufferReader
from workers.replay_buffer import ReplayBuffer

pytestmark = [pytest.mark.redis_server, pytest.mark.every_redis]

EXP = "dup_exp"
BUF = "buffer_dup"
OBS = 4
SCHEMA = {
    "obs": ((OBS,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
    "next_obs": ((OBS,), np.float32), "done": ((), np.bool_), "discount": ((), np.float32),
}
LEARNER = "learner_task_dup"
COLLECTOR = "collector_task_dup"
STATS = keys.buffer_stats(EXP, BUF)


def chunk(n: int, tag: float) -> dict[str, np.ndarray]:
    return {"obs": np.full((n, OBS), tag, np.float32), "action": np.zeros(n, np.int64),
            "reward": np.full(n, tag, np.float32), "next_obs": np.full((n, OBS), tag, np.float32),
            "done": np.zeros(n, bool), "discount": np.full(n, 0.99, np.float32)}


def reader_on(conn: redis.Redis) -> tuple[BufferReader, ReplayBuffer]:
    conn.set(keys.lease(EXP, LEARNER), "1")
    buf = ReplayBuffer(1000, SCHEMA)
    return BufferReader(conn, EXP, BUF, LEARNER, buf, logging.getLogger("dup"), lambda: None,
                        keys.lease(EXP, LEARNER)), buf


def read_all(conn: redis.Redis) -> list:
    return streams.read_group(conn, keys.buffer_meta(EXP, BUF), keys.LEARNER_GROUP, LEARNER, 100, 10)


def stats(conn: redis.Redis) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in conn.hgetall(STATS).items()}


def add_entry(conn: redis.Redis, data_id: str, n: int) -> None:
    streams.add(conn, keys.buffer_meta(EXP, BUF), {"data_id": data_id, "n_samples": n, "env_steps": n, "policy_version": 0})


@pytest.mark.parametrize("same_batch", [True, False], ids=["one-batch", "two-batches"])
def test_two_entries_one_data_id_insert_once(real_redis, same_batch):
    reader, buf = reader_on(real_redis)
    real_redis.set(keys.data(EXP, "c_1"), serialization.dumps(chunk(5, 1.0)), ex=600)
    add_entry(real_redis, "c_1", 5)
    if not same_batch:
        reader._consume(read_all(real_redis))
    add_entry(real_redis, "c_1", 5)
    reader._consume(read_all(real_redis))
    assert len(buf) == 5 and buf.pushed == 5
    assert reader.chunks == 1 and reader.duplicates == 1 and reader.env_steps == 5
    assert stats(real_redis) == {"consumed": 1, "env_steps": 5, "duplicate": 1}
    assert real_redis.xpending(keys.buffer_meta(EXP, BUF), keys.LEARNER_GROUP)["pending"] == 0


def make_collector(conn: redis.Redis) -> RedisCommCollector:
    conn.set(keys.lease(EXP, COLLECTOR), "1")
    task = {"exp_name": EXP, "task_id": COLLECTOR, "buffer_id": BUF, "policy_id": "policy_dup", "eval_flag": False}
    return RedisCommCollector(conn, task, data_ttl_s=600)


def stage(comm: RedisCommCollector, data_id: str, n: int) -> None:
    comm.send_stepdata(data_id, chunk(n, 2.0))
    comm.send_metadata({"data_id": data_id, "policy_version": 0, "n_samples": n, "env_steps": n})


@pytest.mark.parametrize("consumed_before_retry", [False, True], ids=["retry-first", "consumed-first"])
def test_retried_send_after_lost_reply_delivers_once(real_redis, monkeypatch, consumed_before_retry):
    """The chunk's pipeline ran but its replies were lost: redis-py's Retry sends it again on a new connection."""
    reader, buf = reader_on(real_redis)
    comm = make_collector(real_redis)
    stage(comm, "c_retry", 6)
    real_parse = redis.client.Pipeline.parse_response
    lost = []

    def lose_first_exec_reply(pipe, connection, command_name, **options):
        reply = real_parse(pipe, connection, command_name, **options)
        if isinstance(reply, list) and not lost:  # the script's reply (the staged SET answers OK)
            lost.append(reply)
            if consumed_before_retry:  # the learner takes the chunk before the client retries
                side = redis.Redis(connection_pool=redis.ConnectionPool(**real_redis.connection_pool.connection_kwargs))
                reader._conn = side
                reader._consume(read_all(side))
            raise redis.ConnectionError("reply lost (test)")
        return reply

    monkeypatch.setattr(redis.client.Pipeline, "parse_response", lose_first_exec_reply)
    comm.flush(max_wait_s=1)
    assert lost, "the transaction's reply was never intercepted"
    monkeypatch.undo()
    reader._conn = real_redis
    reader._consume(read_all(real_redis))
    assert real_redis.xlen(keys.buffer_meta(EXP, BUF)) == 1
    assert int(real_redis.get(keys.envstep(EXP))) == 6
    assert len(buf) == 6 and reader.chunks == 1 and reader.env_steps == 6
    s = stats(real_redis)
    assert (s["produced"], s["resent"], s["consumed"], s["env_steps"]) == (1, 1, 1, 6)


def test_distinct_chunks_still_all_delivered(real_redis):
    reader, buf = reader_on(real_redis)
    comm = make_collector(real_redis)
    for i in range(3):
        stage(comm, f"c_{i}", 4)
        comm.flush(max_wait_s=1)
    reader._consume(read_all(real_redis))
    assert len(buf) == 12 and reader.chunks == 3 and reader.duplicates == 0
    assert int(real_redis.get(keys.envstep(EXP))) == 12
    assert stats(real_redis)["produced"] == 3 and "resent" not in stats(real_redis)


def test_orphans_trimmed_from_the_stream_are_counted_once_on_every_redis(real_redis):
    """A dead learner's unacked entries whose stream entries were trimmed (MAXLEN) meanwhile: Redis
    7 drops them from the pending list when XAUTOCLAIM meets them, 6.2 keeps them pending for ever
    and answers nil; either way the next learner acks them and counts them as ``trimmed`` once."""
    stream = keys.buffer_meta(EXP, BUF)
    real_redis.set(keys.lease(EXP, LEARNER), "1")
    streams.ensure_group(real_redis, stream, keys.LEARNER_GROUP)
    for i in range(4):
        real_redis.set(keys.data(EXP, f"c_{i}"), serialization.dumps(chunk(3, float(i))), ex=600)
        add_entry(real_redis, f"c_{i}", 3)
    dead = streams.read_group(real_redis, stream, keys.LEARNER_GROUP, "learner_task_dead", 100, 10)
    assert len(dead) == 4
    real_redis.xtrim(stream, maxlen=1, approximate=False)  # the first three entries are gone
    reader, buf = reader_on(real_redis)
    reader._claim_orphans()
    assert len(buf) == 3 and reader.chunks == 1 and reader.trimmed == 3
    assert real_redis.xpending(stream, keys.LEARNER_GROUP)["pending"] == 0
    assert stats(real_redis) == {"consumed": 1, "env_steps": 3, "trimmed": 3}
    reader._claim_orphans()  # a second pass finds nothing more to count
    assert stats(real_redis)["trimmed"] == 3 and reader.trimmed == 3


@pytest.mark.parametrize("lost", ["delivery", "ack"])
def test_chunks_whose_acks_a_failover_lost_are_counted_again_but_not_inserted(real_redis, monkeypatch, lost):
    """A failover to a replica that lacked the reader's last writes: either the deliveries too
    (the group's last-delivered id went back, so ``>`` hands the entries out again) or only the
    acks (the entries are still pending for this consumer). Built here on one server by putting
    back what the replica would hold: the blobs (not tombstones), the stream's group state and
    the stats of before the acks. The reader must count each chunk once on the "new primary" and
    insert none of them a second time."""
    import workers.comm_learner as comm_learner

    stream = keys.buffer_meta(EXP, BUF)
    reader, buf = reader_on(real_redis)
    blobs = {f"c_{i}": serialization.dumps(chunk(4, float(i))) for i in range(3)}
    for data_id, blob in blobs.items():
        real_redis.set(keys.data(EXP, data_id), blob, ex=600)
        add_entry(real_redis, data_id, 4)
    reader._consume(read_all(real_redis))
    assert len(buf) == 12 and stats(real_redis) == {"consumed": 3, "env_steps": 12}
    # The replica's view: blobs whole, nothing consumed; delivered (pending) or not delivered at all.
    for data_id, blob in blobs.items():
        real_redis.set(keys.data(EXP, data_id), blob, ex=600)
    real_redis.delete(STATS)
    real_redis.xgroup_setid(stream, keys.LEARNER_GROUP, "0")
    if lost == "ack":
        assert len(read_all(real_redis)) == 3  # delivered to this consumer again, never acked
    monkeypatch.setattr(comm_learner, "primary_changes",
                        lambda conn: [{"time": 0.0, "from": "127.0.0.1:1", "to": "127.0.0.1:2"}])
    healed = []
    reader._on_failover = lambda: healed.append(True)
    reader._after_failover()
    reader._consume(read_all(real_redis))
    assert healed == [True]
    assert len(buf) == 12 and buf.pushed == 12 and reader.chunks == 3  # no second insert
    assert reader.redelivered == 3 and reader.duplicates == 0
    assert stats(real_redis) == {"consumed": 3, "env_steps": 12}  # counted once on the new primary
    assert real_redis.xpending(stream, keys.LEARNER_GROUP)["pending"] == 0
    assert all(real_redis.get(keys.data(EXP, d)) == b"" for d in blobs)  # tombstones again
