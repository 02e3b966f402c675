"""How the learner gets its batches, chosen by the algorithm's ``data_source`` (common/policy/base.py).

A source is the learner's ``get_data``: it blocks (on a condition variable, with a timeout)
until a batch may be formed and returns it, or returns None once the stop flag is set. The
:class:`~workers.comm_learner.BufferReader` thread fills the source's store (a replay buffer or
a rollout queue) from the buffer stream and wakes it with :meth:`DataSource.notify`.

    replay     workers/sources/replay.py     uniform replay buffer + replay-ratio limiter
    on_policy  workers/sources/on_policy.py  rows of the current policy version only
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import redis
from easydict import EasyDict

from common.spaces import SpaceSpec
from workers.task import stop_requested

if TYPE_CHECKING:
    from workers.comm_learner import BufferReader
    from workers.learner import BaseLearner


# How often the stop flag is read (one EXISTS): the learner's final checkpoint and report, which
# the run's wrap-up waits for, start at most this long after the flag is set.
_STOP_CHECK_S = 0.05


class DataSource:
    """Shared waiting, stop-flag and env-step accounting of the learner's data sources."""

    #: publish weights every iteration (on-policy: collectors wait for each new version)
    publish_every_iter = False

    def __init__(self, conn: redis.Redis, exp: str, learner: "BaseLearner", group_size: int = 1) -> None:
        self._conn, self._exp, self._learner = conn, exp, learner
        self.group_size = group_size
        self._cond = threading.Condition()
        self._next_stop_check = 0.0
        self._stopped = False
        # Env steps consumed before this learner started; read on the first call (before_run).
        self._base_envstep: Optional[int] = None
        self._base_iter = 0
        self.reader: Optional["BufferReader"] = None
        self.wait_seconds = 0.0
        # A data-parallel group (workers/ddp.py) counts the env steps every rank consumed: the
        # buffer's stats hash, re-read whenever this rank's own count says "not yet".
        self._shared_seen = 0

    def notify(self) -> None:
        """Wake the trainer thread (the reader inserted data, or failed)."""
        with self._cond:
            self._cond.notify_all()

    def _stop_due(self) -> bool:
        now = time.monotonic()
        if now >= self._next_stop_check:
            self._next_stop_check = now + _STOP_CHECK_S
            self._stopped = stop_requested(self._conn, self._exp)
        return self._stopped

    def envstep(self) -> int:
        """Env steps consumed by the buffer: the durable count at start plus what the reader consumed since."""
        if self._base_envstep is None:
            # Durable count of env steps this buffer consumed before us (exact across learner restarts).
            self._base_envstep = self.reader.env_steps_base if self.reader else self._learner.collector_envstep
            self._base_iter = self._learner.train_iter
        own = self._base_envstep + (self.reader.env_steps if self.reader else 0)
        return max(own, self._shared_seen)

    def _refresh_shared(self) -> None:
        """Re-read the env steps the whole learner group consumed (``group_size`` > 1 only)."""
        if self.group_size > 1 and self.reader is not None:
            self._shared_seen = self.reader.consumed_env_steps()

    def envstep_limit(self, train_iter: int) -> int:
        """Env steps the collectors may have sent by ``train_iter`` (published with each policy version)."""
        return 2**62

    def stats(self) -> dict[str, Any]:
        """Figures for learner_info events (numbers only)."""
        return {}

    def feedback(self, priority_info: dict[str, Any]) -> None:
        """After each train iteration: what the policy reported about the batch (e.g. priorities)."""

    def _ready(self, envstep: int) -> bool:
        raise NotImplementedError

    def _take(self) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __call__(self) -> Optional[dict[str, np.ndarray]]:
        """The next batch, or None at the stop flag.

        Raises:
            RuntimeError: the buffer reader thread failed (its error chained).
        """
        t0 = time.perf_counter()
        with self._cond:
            while True:
                if self.reader is not None and self.reader.error is not None:
                    raise RuntimeError(f"buffer reader failed: {self.reader.error!r}") from self.reader.error
                if self._stop_due():
                    return None
                envstep = self.envstep()
                if not self._ready(envstep) and self.group_size > 1:
                    self._refresh_shared()  # the other ranks' chunks count too
                    envstep = self.envstep()
                self._learner.collector_envstep = envstep
                if self._ready(envstep):
                    break
                self._cond.wait(timeout=_STOP_CHECK_S)
        self.wait_seconds += time.perf_counter() - t0
        return self._take()


def create_source(kind: str, conn: redis.Redis, exp: str, learner: "BaseLearner", cfg: EasyDict,
                  schema: dict[str, Any], seed: int, spec: Optional[SpaceSpec] = None,
                  group_size: int = 1) -> DataSource:
    """The source for ``kind`` (``replay`` or ``on_policy``) with its store (``source.store``).
    With the env's ``spec``, a replay buffer keeps image frames once and checks its memory budget
    first (common/memory_budget.py).

    ``group_size`` > 1: one rank of a data-parallel learner group (workers/ddp.py; replay only).

    Raises:
        ValueError: an unknown kind, or a learner group on on-policy data.
        common.memory_budget.MemoryBudgetError: the replay buffer would not fit in memory.
    """
    if kind == "replay":
        from workers.sources.replay import ReplayFeeder

        return ReplayFeeder(conn, exp, learner, cfg, schema, seed, spec, group_size)
    if group_size > 1:
        raise ValueError(f"a learner group ({group_size} ranks) needs replay data, not {kind!r}")
    if kind == "on_policy":
        from workers.sources.on_policy import OnPolicySource

        return OnPolicySource(conn, exp, learner, cfg, schema)
    raise ValueError(f"unknown data source {kind!r}; known: replay, on_policy")
