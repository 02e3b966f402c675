"""The step-data store (common/step_data.py) on fakeredis's Lua.

* lease fencing: a revoked lease refuses its holder's chunk sends, acks and policy publishes,
  leaving Redis exactly as it was, while another task's lease on the same run still writes;
* a resent chunk (the same data_id sent again, as a retry after a lost reply) adds no stream
  entry and no env steps, and counts ``resent`` once;
* the run-wide drops and the resume accounting.
"""

from __future__ import annotations

import pytest

from common import blobstore, keys, streams
from common.scripts import LeaseRevoked
from common.step_data import AckEntry, Chunk, StepDataStore

NS, BUF, POL = "sd_exp/r1", "buffer_sd", "policy_sd"
ZOMBIE, LIVE = "collector_task_zombie", "collector_task_live"
LEARNER_ZOMBIE, LEARNER_LIVE = "learner_task_zombie", "learner_task_live"
POLICY = keys.policy(NS, POL)


def chunk(data_id: str, env_steps: int = 8) -> Chunk:
    fields = streams.encode_fields({"data_id": data_id, "n_samples": env_steps, "env_steps": env_steps,
                                    "policy_version": 0})
    return Chunk(data_id, b"blob-" + data_id.encode(), env_steps, fields)


def put(store: StepDataStore, task_id: str, *chunks: Chunk):
    return store.put(list(chunks), keys.lease(NS, task_id), POLICY, ttl_s=600, maxlen=1000)


def redis_state(conn) -> dict:
    """Every key's type and content, a stream's consumer groups with their pending entries: what
    a refused write must leave as it was."""
    state = {}
    for k in sorted(conn.keys("*")):
        typ = conn.type(k).decode()
        if typ == "string":
            state[k] = conn.get(k)
        elif typ == "hash":
            state[k] = conn.hgetall(k)
        elif typ == "stream":
            groups = {g["name"]: [(p["message_id"], p["consumer"], p["times_delivered"])
                                  for p in conn.xpending_range(k, g["name"], "-", "+", 1000)]
                      for g in conn.xinfo_groups(k)}
            state[k] = (conn.xrange(k), groups)
        else:
            state[k] = typ
    return state


@pytest.fixture
def run(fake_redis):
    """A run with a published policy, two collector tasks and two learner tasks, all leased."""
    for task_id in (ZOMBIE, LIVE, LEARNER_ZOMBIE, LEARNER_LIVE):
        fake_redis.set(keys.lease(NS, task_id), "1")
    blobstore.put_versioned(fake_redis, POLICY, b"weights-3", 3, meta={"envstep_limit": 1000})
    store = StepDataStore(fake_redis, NS, BUF)
    store.ensure_group()
    return fake_redis, store


def test_a_revoked_lease_refuses_the_holders_chunk_send_but_not_another_tasks(run):
    conn, store = run
    put(store, ZOMBIE, chunk("c_before"))
    conn.delete(keys.lease(NS, ZOMBIE))  # the coordinator declared the task dead
    before = redis_state(conn)
    with pytest.raises(LeaseRevoked):
        put(store, ZOMBIE, chunk("c_zombie_1"), chunk("c_zombie_2"))
    assert redis_state(conn) == before  # no blob, no staged blob, no stream entry, counters as they were

    sent = put(store, LIVE, chunk("c_live", 5))
    assert sent.counter == 13 and sent.policy_version == b"3" and sent.envstep_limit == b"1000"
    assert [f[b"data_id"] for _, f in conn.xrange(store.meta_key)] == [b"c_before", b"c_live"]
    assert store.stats() == {"produced": 2, "produced_env_steps": 13}


def test_a_revoked_lease_refuses_the_holders_ack_but_not_another_tasks(run):
    conn, store = run
    put(store, LIVE, chunk("c_1"), chunk("c_2"))
    entries = store.read(LEARNER_ZOMBIE, 10, 1)
    plan = [AckEntry(eid, store.data_key(f[b"data_id"].decode()), 8, "consumed") for eid, f in entries]
    conn.delete(keys.lease(NS, LEARNER_ZOMBIE))
    before = redis_state(conn)
    with pytest.raises(LeaseRevoked):
        store.ack(keys.lease(NS, LEARNER_ZOMBIE), plan)
    assert redis_state(conn) == before  # still pending, blobs not emptied, nothing counted

    for _ in store.claim(LEARNER_LIVE, 10):  # the replacement takes the zombie's entries over
        pass
    assert store.ack(keys.lease(NS, LEARNER_LIVE), plan) == [1, 1]
    assert store.pending_ids(LEARNER_LIVE, 10) == [] and store.pending_ids(LEARNER_ZOMBIE, 10) == []
    assert store.blobs([e.data_key for e in plan]) == [b"", b""]  # tombstones
    assert store.stats()["consumed"] == 2 and store.consumed_env_steps() == 16


def test_a_revoked_lease_refuses_the_holders_policy_publish_but_not_another_tasks(run):
    conn, _ = run
    conn.delete(keys.lease(NS, LEARNER_ZOMBIE))
    pubsub = conn.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.policy_updates(NS, POL))
    before = redis_state(conn)
    with pytest.raises(LeaseRevoked):
        blobstore.put_versioned(conn, POLICY, b"weights-zombie", 9, lease_key=keys.lease(NS, LEARNER_ZOMBIE),
                                channel=keys.policy_updates(NS, POL), message="9 0")
    assert redis_state(conn) == before and pubsub.get_message(timeout=0) is None

    blobstore.put_versioned(conn, POLICY, b"weights-live", 4, lease_key=keys.lease(NS, LEARNER_LIVE),
                            channel=keys.policy_updates(NS, POL), message="4 0")
    meta, payload = blobstore.get_versioned(conn, POLICY)
    assert int(meta["version"]) == 4 and payload == b"weights-live"
    assert pubsub.get_message(timeout=0)["data"] == b"4 0"


def test_a_resent_chunk_counts_no_env_steps_twice(run):
    conn, store = run
    first = put(store, LIVE, chunk("c_1"))
    again = put(store, LIVE, chunk("c_1"))  # the reply to the first was lost: the collector retries
    assert first.counter == again.counter == 8
    assert int(conn.get(keys.envstep(NS))) == 8
    assert conn.xlen(store.meta_key) == 1
    assert store.stats() == {"produced": 1, "produced_env_steps": 8, "resent": 1}


def test_a_chunk_resent_after_its_consumption_counts_nothing_twice(run):
    conn, store = run
    put(store, LIVE, chunk("c_1"))
    (eid, _), = store.read(LEARNER_LIVE, 10, 1)
    store.ack(keys.lease(NS, LEARNER_LIVE), [AckEntry(eid, store.data_key("c_1"), 8, "consumed")])
    put(store, LIVE, chunk("c_1"))  # the tombstone still stands for the consumed blob
    assert store.blobs([store.data_key("c_1")]) == [b""] and store.read(LEARNER_LIVE, 10, 1) == []
    assert int(conn.get(keys.envstep(NS))) == 8
    assert store.stats() == {"produced": 1, "produced_env_steps": 8, "resent": 1, "consumed": 1, "env_steps": 8}


def test_put_reads_back_an_unreadable_policy_as_an_error(run):
    conn, store = run
    conn.delete(POLICY)
    conn.set(POLICY, "not a hash")
    sent = put(store, LIVE, chunk("c_1"))
    assert POLICY in sent.policy_error and sent.policy_version is None
    assert store.stats()["produced"] == 1  # the chunk itself went


def test_put_refuses_a_bad_data_id_before_sending_anything(run):
    conn, store = run
    before = redis_state(conn)
    with pytest.raises(ValueError, match="data_id"):
        put(store, LIVE, chunk("c_1"), chunk("bad id"))
    assert redis_state(conn) == before


def test_buffer_operations_need_a_buffer_id(fake_redis):
    with pytest.raises(ValueError, match="buffer_id"):
        StepDataStore(fake_redis, NS).stats()


def test_drop_run_deletes_the_step_data_of_that_run_only(run):
    conn, store = run
    put(store, LIVE, chunk("c_1"), chunk("c_2"))
    other = StepDataStore(conn, "sd_exp/r2", BUF)
    other.ensure_group()
    other.put([chunk("c_1")], keys.lease(NS, LIVE), POLICY, ttl_s=600, maxlen=1000)
    assert StepDataStore(conn, NS).drop_run() == 4  # two blobs, the stream and the stats hash
    assert store.blobs([store.data_key("c_1"), store.data_key("c_2")]) == [None, None]
    assert store.stats() == {} and not conn.exists(store.meta_key)
    assert conn.exists(keys.lease(NS, LIVE)) and conn.exists(POLICY)  # control keys stay
    assert other.stats()["produced"] == 1 and other.blobs([other.data_key("c_1")]) != [None]


def test_drop_blobs_keeps_the_stream_and_drop_stream_takes_it(run):
    conn, store = run
    put(store, LIVE, chunk("c_1"))
    assert store.drop_blobs() == 1 and conn.xlen(store.meta_key) == 1
    assert store.drop_stream() == 1 and not conn.exists(store.meta_key)


def test_consumed_env_steps_round_trip(run):
    _, store = run
    store.set_consumed_env_steps(1234)
    assert store.consumed_env_steps() == 1234 and store.stats() == {"env_steps": 1234}
