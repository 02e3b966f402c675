"""Off-policy data: a replay buffer (uniform, or prioritized with ``replay_buffer.priority``),
sampled under the replay-ratio limiter.

The rule (:func:`ratio_allows`), in env steps and train iterations counted from the learner's
start (its bases: the env steps the buffer had consumed and the train_iter it loaded): learning
starts once ``replay_start_size`` env steps were consumed, and iteration ``k`` (0-based) may run
once ``train_iter_per_env_step * (env steps - replay_start_size) >= k``: one iteration at the
start, then the ratio per env step, with no catch-up for the warm-up (CleanRL's and SB3's DQN /
SAC do one update per env step from ``learning_starts``; the MinAtar reference likewise). The
collector side: each published policy carries ``envstep_limit`` = base + ``replay_start_size`` +
``k / ratio`` + ``max_env_step_lead`` (:func:`envstep_limit_after`), past which collectors wait
(workers/comm_collector.py). tests/bench/bench_serial.py applies the same two functions.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np
import redis
from easydict import EasyDict

from common import frames, memory_budget
from common.config import is_deterministic
from common.spaces import SpaceSpec
from workers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from common.sources import DataSourceSpec
from workers.sources import DataSource, Learner

def ratio_allows(iters: int, env_steps: int, start: int, ratio: float) -> bool:
    """Whether a learner that made ``iters`` train iterations since it started may make another,
    having consumed ``env_steps`` env steps since it started (module docstring). ``ratio`` <= 0:
    no limit past the start."""
    if env_steps < start:
        return False
    return ratio <= 0 or iters <= ratio * (env_steps - start) + 1e-9  # the epsilon absorbs float rounding


def envstep_limit_after(iters: int, start: int, ratio: float, lead: int) -> int:
    """Env steps (since the learner started) collectors may have sent once it made ``iters`` train
    iterations: those that allow the next iteration (:func:`ratio_allows`) plus ``lead``."""
    if ratio <= 0:
        return 2**62
    return start + math.ceil(iters / ratio - 1e-9) + lead


class ReplayFeeder(DataSource):
    """``learner.get_data``: a uniformly sampled batch once data and the replay ratio allow.

    Learning starts once the learner consumed ``replay_start_size`` env steps since it started
    (each consumed env step is one row in its buffer) and holds a row; a learner that resumed
    from a checkpoint starts with an empty buffer, so it waits for that many env steps again
    (the stream's unread chunks count), then trains at the ratio, with no catch-up for the env
    steps before the resume or during the refill.

    One rank of a learner group of ``group_size`` ranks (workers/ddp.py) keeps
    ``replay_buffer_size / group_size`` rows (the ranks' buffers together hold one learner's),
    and counts the env steps the whole group consumed: a rank-local count would wait for rows
    the consumer group may have handed to the other ranks, past what the collectors may send
    before the first update.
    """

    def __init__(self, conn: redis.Redis, exp: str, learner: Learner, cfg: EasyDict,
                 schema: dict[str, Any], seed: int, spec: Optional[SpaceSpec] = None, group_size: int = 1, *,
                 source: DataSourceSpec) -> None:
        super().__init__(conn, exp, learner, source, group_size)
        rb = cfg.policy.other.replay_buffer
        size = max(1, int(rb.replay_buffer_size) // group_size)
        framed: list[str] = []
        if spec is not None:  # a learner task: image frames once, and the memory budget before allocating
            framed = frames.framed_fields(spec, schema)
            _, msg = memory_budget.check(cfg, spec, schema, size)
            learner.logger.info(msg)
        if rb.priority:
            self.store: ReplayBuffer = PrioritizedReplayBuffer(
                size, schema, alpha=float(rb.priority_alpha), beta=float(rb.priority_beta),
                beta_anneal_iters=int(rb.priority_beta_anneal_iters), eps=float(rb.priority_eps), framed=framed)
        else:
            self.store = ReplayBuffer(size, schema, framed=framed)
        self._batch = int(cfg.policy.learn.batch_size)
        self._start = max(int(cfg.policy.other.replay_buffer.replay_start_size), 1)
        self._ratio = float(cfg.policy.learn.train_iter_per_env_step)
        # Deterministic mode (common/config.py apply_deterministic): one env step short of what
        # allows the next iteration, so a collector is let go exactly when the learner can train
        # no more on what it sent: the version it then reads is the one that trained on all of it.
        self._lead = -1 if is_deterministic(cfg) else int(cfg.policy.learn.max_env_step_lead)
        self._rng = np.random.default_rng(seed)

    def envstep_limit(self, train_iter: int) -> int:
        """Env steps collectors may have sent by ``train_iter`` (:func:`envstep_limit_after` from the base)."""
        self.envstep()  # sets the bases on the first call
        return int((self._base_envstep or 0) + envstep_limit_after(train_iter - self._base_iter, self._start,
                                                                   self._ratio, self._lead))

    def ratio_ok(self, envstep: int) -> bool:
        """True once learning started and another train iteration keeps within the ratio (:func:`ratio_allows`)."""
        return ratio_allows(self._learner.train_iter - self._base_iter, envstep - (self._base_envstep or 0),
                            self._start, self._ratio)

    def _ready(self, envstep: int) -> bool:
        return len(self.store) > 0 and self.ratio_ok(envstep)

    def _take(self) -> dict[str, np.ndarray]:
        if isinstance(self.store, PrioritizedReplayBuffer):
            return self.store.sample(self._batch, self._rng, self._learner.train_iter)
        return self.store.sample(self._batch, self._rng)

    def feedback(self, priority_info: dict[str, Any]) -> None:
        """Prioritized replay: new priorities from the last train iteration's |TD error|
        (the seed learner's ``priority_info``).

        Raises:
            RuntimeError: the policy reported no ``priority`` although the buffer is prioritized.
        """
        if not isinstance(self.store, PrioritizedReplayBuffer):
            return
        priority = priority_info.get("priority")
        if priority is None:
            raise RuntimeError("policy.other.replay_buffer.priority=True needs an algorithm whose learn() returns "
                               "'priority' (|TD error| per row) when the batch has a 'weight' field")
        self.store.update_last(priority)

    def stats(self) -> dict[str, Any]:
        return {"buffer_size": len(self.store), "pushed": self.store.pushed}
