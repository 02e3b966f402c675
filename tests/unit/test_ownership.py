"""coordinator.ownership.Ownership: the run's ownership key across Redis stalls and dropped replies."""

from __future__ import annotations

import logging

import pytest

from common import keys
from coordinator.errors import CoordinatorError, RunLost
from coordinator.ownership import Ownership

EXP = "exp/r1"


@pytest.fixture
def owned(fake_redis):
    fake_redis.set(keys.run(EXP), "run-id")
    o = Ownership(fake_redis, EXP, "coordinator-a-1", logging.getLogger("test"))
    assert o.claim(fresh=True, from_folder=False) == "fresh"
    return o


def test_a_take_back_whose_reply_was_lost_keeps_the_run(owned, fake_redis):
    """The key expired during a Redis pause; the coordinator's SET NX to take it back lands, the
    connection drops before the reply, and the client's retry finds the key taken by the
    coordinator itself (the Redis 6.2 tier's CLIENT PAUSE + CLIENT KILL test stopped on "lost
    ownership of ... to" its own name)."""
    fake_redis.delete(owned.key)
    real = owned.lock.do_acquire

    def landed_but_reply_lost(token):
        assert real(token)
        return False  # the retried SET NX

    owned.lock.do_acquire = landed_but_reply_lost
    owned.keep_alive()
    assert fake_redis.get(owned.key) == b"coordinator-a-1"
    owned.keep_alive()  # and it goes on extending its own key
    assert 0 < fake_redis.pttl(owned.key) <= 6000


def test_a_key_taken_by_another_coordinator_is_lost_naming_it(owned, fake_redis):
    fake_redis.set(owned.key, "coordinator-b-2", px=6000)
    with pytest.raises(RunLost, match="lost ownership of 'exp/r1' to coordinator-b-2"):
        owned.keep_alive()


def test_a_claim_of_a_run_another_coordinator_owns_is_refused_naming_it(fake_redis, monkeypatch):
    monkeypatch.setattr("coordinator.ownership.ALIVE_TTL_S", 0.2)
    fake_redis.set(keys.coordinator_alive(EXP), "coordinator-b-2", px=60000)
    o = Ownership(fake_redis, EXP, "coordinator-a-1", logging.getLogger("test"))
    with pytest.raises(CoordinatorError, match="owned by coordinator-b-2"):
        o.claim(fresh=True, from_folder=False)


def test_clear_run_keys_drops_the_earlier_runs_step_data_and_keeps_the_ownership_key(owned, fake_redis, caplog):
    from common.step_data import Chunk, StepDataStore

    fake_redis.set(keys.lease(EXP, "collector_task_1"), "1")
    earlier = StepDataStore(fake_redis, EXP, "buffer_1")
    earlier.put([Chunk("c_1", b"blob", 4, {"data_id": "c_1"})], keys.lease(EXP, "collector_task_1"),
                keys.policy(EXP, "policy_1"), ttl_s=600, maxlen=100)
    other = StepDataStore(fake_redis, "exp/r2", "buffer_1")
    other.set_consumed_env_steps(7)
    with caplog.at_level(logging.INFO):
        owned.clear_run_keys()
    # the blob, the stream, the stats, the envstep counter, the lease, the run id
    assert "cleared 6 keys" in caplog.text
    assert fake_redis.keys(f"{keys.exp_prefix(EXP)}:*") == [owned.key.encode()]
    assert other.consumed_env_steps() == 7
