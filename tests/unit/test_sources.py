"""Unit tests for the learner's data sources (workers/sources/) and the collector's ChunkBuilder.

No subprocesses: a fake learner (``train_iter`` / ``consumed_env_steps``), a fake buffer reader
(``env_steps`` / ``env_steps_base`` / ``error``) and fakeredis for the stop flag.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from common import keys
from common.config import compile_config
from workers.collector import ChunkBuilder
from workers.sources import create_source
from workers.sources.on_policy import OnPolicySource, RolloutQueue
from workers.sources.replay import ReplayFeeder, envstep_limit_after, ratio_allows

EXP = "src_test"
SCHEMA = {"obs": ((2,), np.dtype(np.float32)), "action": ((), np.dtype(np.int64)), "adv": ((), np.dtype(np.float32))}


def chunk(n: int, tag: float) -> dict[str, np.ndarray]:
    """``n`` rows whose ``adv`` column is ``tag`` (to tell chunks apart) and ``action`` 0..n-1."""
    return {"obs": np.full((n, 2), tag, np.float32), "action": np.arange(n, dtype=np.int64),
            "adv": np.full(n, tag, np.float32)}


class FakeLearner:
    def __init__(self, train_iter: int = 0, consumed_env_steps: int = 0) -> None:
        self.train_iter = train_iter
        self.consumed_env_steps = consumed_env_steps


def fake_reader(env_steps: int = 0, env_steps_base: int = 0):
    return SimpleNamespace(env_steps=env_steps, env_steps_base=env_steps_base, error=None)


# ---------------------------------------------------------------- RolloutQueue

def test_rollout_queue_keeps_current_version_and_counts_stale_ones():
    learner = FakeLearner(train_iter=3)
    q = RolloutQueue(SCHEMA, lambda: learner.train_iter)
    q.extend(chunk(4, 3.0), 3)
    q.extend(chunk(5, 2.0), 2)  # older version: dropped on arrival
    q.extend(chunk(6, 4.0), 4)  # another version: dropped too
    q.extend(chunk(2, 3.5), 3)
    assert (q.stale_chunks, q.stale_rows) == (2, 11)
    assert q.pushed == 6 and len(q) == 6 and q.rows(3) == 6 and q.rows(2) == 0


def test_rollout_queue_take_returns_exactly_the_rows_of_a_version_and_drops_the_rest():
    learner = FakeLearner(train_iter=3)
    q = RolloutQueue(SCHEMA, lambda: learner.train_iter)
    q.extend(chunk(4, 3.0), 3)
    q.extend(chunk(2, 3.5), 3)
    learner.train_iter = 4  # the learner moved on while rows of version 3 were waiting
    q.extend(chunk(3, 4.0), 4)
    out = q.take(4)
    assert set(out) == set(SCHEMA)
    np.testing.assert_array_equal(out["adv"], [4.0, 4.0, 4.0])
    np.testing.assert_array_equal(out["action"], [0, 1, 2])
    assert out["obs"].shape == (3, 2) and out["obs"].dtype == np.float32
    # Version-3 rows were never returned: dropped and counted when version 4 was taken.
    assert (q.stale_chunks, q.stale_rows) == (2, 6)
    assert len(q) == 0


def test_rollout_queue_take_concatenates_in_arrival_order_and_casts_to_schema():
    learner = FakeLearner(train_iter=0)
    q = RolloutQueue(SCHEMA, lambda: learner.train_iter)
    a = chunk(2, 1.0)
    a["action"] = a["action"].astype(np.int32)  # cast to the schema dtype on the way in
    q.extend(a, 0)
    q.extend(chunk(3, 2.0), 0)
    out = q.take(0)
    np.testing.assert_array_equal(out["adv"], [1, 1, 2, 2, 2])
    np.testing.assert_array_equal(out["action"], [0, 1, 0, 1, 2])
    assert out["action"].dtype == np.int64
    assert (q.stale_chunks, q.stale_rows) == (0, 0)


def test_rollout_queue_check_names_the_bad_field():
    q = RolloutQueue(SCHEMA, lambda: 0)
    assert q.check(chunk(3, 0.0), "chunk c1") == 3
    bad = chunk(3, 0.0)
    bad["obs"] = np.zeros((3, 5), np.float32)
    with pytest.raises(ValueError, match="chunk c1.*'obs'"):
        q.check(bad, "chunk c1")


# ---------------------------------------------------------------- OnPolicySource

@pytest.fixture
def ppo_cfg():
    return compile_config({"exp_name": EXP, "policy": {"collect": {"n_sample": 8}}}, {"policy": {"type": "ppo"}})


def waiting_call(src):
    """Call ``src()`` on a thread; returns (thread, results, event set once the call waits on its
    condition: nothing to train on yet). A spy on the wait: the test synchronises on it, not on time."""
    waiting = threading.Event()
    wait = src._cond.wait

    def spy(timeout=None):
        waiting.set()
        return wait(timeout)

    src._cond.wait = spy
    result: list = []
    t = threading.Thread(target=lambda: result.append(src()), daemon=True)
    t.start()
    assert waiting.wait(10), "the call never waited"
    return t, result


def test_on_policy_source_returns_none_once_the_stop_flag_exists(fake_redis, ppo_cfg):
    src = create_source("on_policy", fake_redis, EXP, FakeLearner(), ppo_cfg, SCHEMA, seed=0)
    fake_redis.set(keys.stop(EXP), "converged")
    t0 = time.monotonic()
    assert src() is None
    assert time.monotonic() - t0 < 1.0


def test_on_policy_source_stop_flag_ends_a_waiting_call(fake_redis, ppo_cfg):
    src = create_source("on_policy", fake_redis, EXP, FakeLearner(), ppo_cfg, SCHEMA, seed=0)
    t, result = waiting_call(src)  # nothing to train on: it waits
    assert result == []
    fake_redis.set(keys.stop(EXP), "converged")
    t.join(timeout=5)
    assert not t.is_alive() and result == [None]


def test_on_policy_source_waits_for_n_sample_rows_of_the_current_version(fake_redis, ppo_cfg):
    learner = FakeLearner(train_iter=2, consumed_env_steps=40)
    src = create_source("on_policy", fake_redis, EXP, learner, ppo_cfg, SCHEMA, seed=0)
    assert isinstance(src, OnPolicySource) and src.publish_every_iter
    src.store.extend(chunk(5, 2.0), 2)
    src.store.extend(chunk(30, 1.0), 1)  # stale: does not count towards n_sample
    assert not src._ready(0)
    t, result = waiting_call(src)  # 5 of 8 rows
    assert result == []
    src.store.extend(chunk(4, 2.5), 2)
    src.notify()
    t.join(timeout=5)
    assert not t.is_alive()
    batch = result[0]
    np.testing.assert_array_equal(batch["adv"], [2.0] * 5 + [2.5] * 4)  # all 9 rows of version 2, nothing else
    assert src.stats() == {"buffer_size": 0, "pushed": 9, "stale_chunks": 1, "stale_rows": 30}
    assert learner.consumed_env_steps == 40  # no reader: the learner's own count


def test_on_policy_source_raises_when_the_reader_failed(fake_redis, ppo_cfg):
    src = create_source("on_policy", fake_redis, EXP, FakeLearner(), ppo_cfg, SCHEMA, seed=0)
    src.reader = fake_reader()
    src.reader.error = ConnectionError("redis went away")
    with pytest.raises(RuntimeError, match="buffer reader failed.*redis went away"):
        src()


# ---------------------------------------------------------------- ReplayFeeder (replay-ratio limiter)

@pytest.fixture
def dqn_cfg():
    return compile_config({"exp_name": EXP, "policy": {
        "learn": {"batch_size": 4, "train_iter_per_env_step": 0.5, "max_env_step_lead": 256},
        "other": {"replay_buffer": {"replay_buffer_size": 1000, "replay_start_size": 10}}}})


def feeder(conn, cfg, learner, reader):
    src = create_source("replay", conn, EXP, learner, cfg, SCHEMA, seed=0)
    assert isinstance(src, ReplayFeeder)
    src.reader = reader
    return src


def iterations_allowed(src, learner, cap=10_000) -> int:
    """Train iterations the limiter lets through before it blocks (as the trainer loop would)."""
    n = 0
    while n < cap and src._ready(src.envstep()):
        learner.train_iter += 1
        n += 1
    return n


def test_replay_ratio_limits_iterations_per_env_step(fake_redis, dqn_cfg):
    learner, reader = FakeLearner(), fake_reader(env_steps=100)
    src = feeder(fake_redis, dqn_cfg, learner, reader)
    src.store.extend(chunk(20, 0.0))
    # Learning starts at replay_start_size (10) env steps: one iteration there, then 0.5 per env
    # step over the other 90: iterations 0..45 run, the 47th waits.
    assert iterations_allowed(src, learner) == 46
    assert not src.ratio_ok(src.envstep())
    reader.env_steps = 110  # ten more env steps: five more iterations
    assert iterations_allowed(src, learner) == 5


@pytest.mark.parametrize("start, ratio", [(10, 0.5), (10_000, 1.0), (2000, 0.25)])
def test_no_catch_up_once_learning_starts(fake_redis, dqn_cfg, start, ratio):
    # SAC HalfCheetah: 10k random warm-up env steps at one update per env step. Counted from env
    # step 0, the learner would owe 10k updates at the start while collectors wait.
    dqn_cfg.policy.other.replay_buffer.update(replay_start_size=start, replay_buffer_size=start + 100)
    dqn_cfg.policy.learn.train_iter_per_env_step = ratio
    learner, reader = FakeLearner(), fake_reader(env_steps=start - 1)
    src = feeder(fake_redis, dqn_cfg, learner, reader)
    src.store.extend(chunk(20, 0.0))
    assert iterations_allowed(src, learner) == 0  # warm-up
    reader.env_steps = start
    assert iterations_allowed(src, learner) == 1  # learning starts: one iteration, no more
    reader.env_steps = start + 100
    assert iterations_allowed(src, learner) == int(100 * ratio)  # then the ratio, per env step
    # Collectors may run max_env_step_lead (256) past what the next iteration needs, no further.
    assert src.envstep_limit(learner.train_iter) == start + 100 + round(1 / ratio) + 256


def test_replay_ratio_counts_from_this_learners_start(fake_redis, dqn_cfg):
    # A restarted learner: 1000 env steps consumed and 7 iterations done before it started. Its
    # buffer starts empty, so it refills replay_start_size (10) env steps, then trains at the ratio.
    learner, reader = FakeLearner(train_iter=7), fake_reader(env_steps=0, env_steps_base=1000)
    src = feeder(fake_redis, dqn_cfg, learner, reader)
    src.store.extend(chunk(20, 0.0))
    assert src.envstep() == 1000
    assert iterations_allowed(src, learner) == 0  # nothing new consumed yet
    reader.env_steps = 9
    assert iterations_allowed(src, learner) == 0  # the refill is not done
    reader.env_steps = 100
    assert src.envstep() == 1100
    assert iterations_allowed(src, learner) == 1 + 45
    assert learner.train_iter == 7 + 46


def test_replay_waits_for_replay_start_size_env_steps_and_a_row(fake_redis, dqn_cfg):
    learner, reader = FakeLearner(), fake_reader(env_steps=9)
    src = feeder(fake_redis, dqn_cfg, learner, reader)
    src.store.extend(chunk(9, 0.0))
    assert not src._ready(src.envstep())
    reader.env_steps = 10
    assert src._ready(src.envstep())
    batch = src._take()
    assert batch["obs"].shape == (4, 2)
    empty = feeder(fake_redis, dqn_cfg, FakeLearner(), fake_reader(env_steps=1000))
    assert not empty._ready(empty.envstep())  # nothing to sample yet


def test_replay_ratio_zero_disables_the_limiter_past_the_start(fake_redis, dqn_cfg):
    dqn_cfg.policy.learn.train_iter_per_env_step = 0.0
    learner, reader = FakeLearner(), fake_reader(env_steps=0)
    src = feeder(fake_redis, dqn_cfg, learner, reader)
    src.store.extend(chunk(20, 0.0))
    assert iterations_allowed(src, learner) == 0
    reader.env_steps = 10
    assert iterations_allowed(src, learner, cap=500) == 500
    assert src.envstep_limit(10**6) >= 2**62


def test_envstep_limit_grows_with_train_iter(fake_redis, dqn_cfg):
    learner, reader = FakeLearner(train_iter=7), fake_reader(env_steps=40, env_steps_base=1000)
    src = feeder(fake_redis, dqn_cfg, learner, reader)
    src.envstep()  # first call fixes the base (as the learner's before_run does)
    # base 1000 + replay_start_size 10 + iterations / 0.5 + lead 256
    assert src.envstep_limit(7) == 1000 + 10 + 256
    assert src.envstep_limit(7 + 100) == 1000 + 10 + 200 + 256
    assert src.envstep_limit(7 + 1000) == 1000 + 10 + 2000 + 256
    limits = [src.envstep_limit(i) for i in range(7, 2000, 97)]
    assert limits == sorted(limits) and limits[-1] > limits[0]
    # Env steps the reader consumed since do not move the base.
    reader.env_steps = 500
    assert src.envstep_limit(107) == 1000 + 10 + 200 + 256


@pytest.mark.parametrize("ratio", [0.1, 0.25, 0.29, 0.5, 1.0, 2.0, 4.0])
def test_envstep_limit_admits_exactly_what_the_next_iteration_needs(ratio):
    # With no lead, collectors may send exactly the env steps that let the learner make its next
    # iteration: a larger limit would run ahead of the ratio, a smaller one would deadlock.
    start = 50
    for iters in range(0, 400):
        limit = envstep_limit_after(iters, start, ratio, lead=0)
        assert ratio_allows(iters, limit, start, ratio)
        assert not ratio_allows(iters, limit - 1, start, ratio)
        assert envstep_limit_after(iters, start, ratio, lead=7) == limit + 7


def test_replay_feeder_call_returns_a_sampled_batch_then_none_at_stop(fake_redis, dqn_cfg, monkeypatch):
    import workers.sources

    monkeypatch.setattr(workers.sources, "_STOP_CHECK_S", 0.0)  # every call reads the stop flag
    learner = FakeLearner()
    src = feeder(fake_redis, dqn_cfg, learner, fake_reader(env_steps=100))
    src.store.extend(chunk(20, 0.0))
    batch = src()
    assert batch["obs"].shape == (4, 2) and batch["action"].dtype == np.int64
    assert learner.consumed_env_steps == 100  # the source keeps the learner's env-step count current
    fake_redis.set(keys.stop(EXP), "converged")
    assert src() is None


def test_create_source_refuses_unknown_kind(fake_redis, dqn_cfg):
    with pytest.raises(KeyError, match="'bogus'"):
        create_source("bogus", fake_redis, EXP, FakeLearner(), dqn_cfg, SCHEMA, seed=0)


# ---------------------------------------------------------------- ChunkBuilder

def test_chunk_builder_concatenates_reports_full_and_tags_min_version():
    b = ChunkBuilder(n_sample=6)
    assert b.add(None, 9) is False and b.size == 0 and b.version is None
    assert b.add(chunk(2, 1.0), 5) is False
    assert b.add(chunk(3, 2.0), 4) is False
    assert b.add(None, 1) is False  # no rows: the version of nothing does not count
    assert b.version == 4
    assert b.add(chunk(2, 3.0), 6) is True  # 7 >= 6: full; rows are never split
    assert b.size == 7 and b.version == 4
    out = b.take()
    np.testing.assert_array_equal(out["adv"], [1, 1, 2, 2, 2, 3, 3])
    np.testing.assert_array_equal(out["action"], [0, 1, 0, 1, 2, 0, 1])
    assert out["obs"].shape == (7, 2)
    assert (b.size, b.version) == (0, None)
    # A fresh chunk after take.
    assert b.add(chunk(6, 4.0), 8) is True and b.version == 8
    np.testing.assert_array_equal(b.take()["adv"], [4.0] * 6)


def test_chunk_builder_single_part_and_n_sample_one():
    b = ChunkBuilder(n_sample=1)
    part = chunk(3, 1.0)
    assert b.add(part, 0) is True
    out = b.take()
    for k in part:
        np.testing.assert_array_equal(out[k], part[k])
