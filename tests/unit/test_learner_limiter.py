"""The learner side of the replay-ratio limiter (``ReplayFeeder`` in workers/sources/replay.py).

The feeder hands the trainer a batch only once ``e = env steps - base env steps`` reached
``replay_start_size`` and the buffer holds a row, and while
``train_iter - base_iter <= train_iter_per_env_step * (e - replay_start_size)`` (one iteration at
the start, then the ratio: no catch-up for the warm-up). The bases are the learner's train_iter
and the buffer's consumed env steps when it started (after a resume: the checkpoint's
train_iter and the durable count in the buffer stats). It also computes the ``envstep_limit``
published to collectors. Reader and learner are stand-ins with the attributes the feeder reads;
the feeder itself is the real one. A call that must wait is shown to have run its loop (it set
``consumed_env_steps``) and then to end with None at the stop flag, not with a batch.
"""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from easydict import EasyDict

from common import keys
from common.config import ConfigError, apply_overrides, compile_config, min_env_step_lead
from workers.sources import create_source
from workers.sources.replay import envstep_limit_after, ratio_allows

RATIO, LEAD, START, BATCH = 0.5, 256, 64, 32
SCHEMA = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
          "next_obs": ((4,), np.float32), "done": ((), np.bool_), "discount": ((), np.float32)}


@pytest.fixture
def cfg(small_cfg):
    c = EasyDict(copy.deepcopy(small_cfg))
    c.policy.learn.update(train_iter_per_env_step=RATIO, max_env_step_lead=LEAD, batch_size=BATCH)
    c.policy.other.replay_buffer.replay_start_size = START
    return c


def rows(n):
    return {"obs": np.zeros((n, 4), np.float32), "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
            "next_obs": np.zeros((n, 4), np.float32), "done": np.zeros(n, bool), "discount": np.ones(n, np.float32)}


def make(fake_redis, cfg, train_iter=0, base_envstep=0, filled=START):
    learner = SimpleNamespace(train_iter=train_iter, consumed_env_steps=0)
    feeder = create_source("replay", fake_redis, cfg.exp_name, learner, cfg, SCHEMA, seed=0)
    buf = feeder.store
    if filled:
        buf.extend(rows(filled))
    feeder.reader = SimpleNamespace(env_steps=0, env_steps_base=base_envstep, error=None)
    return feeder, learner, buf


class Call:
    """``feeder()`` in a thread, so a test can tell "returned" from "waiting": a spy on the
    feeder's condition wait marks the moment it decided there is no batch yet (no wall-time guess)."""

    def __init__(self, feeder):
        self.result = self.error = None
        self._waiting = threading.Event()
        wait = feeder._cond.wait

        def spy(timeout=None):
            self._waiting.set()
            return wait(timeout)

        feeder._cond.wait = spy
        self._t = threading.Thread(target=self._run, args=(feeder,), daemon=True)
        self._t.start()

    def _run(self, feeder):
        try:
            self.result = feeder()
        except BaseException as e:
            self.error = e

    def returned(self, within=10.0):
        self._t.join(within)
        return not self._t.is_alive()

    def waits(self, within=10.0):
        """True once the call waits for data (it ran its checks and found no batch), having returned nothing."""
        return self._waiting.wait(within) and self._t.is_alive() and self.error is None


def release(conn, cfg, call):
    """End a waiting call the way a run ends: the stop flag."""
    conn.set(keys.stop(cfg.exp_name), "test over")
    assert call.returned(), "the feeder did not return at the stop flag"
    assert call.result is None


def test_no_batch_before_replay_start_size_env_steps(fake_redis, cfg):
    feeder, learner, _ = make(fake_redis, cfg)
    feeder.envstep_limit(0)  # before_run: the bases are taken at train_iter 0
    feeder.reader.env_steps = START - 1
    learner.consumed_env_steps = -1
    call = Call(feeder)
    assert call.waits() and learner.consumed_env_steps == START - 1
    feeder.reader.env_steps = START
    feeder.notify()
    assert call.returned() and call.result["obs"].shape == (BATCH, 4)


@pytest.mark.parametrize("train_iter, env_steps, allowed", [
    (0, 0, False),               # nothing consumed yet
    (0, START - 1, False),       # warm-up
    (0, START, True),            # learning starts: the first iteration
    (1, START, False),           # no catch-up of 0.5 x START iterations for the warm-up
    (1, START + 1, False),       # 1 > 0.5 * 1
    (1, START + 2, True),        # 1 <= 0.5 * 2
    (32, START + 64, True),      # 32 <= 32
    (33, START + 64, False),
    (33, START + 66, True),
])
def test_ratio_ok(fake_redis, cfg, train_iter, env_steps, allowed):
    feeder, learner, _ = make(fake_redis, cfg)
    feeder.envstep_limit(0)  # before_run: the bases are taken at train_iter 0
    learner.train_iter = train_iter
    feeder.reader.env_steps = env_steps
    assert feeder.ratio_ok(env_steps) is allowed
    learner.consumed_env_steps = -1
    call = Call(feeder)
    if allowed:
        assert call.returned() and call.result["reward"].shape == (BATCH,)
    else:
        assert call.waits()
        release(fake_redis, cfg, call)
    assert learner.consumed_env_steps == env_steps


def test_waiting_trainer_wakes_when_env_steps_arrive(fake_redis, cfg):
    feeder, learner, _ = make(fake_redis, cfg)
    feeder.envstep_limit(0)
    learner.train_iter = 33
    feeder.reader.env_steps = START + 64
    call = Call(feeder)
    assert call.waits() and learner.consumed_env_steps == START + 64
    feeder.reader.env_steps = START + 66
    feeder.notify()
    assert call.returned() and call.result is not None


def test_envstep_limit(fake_redis, cfg):
    feeder, _, _ = make(fake_redis, cfg)
    assert feeder.envstep_limit(0) == 0 + START + LEAD
    assert feeder.envstep_limit(100) == 0 + START + 100 / RATIO + LEAD
    # Env steps the reader consumed since start do not move the limit: it counts from the base.
    feeder.reader.env_steps = 150
    assert feeder.envstep_limit(100) == 0 + START + 100 / RATIO + LEAD


def test_envstep_limit_without_ratio_is_unbounded(fake_redis, cfg):
    cfg.policy.learn.train_iter_per_env_step = 0
    feeder, learner, _ = make(fake_redis, cfg)
    assert feeder.envstep_limit(10_000) >= 2**62
    learner.train_iter = 10_000
    feeder.reader.env_steps = START
    assert Call(feeder).returned()  # no ratio: only replay_start_size gates


def test_resume_refills_replay_start_size_then_trains_at_the_ratio(fake_redis, cfg):
    # A replacement learner loaded train_iter 500; the buffer had consumed 1,000 env steps before
    # it, and its own buffer starts empty: it refills START env steps (unread chunks count).
    feeder, learner, _ = make(fake_redis, cfg, train_iter=500, base_envstep=1000, filled=0)
    assert feeder.envstep_limit(500) == 1000 + START + LEAD
    assert feeder.envstep_limit(700) == 1000 + START + 200 / RATIO + LEAD
    learner.consumed_env_steps = -1
    call = Call(feeder)
    assert call.waits() and learner.consumed_env_steps == 1000  # absolute counts would allow ~500 iterations
    feeder.store.extend(rows(START))
    feeder.reader.env_steps = START
    feeder.notify()
    assert call.returned() and call.result is not None
    assert learner.consumed_env_steps == 1000 + START
    learner.train_iter = 501  # one iteration at the refill, then 0.5 per env step
    assert not feeder.ratio_ok(1000 + START + 1)
    feeder.reader.env_steps = START + 10
    allowed = []
    for learner.train_iter in range(501, 507):
        allowed.append(feeder.ratio_ok(1000 + START + 10))
    assert allowed == [True] * 5 + [False]  # iterations 501..505: 1 + 0.5 * 10 since the refill
    learner.consumed_env_steps = -1  # train_iter is now 506
    call = Call(feeder)
    assert call.waits() and learner.consumed_env_steps == 1000 + START + 10
    release(fake_redis, cfg, call)


def test_reader_error_is_raised(fake_redis, cfg):
    feeder, _, _ = make(fake_redis, cfg)
    feeder.reader.error = ConnectionError("boom")
    call = Call(feeder)
    assert call.returned()
    assert isinstance(call.error, RuntimeError) and "boom" in str(call.error)


@pytest.mark.parametrize("ratio", [0.25, 0.3, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("freq", [1, 4, 16])
def test_the_least_lead_config_accepts_is_the_least_that_never_stalls(ratio, freq):
    """The learner published the limit of train iteration ``published`` (a multiple of
    send_policy_freq) and went on to ``published + k``; collectors stopped at their first env step
    past that limit. With min_env_step_lead the learner can always take its next iteration from
    what they sent; one env step less and, for some k, both wait for each other."""
    need = min_env_step_lead(freq, ratio)

    def learner_can_go_on(lead):
        return all(ratio_allows(published + k, envstep_limit_after(published, START, ratio, lead) + 1, START, ratio)
                   for published in range(0, 40 * freq, freq) for k in range(freq))

    assert learner_can_go_on(max(need, 0))
    if need >= 0:
        assert not learner_can_go_on(need - 1)


def test_config_refuses_a_lead_the_limiter_would_stall_on_naming_both_keys():
    base = ["policy.learn.train_iter_per_env_step=0.5", "policy.learn.learner.send_policy_freq=16"]
    cfg = compile_config({})
    apply_overrides(cfg, base + [f"policy.learn.max_env_step_lead={min_env_step_lead(16, 0.5)}"])
    with pytest.raises(ConfigError, match=r"'policy\.learn\.max_env_step_lead' = 28 .*send_policy_freq"):
        apply_overrides(cfg, base + ["policy.learn.max_env_step_lead=28"])
    # Deterministic mode publishes every iteration, whatever send_policy_freq says.
    det = compile_config({"system": {"deterministic": True}, "policy": {"learn": {"max_env_step_lead": 0}}})
    assert det.policy.learn.learner.send_policy_freq == 1
