"""How the learner gets its batches: the learner side of the data source its algorithm names
(``Algorithm.data_source``; the source's spec, registered in common/sources.py, names the class).

A source is the learner's ``get_data``: it blocks (on a condition variable, with a timeout)
until a batch may be formed and returns it, or returns None once the stop flag is set. The
buffer reader thread (workers/comm_learner.py) fills the source's store from the buffer stream
and wakes it with :meth:`DataSource.notify`. The loop it serves::

    source = create_source(algorithm.data_source, conn, exp, learner, cfg, schema, seed, spec, group_size)
    reader = BufferReader(..., store=source.store, notify=source.notify, ...); source.reader = reader
    while (batch := source()) is not None:      # None at the stop flag
        learner.train(batch); source.feedback(learner.priority_info)

A source class subclasses :class:`DataSource`, takes :func:`create_source`'s arguments, keeps
its rows in ``self.store`` (``check(chunk, what) -> rows`` and ``extend(chunk, version)``, as
workers/replay_buffer.py's buffers) and implements ``_ready(envstep)`` and ``_take()``:

    replay        workers/sources/replay.py        uniform replay buffer + replay-ratio limiter
    on_policy     workers/sources/on_policy.py     rows of the current policy version only
    consume_once  workers/sources/consume_once.py  every row once, oldest first
"""

from __future__ import annotations

import threading
import time
import importlib
from typing import Any, Optional, Protocol

import numpy as np
import redis
from easydict import EasyDict

from common.sources import DataSourceSpec, get_source
from common.spaces import SpaceSpec
from workers.task import stop_requested


class Learner(Protocol):
    """What a source reads and sets on the learner it feeds (workers.learner.BaseLearner)."""

    train_iter: int
    consumed_env_steps: int
    logger: Any


class Reader(Protocol):
    """What a source reads of the buffer reader that fills it (workers.comm_learner.BufferReader)."""

    env_steps: int
    env_steps_base: int
    error: Optional[BaseException]

    def consumed_env_steps(self) -> int: ...


# How often the stop flag is read (one EXISTS): the learner's final checkpoint and report, which
# the run's wrap-up waits for, start at most this long after the flag is set.
_STOP_CHECK_S = 0.05


class DataSource:
    """Shared waiting, stop-flag and env-step accounting of the learner's data sources.

    Args:
        conn, exp: the run's Redis and key namespace (the stop flag).
        learner: the learner it feeds.
        spec: its registered spec (common/sources.py).
        group_size: ranks of the data-parallel learner group it feeds one rank of (workers/ddp.py).
    """

    def __init__(self, conn: redis.Redis, exp: str, learner: Learner, spec: DataSourceSpec, group_size: int = 1) -> None:
        self._conn, self._exp, self._learner = conn, exp, learner
        self.spec = spec
        self.group_size = group_size
        self._cond = threading.Condition()
        self._next_stop_check = 0.0
        self._stopped = False
        # Env steps consumed before this learner started; read on the first call (before_run).
        self._base_envstep: Optional[int] = None
        self._base_iter = 0
        self.reader: Optional[Reader] = None
        self.wait_seconds = 0.0
        # A data-parallel group (workers/ddp.py) counts the env steps every rank consumed: the
        # buffer's stats hash, re-read whenever this rank's own count says "not yet".
        self._shared_seen = 0

    @property
    def publish_every_iter(self) -> bool:
        """The learner publishes weights (and reports) every train iteration (the spec says so)."""
        return self.spec.publish_every_iter

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
            self._base_envstep = self.reader.env_steps_base if self.reader else self._learner.consumed_env_steps
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
                self._learner.consumed_env_steps = envstep
                if self._ready(envstep):
                    break
                self._cond.wait(timeout=_STOP_CHECK_S)
        self.wait_seconds += time.perf_counter() - t0
        return self._take()


def create_source(kind: str, conn: redis.Redis, exp: str, learner: Learner, cfg: EasyDict,
                  schema: dict[str, Any], seed: int, spec: Optional[SpaceSpec] = None,
                  group_size: int = 1) -> DataSource:
    """The learner-side source registered as ``kind`` (common/sources.py), with its store
    (``source.store``). With the env's ``spec``, a replay buffer keeps image frames once and
    checks its memory budget first (common/memory_budget.py).

    ``group_size`` > 1: one rank of a data-parallel learner group (workers/ddp.py).

    Raises:
        KeyError: an unknown kind (lists the registered ones).
        ValueError: a learner group on a source that one learner must see whole.
        common.memory_budget.MemoryBudgetError: a replay buffer would not fit in memory.
    """
    source = get_source(kind)
    if group_size > 1 and not source.learner_groups:
        raise ValueError(f"a learner group ({group_size} ranks) cannot share {kind!r} data: one learner must see it whole")
    module, _, name = source.implementation.partition(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(conn, exp, learner, cfg, schema, seed, spec, group_size, source=source)
