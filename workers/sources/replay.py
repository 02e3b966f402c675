"""Off-policy data: a replay buffer (uniform, or prioritized with ``replay_buffer.priority``),
sampled under the replay-ratio limiter.

The learner trains at most ``train_iter_per_env_step`` iterations per env step received
(counted from this learner's start), once ``replay_start_size`` transitions are stored. The
collector side of the limiter: each published policy carries an ``envstep_limit`` (what the
ratio justifies plus ``max_env_step_lead``) past which collectors wait (workers/comm_collector.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import redis
from easydict import EasyDict

from common import frames, memory_budget
from common.spaces import SpaceSpec
from workers.replay_buffer import PrioritizedReplayBuffer, ReplayBuffer
from workers.sources import DataSource

if TYPE_CHECKING:
    from workers.learner import BaseLearner


class ReplayFeeder(DataSource):
    """``learner.get_data``: a uniformly sampled batch once data and the replay ratio allow.

    One rank of a learner group of ``group_size`` ranks (workers/ddp.py) keeps
    ``replay_buffer_size / group_size`` rows (the ranks' buffers together hold one learner's),
    and starts once the group consumed ``replay_start_size`` env steps since it started and this
    rank holds a row: a rank-local start would wait for rows the consumer group may have handed
    to the other ranks, past what the collectors may send before the first update.
    """

    def __init__(self, conn: redis.Redis, exp: str, learner: "BaseLearner", cfg: EasyDict,
                 schema: dict[str, Any], seed: int, spec: Optional[SpaceSpec] = None, group_size: int = 1) -> None:
        super().__init__(conn, exp, learner, group_size)
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
        self._lead = int(cfg.policy.learn.max_env_step_lead)
        self._rng = np.random.default_rng(seed)

    def envstep_limit(self, train_iter: int) -> int:
        """Env steps collectors may have sent by ``train_iter``: what the ratio justifies plus a lead."""
        if self._ratio <= 0:
            return 2**62
        self.envstep()  # sets the base on the first call
        base = self._base_envstep or 0
        return int(base + max(self._start, (train_iter - self._base_iter) / self._ratio) + self._lead)

    def ratio_ok(self, envstep: int) -> bool:
        """True while another train iteration keeps within ``train_iter_per_env_step``."""
        return self._ratio <= 0 or self._learner.train_iter - self._base_iter < self._ratio * (envstep - self._base_envstep)

    def _ready(self, envstep: int) -> bool:
        if self.group_size > 1:
            started = len(self.store) > 0 and envstep - (self._base_envstep or 0) >= self._start
        else:
            started = len(self.store) >= self._start
        return started and self.ratio_ok(envstep)

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
