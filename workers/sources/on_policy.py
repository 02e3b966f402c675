"""On-policy data: the learner trains only on rows produced by its current policy version.

Each train iteration takes every row of version ``train_iter`` received so far, once there are
at least ``policy.collect.n_sample`` of them; the learner then publishes version
``train_iter + 1`` (every iteration), which the collectors wait for after each chunk. A chunk
of any other version is dropped when it arrives or when the learner moves on, and counted
(``stale_chunks`` / ``stale_rows``): it is never trained on.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import numpy as np
import redis
from easydict import EasyDict

from common import frames
from workers.replay_buffer import check_chunk
from common.sources import DataSourceSpec
from common.spaces import SpaceSpec
from workers.sources import DataSource, Learner

class RolloutQueue:
    """Rows waiting for the train iteration of their policy version (thread-safe).

    Args:
        schema: field -> (per-row shape, dtype), from ``policy.schema()``.
        current_version: the version the learner trains next (its ``train_iter``).
    """

    def __init__(self, schema: dict[str, Any], current_version: Callable[[], int]) -> None:
        self._schema = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in schema.items()}
        self._current = current_version
        self._parts: list[tuple[int, dict[str, np.ndarray]]] = []
        self._lock = threading.Lock()
        self.pushed = 0  # rows accepted
        self.stale_chunks = 0
        self.stale_rows = 0

    def check(self, chunk: Any, what: str) -> int:
        """Validate a chunk against the schema; returns its row count (see ``check_chunk``)."""
        return check_chunk(self._schema, chunk, what)

    def extend(self, chunk: dict[str, np.ndarray], version: int) -> None:
        """Keep the rows of a validated chunk if ``version`` is the current one; else drop and count them.
        Image fields packed as frames (common/frames.py) are unpacked here."""
        chunk = frames.unpack(chunk, self._schema)
        n = len(chunk[next(iter(self._schema))])
        with self._lock:
            if version != self._current():
                self.stale_chunks += 1
                self.stale_rows += n
                return
            self._parts.append((version, {k: np.asarray(chunk[k], dt) for k, (_, dt) in self._schema.items()}))
            self.pushed += n

    def rows(self, version: int) -> int:
        """Rows of ``version`` waiting."""
        with self._lock:
            return sum(len(next(iter(p.values()))) for v, p in self._parts if v == version)

    def take(self, version: int) -> dict[str, np.ndarray]:
        """Every waiting row of ``version`` stacked; rows of other versions are dropped and counted."""
        with self._lock:
            mine = [p for v, p in self._parts if v == version]
            for v, p in self._parts:
                if v != version:
                    self.stale_chunks += 1
                    self.stale_rows += len(next(iter(p.values())))
            self._parts = []
        return {k: np.concatenate([p[k] for p in mine]) for k in self._schema}

    def __len__(self) -> int:
        with self._lock:
            return sum(len(next(iter(p.values()))) for _, p in self._parts)


class OnPolicySource(DataSource):
    """``learner.get_data``: all rows of the current version once there are ``n_sample`` of them."""

    def __init__(self, conn: redis.Redis, exp: str, learner: Learner, cfg: EasyDict, schema: dict[str, Any],
                 seed: int = 0, spec: Optional[SpaceSpec] = None, group_size: int = 1, *,
                 source: DataSourceSpec) -> None:
        super().__init__(conn, exp, learner, source, group_size)
        self.store = RolloutQueue(schema, lambda: learner.train_iter)
        self._rows = max(1, int(cfg.policy.collect.n_sample))

    def _ready(self, envstep: int) -> bool:
        return self.store.rows(self._learner.train_iter) >= self._rows

    def _take(self) -> dict[str, np.ndarray]:
        return self.store.take(self._learner.train_iter)

    def stats(self) -> dict[str, Any]:
        s = self.store
        return {"buffer_size": len(s), "pushed": s.pushed, "stale_chunks": s.stale_chunks, "stale_rows": s.stale_rows}
