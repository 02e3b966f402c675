"""The collector's Redis I/O and waits (workers/comm_collector.py) on a real private redis-server.

* ``flush`` is refused, writing nothing, once the task's lease is revoked;
* chunks staged together go in one round trip, each counted once; a lost script cache is reloaded;
* the replay-ratio wait (collectors ahead of the learner's ``envstep_limit``) ends at a
  publication that admits the counter, at the stop flag, or after ``max_wait_s``;
* ``wait_for_policy`` ends at the first publication, at the stop flag, or raises after its timeout.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import redis

from common import keys
from common.scripts import LeaseRevoked
from workers.comm_collector import RedisCommCollector
from workers.publication import publish_policy

pytestmark = pytest.mark.redis_server

EXP, BUF, POL, TASK = "cc_exp", "buffer_cc", "policy_cc", "collector_task_cc"
WEIGHTS = {"w": np.ones((2, 2), np.float32)}


def make(conn, lease=True):
    if lease:
        conn.set(keys.lease(EXP, TASK), "1")
    task = {"exp_name": EXP, "task_id": TASK, "buffer_id": BUF, "policy_id": POL, "eval_flag": False}
    return RedisCommCollector(conn, task, data_ttl_s=600)


def stage(comm, data_id, env_steps=8):
    comm.send_stepdata(data_id, {"obs": np.zeros((env_steps, 4), np.float32)})
    comm.send_metadata({"data_id": data_id, "policy_version": 0, "n_samples": env_steps, "env_steps": env_steps})


def publish(conn, version, limit):
    publish_policy(conn, EXP, POL, WEIGHTS, version, limit)


_timers: list[threading.Timer] = []


def later(delay, fn, *args):
    """Run ``fn(*args)`` in ``delay`` seconds (cancelled at the test's end, so no test leaks into the next)."""
    t = threading.Timer(delay, fn, args)
    _timers.append(t)
    t.start()
    return t


@pytest.fixture(autouse=True)
def _cancel_timers():
    yield
    while _timers:
        t = _timers.pop()
        t.cancel()
        t.join()


def test_flush_sends_and_reads_the_policy_version(real_redis):
    comm = make(real_redis)
    publish(real_redis, 3, 10_000)
    stage(comm, "c_1")
    assert comm.flush(max_wait_s=1) is True  # version 3 is newer than none
    assert real_redis.xlen(keys.buffer_meta(EXP, BUF)) == 1 and int(real_redis.get(keys.envstep(EXP))) == 8
    assert comm.limiter_wait_s == 0.0


def test_flush_after_lease_revoked_writes_nothing(real_redis):
    comm = make(real_redis)
    publish(real_redis, 1, 10_000)
    stage(comm, "c_ok")
    comm.flush(max_wait_s=1)
    real_redis.delete(keys.lease(EXP, TASK))  # the coordinator declared the task dead
    stage(comm, "c_zombie")
    with pytest.raises(LeaseRevoked, match=keys.lease(EXP, TASK)):
        comm.flush(max_wait_s=1)
    assert real_redis.xlen(keys.buffer_meta(EXP, BUF)) == 1
    assert int(real_redis.get(keys.envstep(EXP))) == 8
    assert not real_redis.exists(keys.data(EXP, "c_zombie")) and not real_redis.exists(keys.data_staged(EXP, "c_zombie"))


def test_chunks_staged_together_go_in_one_round_trip(real_redis):
    comm = make(real_redis)
    publish(real_redis, 2, 10_000)
    for i in range(5):
        stage(comm, f"c_{i}", 4)
    sent = []
    real_send = redis.connection.Connection.send_packed_command
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(redis.connection.Connection, "send_packed_command",
                   lambda conn, cmd, check_health=True: (sent.append(cmd), real_send(conn, cmd, check_health))[1])
        assert comm.flush(max_wait_s=1) is True
    assert len(sent) == 1, "one write for all five chunks"
    stream = keys.buffer_meta(EXP, BUF)
    assert [e[1][b"data_id"] for e in real_redis.xrange(stream)] == [f"c_{i}".encode() for i in range(5)]
    assert int(real_redis.get(keys.envstep(EXP))) == 20
    assert real_redis.hget(keys.buffer_stats(EXP, BUF), "produced") == b"5"
    for i in range(5):
        assert real_redis.get(keys.data(EXP, f"c_{i}")) and not real_redis.exists(keys.data_staged(EXP, f"c_{i}"))
        assert 0 < real_redis.ttl(keys.data(EXP, f"c_{i}")) <= 600


def test_flush_all_staged_refused_when_the_lease_is_gone(real_redis):
    comm = make(real_redis)
    stage(comm, "c_a")
    stage(comm, "c_b")
    real_redis.delete(keys.lease(EXP, TASK))
    with pytest.raises(LeaseRevoked):
        comm.flush(max_wait_s=1)
    assert real_redis.keys(f"*{EXP}*data*") == [] and not real_redis.exists(keys.buffer_meta(EXP, BUF))


def test_flush_reloads_a_lost_script_cache(real_redis):
    comm = make(real_redis)
    publish(real_redis, 1, 10_000)
    stage(comm, "c_1")
    comm.flush(max_wait_s=1)
    real_redis.script_flush()  # as after a Redis restart
    stage(comm, "c_2")
    comm.flush(max_wait_s=1)
    assert real_redis.xlen(keys.buffer_meta(EXP, BUF)) == 2 and int(real_redis.get(keys.envstep(EXP))) == 16
    assert not real_redis.exists(keys.data_staged(EXP, "c_2")) and real_redis.exists(keys.data(EXP, "c_2"))


def test_metadata_without_its_stepdata_is_an_error(real_redis):
    comm = make(real_redis)
    comm.send_stepdata("c_1", {"obs": np.zeros((2, 4), np.float32)})
    with pytest.raises(ValueError, match="c_2"):
        comm.send_metadata({"data_id": "c_2", "policy_version": 0})


def test_flush_without_staged_chunk_is_an_error(real_redis):
    with pytest.raises(ValueError, match=TASK):
        make(real_redis).flush()


def test_wait_for_learner_ends_at_an_admitting_publication(real_redis):
    comm = make(real_redis)
    publish(real_redis, 1, 4)  # the collectors may send 4 env steps; this chunk brings 8
    stage(comm, "c_1")
    later(0.3, publish, real_redis, 2, 6)    # not enough: keep waiting
    later(0.6, publish, real_redis, 3, 100)  # admits 8
    t0 = time.monotonic()
    assert comm.flush(max_wait_s=10) is True
    waited = time.monotonic() - t0
    assert 0.5 < waited < 3.0, waited
    assert comm.limiter_wait_s == pytest.approx(waited, abs=0.1)


def test_wait_for_learner_ends_at_the_stop_flag(real_redis):
    comm = make(real_redis)
    publish(real_redis, 1, 4)
    stage(comm, "c_1")
    later(0.3, real_redis.set, keys.stop(EXP), "converged")
    t0 = time.monotonic()
    comm.flush(max_wait_s=10)
    assert time.monotonic() - t0 < 3.0  # the stop flag is re-read at least every 0.5 s (10 s if never)
    assert comm.stop_flag is True


def test_wait_for_learner_gives_up_after_max_wait(real_redis):
    comm = make(real_redis)
    publish(real_redis, 1, 4)
    stage(comm, "c_1")
    t0 = time.monotonic()
    assert comm.flush(max_wait_s=0.8) is True  # the held version (none) is older than 1
    waited = time.monotonic() - t0
    assert 0.7 < waited < 3.0, waited
    assert comm.stop_flag is False


def test_no_wait_when_stop_flag_already_set(real_redis):
    comm = make(real_redis)
    publish(real_redis, 1, 4)
    real_redis.set(keys.stop(EXP), "done")
    stage(comm, "c_1")
    t0 = time.monotonic()
    comm.flush(max_wait_s=10)
    assert time.monotonic() - t0 < 2.0 and comm.stop_flag  # no wait (10 s if it waited)


def test_wait_for_policy_returns_at_first_publication(real_redis):
    comm = make(real_redis)
    later(0.3, publish, real_redis, 0, 100)
    t0 = time.monotonic()
    comm.wait_for_policy(timeout_s=10)
    assert 0.2 < time.monotonic() - t0 < 3.0
    assert comm.get_policy_update_info()["w"].tolist() == WEIGHTS["w"].tolist()
    assert comm.policy_version == 0
    comm.close()


def test_wait_for_policy_returns_at_stop_flag(real_redis):
    comm = make(real_redis)
    later(0.3, real_redis.set, keys.stop(EXP), "cancelled")
    t0 = time.monotonic()
    comm.wait_for_policy(timeout_s=10)
    assert time.monotonic() - t0 < 3.0 and comm.stop_flag is True


def test_wait_for_policy_times_out_naming_the_key(real_redis):
    comm = make(real_redis)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=keys.policy(EXP, POL)):
        comm.wait_for_policy(timeout_s=0.7)
    assert 0.6 < time.monotonic() - t0 < 3.0
