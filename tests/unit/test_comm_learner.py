"""Unit tests with fakeredis: the BufferReader (workers/comm_learner.py), policy publication
(workers/publication.py) and checkpoint I/O (workers/checkpoints.py)."""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import torch

from common import blobstore, keys, serialization, streams
from workers.checkpoints import load_checkpoint, save_checkpoint
from workers.comm_learner import BufferReader
from workers.publication import publish_policy
from workers.replay_buffer import ReplayBuffer

EXP = "test_exp"
BUF = "buffer_abc"
OBS = 4
# The schema workers/learner.py _run_learner builds.
SCHEMA = {
    "obs": ((OBS,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
    "next_obs": ((OBS,), np.float32), "done": ((), np.bool_), "discount": ((), np.float32),
}
LOG = logging.getLogger("test_comm_learner")




def make_chunk(n, tag):
    """n rows; reward == tag everywhere so inserted rows can be traced back to their chunk."""
    return {
        "obs": np.full((n, OBS), tag, np.float32),
        "action": np.arange(n, dtype=np.int64) % 2,
        "reward": np.full(n, tag, np.float32),
        "next_obs": np.full((n, OBS), tag + 0.5, np.float32),
        "done": np.zeros(n, bool),
        "discount": np.full(n, 0.9 ** 3, np.float32),
    }


def send(conn, data_id, blob, n_samples=8, env_steps=8, **extra):
    """What a collector does: SET the blob, XADD the metadata."""
    if blob is not None:
        conn.set(keys.data(EXP, data_id), blob, ex=600)
    fields = {"data_id": data_id, "n_samples": n_samples, "env_steps": env_steps, "policy_version": 0, **extra}
    return streams.add(conn, keys.buffer_meta(EXP, BUF), fields)


TASK = "learner_task_1"
LEASE = keys.lease(EXP, TASK)
STATS = keys.buffer_stats(EXP, BUF)


def make_reader(conn, capacity=1000, on_data=None, consumer=TASK, grant_lease=True, **kw):
    if grant_lease:
        conn.set(keys.lease(EXP, consumer), "1")
    buf = ReplayBuffer(capacity, SCHEMA)
    calls = []
    reader = BufferReader(conn, EXP, BUF, consumer, buf, LOG, on_data or (lambda: calls.append(1)),
                          keys.lease(EXP, consumer), **kw)
    return reader, buf, calls


def read_all(conn, consumer=TASK):
    return streams.read_group(conn, keys.buffer_meta(EXP, BUF), keys.LEARNER_GROUP, consumer, 100, 10)


def pending(conn):
    return conn.xpending(keys.buffer_meta(EXP, BUF), keys.LEARNER_GROUP)["pending"]


def stats(conn):
    return {k.decode(): int(v) for k, v in conn.hgetall(STATS).items()}


def rewards_in(buf):
    return set(buf.sample(2000, np.random.default_rng(0))["reward"].tolist())


def counters(reader):
    return {"chunks": reader.chunks, "expired": reader.expired, "corrupt": reader.corrupt,
            "malformed": reader.malformed, "duplicates": reader.duplicates}


# ---------------------------------------------------------------- BufferReader._consume

def test_reader_creates_group(fake_redis):
    make_reader(fake_redis)
    groups = fake_redis.xinfo_groups(keys.buffer_meta(EXP, BUF))
    assert [g["name"] for g in groups] == [keys.LEARNER_GROUP.encode()]


def test_good_chunk_inserted_once_acked_and_emptied(fake_redis):
    reader, buf, calls = make_reader(fake_redis)
    send(fake_redis, "collector_task_x_0001", serialization.dumps(make_chunk(8, 1.0)), n_samples=8, env_steps=10)
    entries = read_all(fake_redis)
    assert len(entries) == 1 and pending(fake_redis) == 1
    reader._consume(entries)
    assert len(buf) == 8 and buf.pushed == 8
    assert reader.env_steps == 10
    assert counters(reader) == {"chunks": 1, "expired": 0, "corrupt": 0, "malformed": 0, "duplicates": 0}
    assert pending(fake_redis) == 0
    assert fake_redis.get(keys.data(EXP, "collector_task_x_0001")) == b""  # emptied: a tombstone keeps the TTL
    assert 0 < fake_redis.ttl(keys.data(EXP, "collector_task_x_0001")) <= 600
    assert stats(fake_redis) == {"consumed": 1, "env_steps": 10}
    assert calls == [1]
    s = buf.sample(50, np.random.default_rng(0))
    assert (s["reward"] == 1.0).all() and (s["next_obs"] == 1.5).all()
    assert s["discount"] == pytest.approx(0.729)
    # Nothing is delivered again.
    assert read_all(fake_redis) == []


def test_redelivered_entry_not_inserted_twice(fake_redis):
    reader, buf, calls = make_reader(fake_redis)
    send(fake_redis, "dup_1", serialization.dumps(make_chunk(4, 1.0)), n_samples=4, env_steps=4)
    entries = read_all(fake_redis)
    reader._consume(entries)
    # The same entries handed over again (e.g. claimed after a presumed death): acked already.
    fake_redis.set(keys.data(EXP, "dup_1"), serialization.dumps(make_chunk(4, 1.0)))
    reader._consume(entries)
    assert len(buf) == 4 and buf.pushed == 4
    assert reader.chunks == 1 and reader.duplicates == 1 and reader.env_steps == 4
    assert stats(fake_redis) == {"consumed": 1, "env_steps": 4, "duplicate": 1}
    assert calls == [1]


def test_expired_blob_counted_and_acked(fake_redis):
    reader, buf, calls = make_reader(fake_redis)
    send(fake_redis, "gone_1", None)
    reader._consume(read_all(fake_redis))
    assert counters(reader)["expired"] == 1 and reader.chunks == 0 and reader.env_steps == 0
    assert len(buf) == 0 and pending(fake_redis) == 0
    assert stats(fake_redis) == {"expired": 1}
    assert calls == []  # nothing new for the trainer


def test_garbage_blob_counted_corrupt(fake_redis):
    reader, buf, _ = make_reader(fake_redis)
    send(fake_redis, "junk_1", b"\xc1\xc1 garbage bytes")
    reader._consume(read_all(fake_redis))
    assert reader.corrupt == 1 and len(buf) == 0 and pending(fake_redis) == 0
    assert fake_redis.get(keys.data(EXP, "junk_1")) == b""
    assert stats(fake_redis) == {"corrupt": 1}


@pytest.mark.parametrize("mutate", [
    lambda c: c.pop("done"),
    lambda c: c.__setitem__("obs", np.zeros((8, 3), np.float32)),
    lambda c: c.__setitem__("reward", np.zeros(5, np.float32)),
])
def test_wrong_layout_counted_corrupt(fake_redis, mutate):
    reader, buf, _ = make_reader(fake_redis)
    c = make_chunk(8, 2.0)
    mutate(c)
    send(fake_redis, "bad_layout", serialization.dumps(c))
    reader._consume(read_all(fake_redis))
    assert reader.corrupt == 1 and len(buf) == 0 and pending(fake_redis) == 0


def test_non_dict_blob_counted_corrupt(fake_redis):
    reader, buf, _ = make_reader(fake_redis)
    send(fake_redis, "a_list", serialization.dumps([1, 2, 3]))
    reader._consume(read_all(fake_redis))
    assert reader.corrupt == 1 and len(buf) == 0


def test_entry_missing_data_id_counted_malformed(fake_redis):
    reader, buf, _ = make_reader(fake_redis)
    streams.add(fake_redis, keys.buffer_meta(EXP, BUF), {"n_samples": 8, "env_steps": 8})
    reader._consume(read_all(fake_redis))
    assert reader.malformed == 1 and len(buf) == 0 and pending(fake_redis) == 0
    assert stats(fake_redis) == {"malformed": 1}


def test_entry_with_wrong_field_type_counted_malformed(fake_redis):
    reader, _, _ = make_reader(fake_redis)
    send(fake_redis, "ok_id", serialization.dumps(make_chunk(2, 1.0)), env_steps="many")
    reader._consume(read_all(fake_redis))
    assert reader.malformed == 1 and reader.chunks == 0 and pending(fake_redis) == 0


def test_mixed_batch_rest_still_inserted(fake_redis):
    reader, buf, calls = make_reader(fake_redis)
    send(fake_redis, "good_a", serialization.dumps(make_chunk(4, 1.0)), n_samples=4, env_steps=4)
    send(fake_redis, "expired_b", None)
    send(fake_redis, "corrupt_c", b"not msgpack \xc1")
    streams.add(fake_redis, keys.buffer_meta(EXP, BUF), {"n_samples": 3})  # malformed
    send(fake_redis, "good_d", serialization.dumps(make_chunk(6, 2.0)), n_samples=6, env_steps=7)
    entries = read_all(fake_redis)
    assert len(entries) == 5
    reader._consume(entries)
    assert counters(reader) == {"chunks": 2, "expired": 1, "corrupt": 1, "malformed": 1, "duplicates": 0}
    assert reader.env_steps == 11
    assert len(buf) == 10 and buf.pushed == 10
    assert rewards_in(buf) == {1.0, 2.0}
    assert pending(fake_redis) == 0
    for d in ("good_a", "corrupt_c", "good_d"):
        assert fake_redis.get(keys.data(EXP, d)) == b""
    assert stats(fake_redis) == {"consumed": 2, "env_steps": 11, "expired": 1, "corrupt": 1, "malformed": 1}
    assert calls == [1]


def test_consume_only_bad_entries_does_not_signal(fake_redis):
    reader, _, calls = make_reader(fake_redis)
    send(fake_redis, "x", b"\x00garbage")
    reader._consume(read_all(fake_redis))
    assert calls == []


def test_consume_empty_batch_is_noop(fake_redis):
    reader, buf, calls = make_reader(fake_redis)
    reader._consume([])
    assert len(buf) == 0 and calls == [] and stats(fake_redis) == {}


def test_revoked_lease_inserts_and_acks_nothing(fake_redis):
    from common.scripts import LeaseRevoked

    reader, buf, calls = make_reader(fake_redis)
    send(fake_redis, "late_1", serialization.dumps(make_chunk(3, 1.0)), n_samples=3, env_steps=3)
    entries = read_all(fake_redis)
    fake_redis.delete(LEASE)  # the coordinator declared this learner dead
    with pytest.raises(LeaseRevoked, match=LEASE):
        reader._consume(entries)
    assert len(buf) == 0 and reader.chunks == 0 and calls == []
    assert pending(fake_redis) == 1  # left for the replacement learner
    assert fake_redis.exists(keys.data(EXP, "late_1"))
    assert stats(fake_redis) == {}


def test_env_steps_base_from_stats(fake_redis):
    fake_redis.hset(STATS, mapping={"env_steps": 1234, "consumed": 9})
    reader, _, _ = make_reader(fake_redis)
    assert reader.env_steps_base == 1234 and reader.env_steps == 0
    assert fake_redis.hgetall(STATS) == {b"env_steps": b"1234", b"consumed": b"9"}  # untouched by construction
    reader2 = BufferReader(fake_redis, EXP, "other_buffer", TASK, ReplayBuffer(10, SCHEMA), LOG, lambda: None, LEASE)
    assert reader2.env_steps_base == 0


def test_invalid_data_id_counted_malformed_rest_inserted(fake_redis):
    reader, buf, _ = make_reader(fake_redis)
    streams.add(fake_redis, keys.buffer_meta(EXP, BUF), {"data_id": "bad id", "n_samples": 1, "env_steps": 1})
    send(fake_redis, "good_after", serialization.dumps(make_chunk(3, 4.0)), n_samples=3, env_steps=3)
    reader._consume(read_all(fake_redis))
    assert reader.malformed == 1
    assert len(buf) == 3
    assert pending(fake_redis) == 0


def test_zero_dim_field_blob_counted_corrupt(fake_redis):
    reader, buf, _ = make_reader(fake_redis)
    bad = make_chunk(3, 1.0)
    bad["action"] = np.array(1, dtype=np.int64)
    send(fake_redis, "zero_dim", serialization.dumps(bad))
    send(fake_redis, "good_after", serialization.dumps(make_chunk(3, 2.0)), n_samples=3, env_steps=3)
    reader._consume(read_all(fake_redis))
    assert reader.corrupt == 1 and reader.chunks == 1
    assert len(buf) == 3 and pending(fake_redis) == 0


# ---------------------------------------------------------------- BufferReader thread

def wait_until(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_reader_thread_end_to_end(fake_redis):
    got = threading.Event()
    reader, buf, _ = make_reader(fake_redis, on_data=got.set, block_ms=20)
    reader.start()
    try:
        send(fake_redis, "thread_1", serialization.dumps(make_chunk(5, 3.0)), n_samples=5, env_steps=5)
        assert got.wait(5.0), "on_data was not called"
        assert wait_until(lambda: len(buf) == 5)
        assert reader.env_steps == 5
        assert reader.error is None
    finally:
        reader.stop()
        reader.join(5.0)
    assert not reader.is_alive()


def test_counters_read_after_stop_agree_with_the_acks(fake_redis):
    """The learner's closing report reads the counters right after stop(), while the reader may
    still hold a batch it read: that batch is not acked (it stays pending, for the next learner),
    so the report never counts fewer chunks than Redis counts consumed (the Sentinel test caught
    17 reported against 18 acked)."""
    reading, release = threading.Event(), threading.Event()

    class SlowCheck(ReplayBuffer):
        def check(self, chunk, what):
            reading.set()
            assert release.wait(5.0)
            return super().check(chunk, what)

    fake_redis.set(LEASE, "1")
    buf = SlowCheck(100, SCHEMA)
    reader = BufferReader(fake_redis, EXP, BUF, TASK, buf, LOG, lambda: None, LEASE, block_ms=20)
    reader.start()
    try:
        send(fake_redis, "late_1", serialization.dumps(make_chunk(4, 2.0)), n_samples=4, env_steps=4)
        assert reading.wait(5.0)
        reader.stop()
        reported = reader.chunks
    finally:
        release.set()
        reader.join(5.0)
    assert not reader.is_alive()
    assert stats(fake_redis).get("consumed", 0) == reported == reader.chunks == 0
    assert pending(fake_redis) == 1 and len(buf) == 0


def test_reader_thread_claims_orphans_of_dead_learner(fake_redis):
    # A previous learner read two entries and died before acking them.
    send(fake_redis, "orphan_1", serialization.dumps(make_chunk(2, 7.0)), n_samples=2, env_steps=2)
    send(fake_redis, "orphan_2", serialization.dumps(make_chunk(3, 8.0)), n_samples=3, env_steps=3)
    streams.ensure_group(fake_redis, keys.buffer_meta(EXP, BUF), keys.LEARNER_GROUP)
    assert len(read_all(fake_redis, consumer="learner_task_dead")) == 2
    assert pending(fake_redis) == 2
    reader, buf, _ = make_reader(fake_redis, consumer="learner_task_new", on_data=lambda: None, block_ms=20, batch=1)
    reader.start()
    try:
        assert wait_until(lambda: len(buf) == 5)
        assert rewards_in(buf) == {7.0, 8.0}
        assert reader.chunks == 2 and reader.env_steps == 5 and reader.error is None
        assert wait_until(lambda: pending(fake_redis) == 0)
    finally:
        reader.stop()
        reader.join(5.0)


def test_reader_thread_reclaims_what_a_frozen_learner_read_after_its_start(fake_redis, monkeypatch, caplog):
    """A learner frozen past its replacement's start (SIGSTOP) reads entries when it resumes, after
    the replacement's start claim; its revoked lease refuses their ack. The replacement claims
    them once they are unacked for _RECLAIM_IDLE_S (shortened here)."""
    monkeypatch.setattr("workers.comm_learner._RECLAIM_IDLE_S", 0.05)
    reader, buf, _ = make_reader(fake_redis, consumer="learner_task_new", on_data=lambda: None, block_ms=20)
    reader.start()
    try:
        send(fake_redis, "first", serialization.dumps(make_chunk(2, 1.0)), n_samples=2, env_steps=2)
        assert wait_until(lambda: len(buf) == 2)  # past its start claim
        with caplog.at_level(logging.INFO, logger=LOG.name):
            pipe = fake_redis.pipeline(transaction=True)  # the zombie's read, before the reader can take them
            for i, tag in enumerate((7.0, 8.0)):
                pipe.set(keys.data(EXP, f"late_{i}"), serialization.dumps(make_chunk(3, tag)), ex=600)
                pipe.xadd(keys.buffer_meta(EXP, BUF), {"data_id": f"late_{i}", "n_samples": 3, "env_steps": 3,
                                                       "policy_version": 0})
            pipe.xreadgroup(keys.LEARNER_GROUP, "learner_task_old", {keys.buffer_meta(EXP, BUF): ">"}, count=10)
            assert len(pipe.execute()[-1][0][1]) == 2
            assert wait_until(lambda: len(buf) == 8)
        assert rewards_in(buf) == {1.0, 7.0, 8.0} and pending(fake_redis) == 0 and reader.duplicates == 0
        assert any("frozen past this learner's start" in r.getMessage() for r in caplog.records)
    finally:
        reader.stop()
        reader.join(5.0)


def test_reader_thread_surfaces_fatal_error(fake_redis, monkeypatch):
    got = threading.Event()
    reader, _, _ = make_reader(fake_redis, on_data=got.set, block_ms=20)

    def boom(entries):
        raise RuntimeError("consume exploded")

    monkeypatch.setattr(reader, "_consume", boom)
    send(fake_redis, "x1", b"whatever")
    reader.start()
    assert got.wait(5.0)
    reader.join(5.0)
    assert not reader.is_alive()
    assert isinstance(reader.error, RuntimeError) and "exploded" in str(reader.error)


def test_reader_thread_stops_when_group_is_gone(fake_redis):
    import redis

    got = threading.Event()
    reader, _, _ = make_reader(fake_redis, on_data=got.set, block_ms=20)
    fake_redis.delete(keys.buffer_meta(EXP, BUF))  # e.g. Redis restarted without persistence
    reader.start()
    assert got.wait(5.0)
    reader.join(5.0)
    assert not reader.is_alive()
    assert isinstance(reader.error, (RuntimeError, redis.ResponseError))


def test_reader_thread_lease_revoked_is_fatal(fake_redis):
    from common.scripts import LeaseRevoked

    got = threading.Event()
    reader, buf, _ = make_reader(fake_redis, on_data=got.set, block_ms=20)
    fake_redis.delete(LEASE)
    send(fake_redis, "after_revoke", serialization.dumps(make_chunk(2, 1.0)))
    reader.start()
    assert got.wait(5.0)
    reader.join(5.0)
    assert isinstance(reader.error, LeaseRevoked)
    assert len(buf) == 0


# ---------------------------------------------------------------- policy publication

def test_publish_policy_roundtrip_and_announcement(fake_redis):
    ps = fake_redis.pubsub()
    ps.subscribe(keys.policy_updates(EXP, "policy_1"))
    assert ps.get_message(timeout=1.0)["type"] == "subscribe"
    weights = {"encoder.0.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
               "encoder.0.bias": np.ones(3, np.float32)}
    nbytes = publish_policy(fake_redis, EXP, "policy_1", weights, train_iter=42, envstep_limit=1234)
    meta, payload = blobstore.get_versioned(fake_redis, keys.policy(EXP, "policy_1"))
    assert len(payload) == nbytes
    assert meta["version"] == "42" and meta["train_iter"] == "42" and meta["envstep_limit"] == "1234"
    back = serialization.loads(payload)
    assert set(back) == set(weights)
    for k in weights:
        np.testing.assert_array_equal(back[k], weights[k])
        assert back[k].dtype == np.float32
    assert int(fake_redis.hget(keys.policy(EXP, "policy_1"), "version")) == 42
    msg = ps.get_message(timeout=1.0)
    assert msg is not None and msg["data"] == b"42 1234"
    ps.close()


def test_publish_policy_with_lease(fake_redis):
    from common.scripts import LeaseRevoked

    fake_redis.set(LEASE, "1")
    ps = fake_redis.pubsub()
    ps.subscribe(keys.policy_updates(EXP, "policy_2"))
    assert ps.get_message(timeout=1.0)["type"] == "subscribe"
    w1 = {"b": np.full(3, 1.0, np.float32)}
    publish_policy(fake_redis, EXP, "policy_2", w1, train_iter=5, envstep_limit=50, lease_key=LEASE)
    meta, payload = blobstore.get_versioned(fake_redis, keys.policy(EXP, "policy_2"))
    assert meta["version"] == "5" and meta["envstep_limit"] == "50"
    np.testing.assert_array_equal(serialization.loads(payload)["b"], w1["b"])
    assert ps.get_message(timeout=1.0)["data"] == b"5 50"
    # Once the lease is revoked nothing more is written or announced.
    fake_redis.delete(LEASE)
    with pytest.raises(LeaseRevoked, match=LEASE):
        publish_policy(fake_redis, EXP, "policy_2", {"b": np.zeros(3, np.float32)}, train_iter=6,
                       envstep_limit=60, lease_key=LEASE)
    assert int(fake_redis.hget(keys.policy(EXP, "policy_2"), "version")) == 5
    assert ps.get_message(timeout=0.2) is None
    ps.close()


def _announced(ps) -> list[bytes]:
    out = []
    while (msg := ps.get_message(timeout=0.2)) is not None:
        out.append(msg["data"])
    return out


def test_the_publisher_sends_without_waiting_for_the_reply_and_every_version_in_order(real_redis):
    """``publish`` returns once the version is sent; its reply is read at the next publication or
    ``flush``: with writes held by CLIENT PAUSE WRITE, ``publish`` returns and ``flush`` times out
    naming the version; every version is then written and announced, in order (a collector in
    lockstep waits for each one)."""
    from workers.publication import PolicyPublisher

    real_redis.set(LEASE, "1")
    ps = real_redis.pubsub()
    ps.subscribe(keys.policy_updates(EXP, "policy_3"))
    assert ps.get_message(timeout=1.0)["type"] == "subscribe"
    pub = PolicyPublisher(real_redis, EXP, "policy_3", LEASE)
    try:
        pub.publish({"b": np.full(3, 0.0, np.float32)}, 0, 0, 0)
        pub.flush(timeout=10)
        real_redis.client_pause(60_000, all=False)  # writes wait; this client's own commands still run
        pub.publish({"b": np.full(3, 1.0, np.float32)}, 1, 10, 0)  # returns: the reply is not waited for
        with pytest.raises(TimeoutError, match="version 1 still unwritten"):
            pub.flush(timeout=0.2)
        assert real_redis.hget(keys.policy(EXP, "policy_3"), "version") == b"0"
        real_redis.client_unpause()
        for v in (2, 3):
            pub.publish({"b": np.full(3, float(v), np.float32)}, v, 10 * v, 0)
        pub.flush(timeout=10)
        meta, payload = blobstore.get_versioned(real_redis, keys.policy(EXP, "policy_3"))
        assert meta["version"] == "3" and serialization.loads(payload)["b"][0] == 3.0
        announced = _announced(ps)
        assert announced == [b"0 0", b"1 10", b"2 20", b"3 30"], announced
        real_redis.delete(keys.policy(EXP, "policy_3"))
        assert pub.republish() == 3
        assert real_redis.hget(keys.policy(EXP, "policy_3"), "version") == b"3"
    finally:
        real_redis.client_unpause()
        pub.close()
        ps.close()


def test_the_publisher_writes_through_the_client_when_its_connection_drops_or_redis_lost_the_script(real_redis):
    from workers.publication import PolicyPublisher

    real_redis.set(LEASE, "1")
    pub = PolicyPublisher(real_redis, EXP, "policy_5", LEASE)
    try:
        pub.publish({"b": np.ones(3, np.float32)}, 1, 10, 0)
        pub.flush(timeout=10)
        for info in real_redis.client_list():  # drop every connection but this test's own
            if int(info["id"]) != real_redis.client_id():
                real_redis.client_kill_filter(_id=info["id"])
        pub.publish({"b": np.full(3, 2.0, np.float32)}, 2, 20, 0)
        pub.flush(timeout=10)
        assert real_redis.hget(keys.policy(EXP, "policy_5"), "version") == b"2"
        real_redis.script_flush()
        pub.publish({"b": np.full(3, 3.0, np.float32)}, 3, 30, 0)
        pub.flush(timeout=10)
        assert real_redis.hget(keys.policy(EXP, "policy_5"), "version") == b"3"
    finally:
        pub.close()


def test_a_publication_refused_by_its_lease_fails_the_next_publish_and_flush(real_redis):
    from common.scripts import LeaseRevoked
    from workers.publication import PolicyPublisher

    real_redis.set(LEASE, "1")
    pub = PolicyPublisher(real_redis, EXP, "policy_4", LEASE)
    try:
        pub.publish({"b": np.ones(3, np.float32)}, 1, 10, 0)
        pub.flush(timeout=10)
        real_redis.delete(LEASE)
        pub.publish({"b": np.ones(3, np.float32)}, 2, 20, 0)
        with pytest.raises(LeaseRevoked, match=LEASE):
            pub.flush(timeout=10)
        with pytest.raises(LeaseRevoked, match=LEASE):
            pub.publish({"b": np.ones(3, np.float32)}, 3, 30, 0)
        assert int(real_redis.hget(keys.policy(EXP, "policy_4"), "version")) == 1
    finally:
        pub.close()


def test_save_checkpoint_with_revoked_lease_writes_nothing(fake_redis):
    from common.scripts import LeaseRevoked

    fake_redis.set(LEASE, "1")
    save_checkpoint(fake_redis, EXP, "latest", {"w": torch.ones(2)}, train_iter=1, lease_key=LEASE)
    fake_redis.delete(LEASE)
    with pytest.raises(LeaseRevoked):
        save_checkpoint(fake_redis, EXP, "latest", {"w": torch.zeros(2)}, train_iter=2, lease_key=LEASE)
    loaded = load_checkpoint(fake_redis, EXP, "latest")
    assert torch.equal(loaded["w"], torch.ones(2))
    assert int(fake_redis.hget(keys.ckpt(EXP, "latest"), "version")) == 1


# ---------------------------------------------------------------- checkpoints

def test_checkpoint_roundtrip(fake_redis, small_cfg):
    from common.policy import create_policy
    from common.spaces import SpaceSpec

    spec = SpaceSpec("CartPole-v1", "box", (OBS,), 0, 0, "discrete", 2, 0, 0, (), ())
    torch.manual_seed(0)
    policy = create_policy(small_cfg, spec, device="cpu")
    batch = {k: v for k, v in make_chunk(16, 1.0).items()}
    batch["obs"] = np.random.default_rng(0).normal(size=(16, OBS)).astype(np.float32)
    policy.learn(batch)
    state = {"policy": policy.state_dict(), "train_iter": 7, "envstep": 512}
    nbytes = save_checkpoint(fake_redis, EXP, "latest", state, train_iter=7)
    assert nbytes > 0
    assert int(fake_redis.hget(keys.ckpt(EXP, "latest"), "version")) == 7
    loaded = load_checkpoint(fake_redis, EXP, "latest")
    assert loaded["train_iter"] == 7 and loaded["envstep"] == 512
    assert loaded["policy"]["updates"] == 1
    for k, v in state["policy"]["model"].items():
        assert torch.equal(loaded["policy"]["model"][k], v)
    torch.manual_seed(5)
    other = create_policy(small_cfg, spec, device="cpu")
    other.load_state_dict(loaded["policy"])
    obs = np.random.default_rng(1).normal(size=(64, OBS)).astype(np.float32)
    rng = np.random.default_rng
    np.testing.assert_array_equal(other.act_eval(obs, rng(0)), policy.act_eval(obs, rng(0)))


def test_checkpoint_chunked(fake_redis, monkeypatch):
    monkeypatch.setattr(blobstore, "CHUNK_BYTES", 1000)
    state = {"w": torch.arange(5000, dtype=torch.float32)}
    save_checkpoint(fake_redis, EXP, "big", state, train_iter=1)
    assert int(fake_redis.hget(keys.ckpt(EXP, "big"), "n_chunks")) > 1
    assert torch.equal(load_checkpoint(fake_redis, EXP, "big")["w"], state["w"])


def test_load_missing_checkpoint_returns_none(fake_redis):
    assert load_checkpoint(fake_redis, EXP, "latest") is None


def test_load_corrupt_checkpoint_raises_blob_error(fake_redis):
    blobstore.put_versioned(fake_redis, keys.ckpt(EXP, "latest"), b"definitely not a torch file", 3)
    with pytest.raises(blobstore.BlobError, match=keys.ckpt(EXP, "latest")):
        load_checkpoint(fake_redis, EXP, "latest")


def test_checkpoint_refuses_pickled_objects(fake_redis):
    from fractions import Fraction  # picklable, but not on torch's weights_only allow-list

    save_checkpoint(fake_redis, EXP, "evil", {"obj": Fraction(1, 3)}, train_iter=1)
    with pytest.raises(blobstore.BlobError, match="evil"):
        load_checkpoint(fake_redis, EXP, "evil")


def test_checkpoint_name_validated(fake_redis):
    with pytest.raises(ValueError, match="ckpt name"):
        save_checkpoint(fake_redis, EXP, "bad name", {}, train_iter=1)
