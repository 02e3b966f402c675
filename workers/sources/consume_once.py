"""Consume-once data: every row the collectors send is trained on exactly once, oldest first.

The queue of an IMPALA learner (Espeholt et al. 2018): collectors never wait for a new policy
version (the spec's ``waits_for_new_version=False``) and the algorithm corrects the lag between
the version that acted and the one that learns (V-trace). Each train iteration takes the oldest
``policy.learn.batch_size`` rows once that many are queued; a row may be a whole trajectory
(its fields carry a time axis).

Back-pressure, from two keys the algorithm's ``policy.learn`` defines:

* ``max_queued_rows``: the policy published with each version carries ``envstep_limit`` = env
  steps of the rows trained on so far + ``max_queued_rows`` rows' worth (at the env steps per row
  seen so far), past which collectors wait (workers/comm_collector.py): a slow learner pauses
  them instead of letting the stream's MAXLEN trim its chunks.
* ``max_policy_lag``: a row whose version is more than this many train iterations behind when
  its batch is formed is dropped and counted (``stale_chunks`` / ``stale_rows``), never trained on.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Optional

import numpy as np
import redis
from easydict import EasyDict

from common import frames
from common.sources import DataSourceSpec
from common.spaces import SpaceSpec
from workers.replay_buffer import check_chunk
from workers.sources import DataSource, Learner


class ChunkQueue:
    """Validated chunks in arrival order, each with the policy version that produced it (thread-safe).

    Args:
        schema: field -> (per-row shape, dtype), from ``policy.schema()``.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        self._schema = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in schema.items()}
        self._first = next(iter(self._schema))
        self._chunks: deque[tuple[int, dict[str, np.ndarray]]] = deque()
        self._rows = 0
        self._lock = threading.Lock()
        self.pushed = 0  # rows accepted
        self.taken = 0  # rows handed to the learner
        self.stale_chunks = 0  # chunks (or a chunk's tail) dropped for their policy lag
        self.stale_rows = 0

    def check(self, chunk: Any, what: str) -> int:
        """Validate a chunk against the schema; returns its row count (see ``check_chunk``)."""
        return check_chunk(self._schema, chunk, what)

    def extend(self, chunk: dict[str, np.ndarray], version: int) -> None:
        """Queue a validated chunk produced by policy ``version`` (packed image fields unpacked)."""
        chunk = frames.unpack(chunk, self._schema)
        arrays = {k: np.asarray(chunk[k], dt) for k, (_, dt) in self._schema.items()}
        n = len(arrays[self._first])
        if n == 0:
            return
        with self._lock:
            self._chunks.append((int(version), arrays))
            self._rows += n
            self.pushed += n

    def drop_older(self, oldest: int) -> None:
        """Drop and count every queued chunk of a version below ``oldest``."""
        with self._lock:
            keep = deque(c for c in self._chunks if c[0] >= oldest)
            for version, arrays in self._chunks:
                if version < oldest:
                    self.stale_chunks += 1
                    self.stale_rows += len(arrays[self._first])
            self._chunks = keep
            self._rows = sum(len(a[self._first]) for _, a in keep)

    def take(self, n: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Pop the oldest ``n`` rows (splitting a chunk where needed).

        Returns:
            ``(rows, versions)``: the fields stacked (n, ...) and int64 (n,), each row's policy version.

        Raises:
            ValueError: fewer than ``n`` rows are queued.
        """
        parts: list[dict[str, np.ndarray]] = []
        versions: list[np.ndarray] = []
        with self._lock:
            if n > self._rows:
                raise ValueError(f"take({n}): only {self._rows} rows queued")
            need = n
            while need:
                version, arrays = self._chunks[0]
                rows = len(arrays[self._first])
                if rows <= need:
                    self._chunks.popleft()
                    parts.append(arrays)
                else:  # keep the chunk's tail for the next batch
                    parts.append({k: a[:need] for k, a in arrays.items()})
                    self._chunks[0] = (version, {k: a[need:] for k, a in arrays.items()})
                    rows = need
                versions.append(np.full(rows, version, np.int64))
                need -= rows
            self._rows -= n
            self.taken += n
        return {k: np.concatenate([p[k] for p in parts]) for k in self._schema}, np.concatenate(versions)

    def __len__(self) -> int:
        with self._lock:
            return self._rows


class ConsumeOnceSource(DataSource):
    """``learner.get_data``: the oldest ``policy.learn.batch_size`` rows once that many are queued
    (rows past ``max_policy_lag`` dropped first), with the collectors' ``envstep_limit`` (module docstring).

    :meth:`stats` reports the data's policy lag at training time (``data_lag_mean`` / ``_max``
    over the last batch: the learner's ``train_iter`` minus the version that produced each row),
    which the reader's ingest-time ``policy_lag_*`` misses for rows that waited in the queue.
    """

    def __init__(self, conn: redis.Redis, exp: str, learner: Learner, cfg: EasyDict, schema: dict[str, Any],
                 seed: int = 0, spec: Optional[SpaceSpec] = None, group_size: int = 1, *,
                 source: DataSourceSpec) -> None:
        super().__init__(conn, exp, learner, source, group_size)
        self.store = ChunkQueue(schema)
        self._batch = int(cfg.policy.learn.batch_size)
        self._max_rows = int(cfg.policy.learn.max_queued_rows)
        self._max_lag = int(cfg.policy.learn.max_policy_lag)
        self._last_lag: Optional[np.ndarray] = None

    def envstep_limit(self, train_iter: int) -> int:
        """Env steps collectors may have sent: those of the rows trained on + ``max_queued_rows``
        rows' worth; unbounded until a row arrived (the env steps per row are not known yet)."""
        consumed = self.envstep()
        s = self.store
        ingested = consumed - (self._base_envstep or 0)
        if s.pushed == 0 or ingested <= 0:
            return 2**62
        per_row = ingested / s.pushed
        return int(consumed - len(s) * per_row + self._max_rows * per_row)

    def _ready(self, envstep: int) -> bool:
        self.store.drop_older(self._learner.train_iter - self._max_lag)
        return len(self.store) >= self._batch

    def _take(self) -> dict[str, np.ndarray]:
        rows, versions = self.store.take(self._batch)
        self._last_lag = self._learner.train_iter - versions
        return rows

    def stats(self) -> dict[str, Any]:
        s = self.store
        out: dict[str, Any] = {"buffer_size": len(s), "pushed": s.pushed, "taken": s.taken,
                               "stale_chunks": s.stale_chunks, "stale_rows": s.stale_rows}
        if self._last_lag is not None:
            out["data_lag_mean"] = float(self._last_lag.mean())
            out["data_lag_max"] = int(self._last_lag.max())
        return out
