"""Unit tests for the replay buffer, task space, stream helpers, blob store and event parsing."""

from __future__ import annotations

import time

import numpy as np
import pytest

from common import blobstore, events, keys, streams
from common.blobstore import BlobError
from common.streams import MalformedEntry
from common.task_space import TaskSpace
from workers.replay_buffer import ReplayBuffer

SCHEMA = {
    "obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
    "next_obs": ((4,), np.float32), "done": ((), np.bool_), "discount": ((), np.float32),
}


def chunk(n, start=0):
    idx = np.arange(start, start + n)
    return {
        "obs": np.repeat(idx[:, None], 4, axis=1).astype(np.float32),
        "action": (idx % 2).astype(np.int64),
        "reward": idx.astype(np.float32),
        "next_obs": np.repeat(idx[:, None] + 1, 4, axis=1).astype(np.float32),
        "done": (idx % 3 == 0),
        "discount": np.full(n, 0.9, np.float32),
    }


# ---------------------------------------------------------------- ReplayBuffer

def test_buffer_extend_and_len():
    buf = ReplayBuffer(10, SCHEMA)
    assert len(buf) == 0
    c = chunk(4)
    assert buf.check(c, "k") == 4
    buf.extend(c)
    assert len(buf) == 4 and buf.pushed == 4


def test_buffer_ring_overwrites_oldest():
    buf = ReplayBuffer(5, SCHEMA)
    buf.extend(chunk(3, 0))
    buf.extend(chunk(4, 3))  # rows 0..6, capacity 5: 0 and 1 overwritten
    assert len(buf) == 5 and buf.pushed == 7
    s = buf.sample(2000, np.random.default_rng(0))
    assert set(s["reward"].astype(int).tolist()) == {2, 3, 4, 5, 6}
    # Rows stay internally consistent across fields.
    np.testing.assert_array_equal(s["obs"][:, 0], s["reward"])
    np.testing.assert_array_equal(s["next_obs"][:, 0], s["reward"] + 1)
    np.testing.assert_array_equal(s["action"], s["reward"].astype(int) % 2)
    np.testing.assert_array_equal(s["done"], s["reward"].astype(int) % 3 == 0)


def test_buffer_chunk_larger_than_capacity_keeps_newest():
    buf = ReplayBuffer(4, SCHEMA)
    buf.extend(chunk(10, 0))
    assert len(buf) == 4
    s = buf.sample(1000, np.random.default_rng(1))
    assert set(s["reward"].astype(int).tolist()) == {6, 7, 8, 9}


def test_buffer_sample_shapes_and_dtypes():
    buf = ReplayBuffer(100, SCHEMA)
    buf.extend(chunk(50, start=1))  # rewards 1..50; unfilled rows hold zeros
    s = buf.sample(32, np.random.default_rng(0))
    assert s["obs"].shape == (32, 4) and s["obs"].dtype == np.float32
    assert s["next_obs"].shape == (32, 4)
    assert s["action"].shape == (32,) and s["action"].dtype == np.int64
    assert s["reward"].shape == (32,) and s["reward"].dtype == np.float32
    assert s["done"].shape == (32,) and s["done"].dtype == np.bool_
    assert s["discount"].shape == (32,)
    assert buf.sampled == 32
    # Only filled rows are sampled.
    many = buf.sample(1000, np.random.default_rng(1))["reward"]
    assert many.min() >= 1 and many.max() <= 50
    assert len(np.unique(many)) > 40  # and all of them are reachable


def test_buffer_sample_is_a_copy():
    buf = ReplayBuffer(10, SCHEMA)
    buf.extend(chunk(10))
    s = buf.sample(5, np.random.default_rng(0))
    s["obs"][:] = -1
    s2 = buf.sample(100, np.random.default_rng(0))
    assert (s2["obs"] >= 0).all()


def test_buffer_casts_dtypes_on_insert():
    buf = ReplayBuffer(10, SCHEMA)
    c = chunk(3)
    c["obs"] = c["obs"].astype(np.float64)
    c["action"] = c["action"].astype(np.int32)
    buf.extend(c)
    s = buf.sample(5, np.random.default_rng(0))
    assert s["obs"].dtype == np.float32 and s["action"].dtype == np.int64


def test_buffer_empty_sample_raises():
    buf = ReplayBuffer(10, SCHEMA)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4, np.random.default_rng(0))


def test_buffer_empty_chunk_is_noop():
    buf = ReplayBuffer(10, SCHEMA)
    empty = chunk(0)
    assert buf.check(empty, "k") == 0
    buf.extend(empty)
    assert len(buf) == 0 and buf.pushed == 0


def test_buffer_capacity_must_be_positive():
    with pytest.raises(ValueError, match="replay_buffer_size"):
        ReplayBuffer(0, SCHEMA)


def test_check_missing_field_names_it():
    buf = ReplayBuffer(10, SCHEMA)
    c = chunk(3)
    del c["discount"]
    with pytest.raises(ValueError) as ei:
        buf.check(c, "rqrl:e:data:x")
    assert "'discount'" in str(ei.value) and "rqrl:e:data:x" in str(ei.value)


def test_check_non_array_field():
    buf = ReplayBuffer(10, SCHEMA)
    c = chunk(3)
    c["reward"] = [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="'reward'"):
        buf.check(c, "where")


def test_check_wrong_row_shape_names_field():
    buf = ReplayBuffer(10, SCHEMA)
    c = chunk(3)
    c["next_obs"] = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError) as ei:
        buf.check(c, "where")
    msg = str(ei.value)
    assert "'next_obs'" in msg and "(5,)" in msg and "(4,)" in msg


def test_check_unequal_lengths_names_field():
    buf = ReplayBuffer(10, SCHEMA)
    c = chunk(3)
    c["done"] = np.zeros(2, bool)
    with pytest.raises(ValueError) as ei:
        buf.check(c, "where")
    assert "'done'" in str(ei.value) and "2" in str(ei.value) and "3" in str(ei.value)


def test_check_not_a_dict():
    buf = ReplayBuffer(10, SCHEMA)
    with pytest.raises(ValueError, match="where.*list"):
        buf.check([1, 2], "where")


def test_check_zero_dim_field_raises_value_error():
    buf = ReplayBuffer(10, SCHEMA)
    c = chunk(3)
    c["action"] = np.array(1, dtype=np.int64)
    with pytest.raises(ValueError, match="'action'"):
        buf.check(c, "where")


# ---------------------------------------------------------------- TaskSpace

def test_task_space_acquire_release():
    ts = TaskSpace(0, 2)
    assert ts.acquire_space() and ts.acquire_space()
    assert ts.in_use == 2
    assert ts.acquire_space() is False
    ts.release_space()
    assert ts.in_use == 1
    assert ts.acquire_space() is True
    assert ts.acquire_space() is False


def test_task_space_double_release():
    ts = TaskSpace(0, 1)
    assert ts.acquire_space()
    ts.release_space()
    with pytest.raises(RuntimeError):
        ts.release_space()
    assert ts.in_use == 0


def test_task_space_release_without_acquire():
    with pytest.raises(RuntimeError):
        TaskSpace(0, 3).release_space()


def test_task_space_resize_keeps_running_tasks():
    ts = TaskSpace(0, 3)
    assert ts.acquire_space() and ts.acquire_space() and ts.acquire_space()
    ts.resize(1)
    ts.release_space()
    assert not ts.acquire_space()  # two still run on a capacity of one
    ts.release_space()
    ts.release_space()
    assert ts.acquire_space() and not ts.acquire_space()
    ts.resize(-2)  # never below min_val
    assert ts.max_val == 0


@pytest.mark.parametrize("lo, hi", [(-1, 1), (3, 2)])
def test_task_space_bad_bounds(lo, hi):
    with pytest.raises(ValueError):
        TaskSpace(lo, hi)


# ---------------------------------------------------------------- streams

def test_ensure_group_idempotent(fake_redis):
    streams.ensure_group(fake_redis, "s", "g")
    streams.ensure_group(fake_redis, "s", "g")
    groups = fake_redis.xinfo_groups("s")
    assert [g["name"] for g in groups] == [b"g"]
    assert fake_redis.exists("s")


def test_ensure_group_other_error_propagates(fake_redis):
    import redis

    fake_redis.set("not_a_stream", "x")
    with pytest.raises(redis.ResponseError):
        streams.ensure_group(fake_redis, "not_a_stream", "g")


def test_encode_decode_roundtrip():
    fields = {"i": 42, "neg": -7, "f": 0.1, "big": 1.2345678901234567e300, "t": True, "fl": False,
              "s": "collector_task_ab12", "fi": 3.0}
    enc = streams.encode_fields(fields)
    assert all(isinstance(v, str) for v in enc.values())
    assert enc["t"] == "true" and enc["fl"] == "false"
    raw = {k.encode(): v.encode() for k, v in enc.items()}
    dec = streams.decode_fields(raw)
    assert dec == fields
    assert type(dec["i"]) is int and type(dec["f"]) is float and type(dec["fi"]) is float
    assert dec["t"] is True and dec["fl"] is False


def test_encode_none_and_refuses_non_scalars():
    assert streams.encode_fields({"x": None}) == {"x": ""}
    with pytest.raises(TypeError, match="'lst'"):
        streams.encode_fields({"lst": [1, 2]})


def test_roundtrip_through_fake_redis(fake_redis):
    eid = streams.add(fake_redis, "st", {"a": 1, "b": 2.5, "c": True, "d": "x y"})
    entries = fake_redis.xrange("st")
    assert entries[0][0] == eid
    assert streams.decode_fields(entries[0][1]) == {"a": 1, "b": 2.5, "c": True, "d": "x y"}


def test_require_ok_and_missing_and_wrong_type():
    spec = {"data_id": str, "n_samples": int, "x": (int, float)}
    streams.require({"data_id": "d", "n_samples": 3, "x": 1.5}, spec, "s entry 1-0")
    with pytest.raises(MalformedEntry) as ei:
        streams.require({"n_samples": 3, "x": 1}, spec, "s entry 1-0")
    assert "'data_id'" in str(ei.value) and "s entry 1-0" in str(ei.value)
    with pytest.raises(MalformedEntry, match="'n_samples'"):
        streams.require({"data_id": "d", "n_samples": "three", "x": 1}, spec, "w")
    with pytest.raises(MalformedEntry, match="'n_samples'"):
        streams.require({"data_id": "d", "n_samples": 2.5, "x": 1}, spec, "w")


def test_require_bool_is_not_int():
    with pytest.raises(MalformedEntry, match="'n_samples'"):
        streams.require({"n_samples": True}, {"n_samples": int}, "w")
    streams.require({"flag": True}, {"flag": bool}, "w")


def test_read_group_returns_entries_and_ack(fake_redis):
    streams.ensure_group(fake_redis, "st", "g")
    ids = [streams.add(fake_redis, "st", {"n": i}) for i in range(5)]
    got = streams.read_group(fake_redis, "st", "g", "c1", count=3, block_ms=50)
    assert [e[0] for e in got] == ids[:3]
    assert streams.decode_fields(got[0][1]) == {"n": 0}
    assert fake_redis.xpending("st", "g")["pending"] == 3
    fake_redis.xack("st", "g", *[e[0] for e in got])
    assert fake_redis.xpending("st", "g")["pending"] == 0
    rest = streams.read_group(fake_redis, "st", "g", "c1", count=10, block_ms=50)
    assert [e[0] for e in rest] == ids[3:]


def test_read_group_block_times_out_empty(fake_redis):
    streams.ensure_group(fake_redis, "st", "g")
    t0 = time.monotonic()
    assert streams.read_group(fake_redis, "st", "g", "c", count=10, block_ms=20) == []
    assert time.monotonic() - t0 < 5


def test_read_group_consumers_share_work(fake_redis):
    streams.ensure_group(fake_redis, "st", "g")
    for i in range(4):
        streams.add(fake_redis, "st", {"n": i})
    a = streams.read_group(fake_redis, "st", "g", "c1", count=2, block_ms=10)
    b = streams.read_group(fake_redis, "st", "g", "c2", count=10, block_ms=10)
    assert len(a) == 2 and len(b) == 2
    assert {e[0] for e in a}.isdisjoint({e[0] for e in b})


def test_add_passes_approximate_maxlen(fake_redis, monkeypatch):
    calls = []
    real = fake_redis.xadd

    def spy(name, fields, **kw):
        calls.append((name, fields, kw))
        return real(name, fields, **kw)

    monkeypatch.setattr(fake_redis, "xadd", spy)
    streams.add(fake_redis, "capped", {"n": 1, "ok": False}, maxlen=10)
    streams.add(fake_redis, "capped", {"n": 2})
    assert calls[0] == ("capped", {"n": "1", "ok": "false"}, {"maxlen": 10, "approximate": True})
    assert calls[1][2] == {"maxlen": streams.DEFAULT_MAXLEN, "approximate": True}
    assert fake_redis.xlen("capped") == 2


# ---------------------------------------------------------------- blobstore

def test_versioned_roundtrip_small(fake_redis):
    blobstore.put_versioned(fake_redis, "k", b"hello", 3, meta={"train_iter": 3, "format": "x"})
    meta, payload = blobstore.get_versioned(fake_redis, "k")
    assert payload == b"hello"
    assert meta["version"] == "3" and meta["train_iter"] == "3" and meta["format"] == "x"
    assert meta["nbytes"] == "5" and meta["n_chunks"] == "1"
    assert not any(k.startswith("chunk:") for k in meta)
    assert int(fake_redis.hget("k", "version")) == 3


def test_versioned_empty_payload(fake_redis):
    blobstore.put_versioned(fake_redis, "k", b"", 0)
    assert blobstore.get_versioned(fake_redis, "k")[1] == b""


def test_versioned_chunked_roundtrip(fake_redis, monkeypatch):
    monkeypatch.setattr(blobstore, "CHUNK_BYTES", 7)
    payload = bytes(range(256)) * 3 + b"tail"
    blobstore.put_versioned(fake_redis, "big", payload, 11)
    n = (len(payload) + 6) // 7
    assert int(fake_redis.hget("big", "n_chunks")) == n
    assert len(fake_redis.hget("big", "chunk:0")) == 7
    meta, got = blobstore.get_versioned(fake_redis, "big")
    assert got == payload and meta["n_chunks"] == str(n)


def test_versioned_replace_drops_old_chunks(fake_redis, monkeypatch):
    monkeypatch.setattr(blobstore, "CHUNK_BYTES", 4)
    blobstore.put_versioned(fake_redis, "k", b"x" * 40, 1, meta={"old": 1})
    blobstore.put_versioned(fake_redis, "k", b"yy", 2)
    assert fake_redis.hget("k", "chunk:5") is None
    assert fake_redis.hget("k", "old") is None
    meta, got = blobstore.get_versioned(fake_redis, "k")
    assert got == b"yy" and meta["version"] == "2"


def test_get_version_and_get_versioned_missing(fake_redis):
    assert fake_redis.hget("none", "version") is None
    assert blobstore.get_versioned(fake_redis, "none") is None


def test_missing_chunk_raises_blob_error_naming_key(fake_redis, monkeypatch):
    monkeypatch.setattr(blobstore, "CHUNK_BYTES", 4)
    blobstore.put_versioned(fake_redis, "rqrl:e:policy:p", b"0123456789", 1)
    fake_redis.hdel("rqrl:e:policy:p", "chunk:1")
    with pytest.raises(BlobError, match="rqrl:e:policy:p"):
        blobstore.get_versioned(fake_redis, "rqrl:e:policy:p")


def test_missing_header_raises_blob_error(fake_redis):
    fake_redis.hset("h", mapping={"version": 1, "chunk:0": b"abc"})
    with pytest.raises(BlobError, match="'h'|h:"):
        blobstore.get_versioned(fake_redis, "h")


def test_size_mismatch_raises_blob_error(fake_redis):
    blobstore.put_versioned(fake_redis, "rqrl:e:ckpt:latest", b"abcdef", 1)
    fake_redis.hset("rqrl:e:ckpt:latest", "nbytes", 99)
    with pytest.raises(BlobError) as ei:
        blobstore.get_versioned(fake_redis, "rqrl:e:ckpt:latest")
    assert "rqrl:e:ckpt:latest" in str(ei.value) and "99" in str(ei.value)


def test_get_many(fake_redis):
    fake_redis.set("d1", b"one", ex=100)
    fake_redis.set("d2", b"two", ex=50)
    assert blobstore.get_many(fake_redis, ["d1", "missing", "d2"]) == [b"one", None, b"two"]
    assert blobstore.get_many(fake_redis, []) == []


# ---------------------------------------------------------------- events

def test_emit_and_parse_roundtrip(fake_redis):
    eid = events.emit(fake_redis, "e1", "finished", "collector_task_abc", "collector", eval_flag=True,
                      reward_mean=12.5, env_steps=100)
    entries = fake_redis.xrange(keys.events("e1"))
    assert entries[0][0] == eid
    ev = events.parse(keys.events("e1"), eid, entries[0][1])
    assert ev["type"] == "finished" and ev["task_id"] == "collector_task_abc"
    assert ev["task_type"] == "collector" and ev["eval_flag"] is True
    assert ev["reward_mean"] == 12.5 and ev["env_steps"] == 100
    assert abs(ev["ts"] - time.time()) < 60


def test_emit_refuses_unknown_types(fake_redis):
    with pytest.raises(ValueError, match="bogus"):
        events.emit(fake_redis, "e", "bogus", "t", "collector")
    with pytest.raises(ValueError, match="evaluator"):
        events.emit(fake_redis, "e", "started", "t", "evaluator")
    assert fake_redis.xlen(keys.events("e")) == 0


def raw(**fields):
    return {k.encode(): str(v).encode() for k, v in fields.items()}


def test_parse_missing_type():
    with pytest.raises(MalformedEntry) as ei:
        events.parse("rqrl:e:events", b"5-0", raw(task_id="t", task_type="learner"))
    assert "'type'" in str(ei.value) and "5-0" in str(ei.value) and "rqrl:e:events" in str(ei.value)


def test_parse_unknown_type():
    with pytest.raises(MalformedEntry, match="unknown event type 'exploded'"):
        events.parse("s", b"1-1", raw(type="exploded", task_id="t", task_type="learner"))


def test_parse_unknown_task_type():
    with pytest.raises(MalformedEntry, match="task_type"):
        events.parse("s", "1-2", raw(type="failed", task_id="t", task_type="gpu"))


def test_parse_numeric_task_id_is_malformed():
    with pytest.raises(MalformedEntry, match="'task_id'"):
        events.parse("s", b"1-3", raw(type="failed", task_id="123", task_type="learner"))


def test_parse_missing_task_id():
    with pytest.raises(MalformedEntry, match="'task_id'"):
        events.parse("s", b"1-4", raw(type="failed", task_type="learner"))


def test_versioned_publishes_on_channel(fake_redis):
    ps = fake_redis.pubsub()
    ps.subscribe("chan")
    assert ps.get_message(timeout=1.0)["type"] == "subscribe"
    blobstore.put_versioned(fake_redis, "k", b"data", 4, channel="chan", message="4 100")
    assert ps.get_message(timeout=1.0)["data"] == b"4 100"
    assert blobstore.get_versioned(fake_redis, "k")[1] == b"data"
    ps.close()


def test_versioned_leased_write(fake_redis, monkeypatch):
    from common.scripts import LeaseRevoked

    monkeypatch.setattr(blobstore, "CHUNK_BYTES", 3)
    fake_redis.set("lease", "1")
    blobstore.put_versioned(fake_redis, "k", b"0123456789", 1, meta={"m": "x"}, lease_key="lease")
    meta, payload = blobstore.get_versioned(fake_redis, "k")
    assert payload == b"0123456789" and meta["m"] == "x" and meta["n_chunks"] == "4"
    fake_redis.delete("lease")
    with pytest.raises(LeaseRevoked, match="lease"):
        blobstore.put_versioned(fake_redis, "k", b"new", 2, lease_key="lease")
    assert blobstore.get_versioned(fake_redis, "k")[1] == b"0123456789"
