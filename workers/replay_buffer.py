"""A uniform replay buffer of stacked transition arrays (ring buffer, thread-safe)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


def check_chunk(schema: dict[str, tuple[tuple[int, ...], np.dtype]], chunk: Any, what: str) -> int:
    """Validate a chunk (dict of arrays, one row per transition) against ``schema``; returns its rows.

    Raises:
        ValueError: a missing field, a wrong row shape or unequal lengths, naming ``what``.
    """
    if not isinstance(chunk, dict):
        raise ValueError(f"{what}: expected a dict of arrays, got {type(chunk).__name__}")
    n = None
    for name, (shape, _) in schema.items():
        arr = chunk.get(name)
        if not isinstance(arr, np.ndarray) or arr.ndim == 0:
            raise ValueError(f"{what}: field {name!r} missing, not an array, or 0-d (expected one row per transition)")
        if tuple(arr.shape[1:]) != tuple(shape):
            raise ValueError(f"{what}: field {name!r} rows have shape {tuple(arr.shape[1:])}, expected {tuple(shape)}")
        if n is None:
            n = len(arr)
        elif len(arr) != n:
            raise ValueError(f"{what}: field {name!r} has {len(arr)} rows, others have {n}")
    return n or 0


class ReplayBuffer:
    """Fixed-capacity FIFO of transitions, filled by the reader thread, sampled by the trainer.

    Args:
        capacity: number of transitions kept (the oldest are overwritten).
        schema: field name -> (per-row shape, dtype), e.g. ``{"obs": ((4,), np.float32), ...}``.
    """

    def __init__(self, capacity: int, schema: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
        if capacity < 1:
            raise ValueError(f"replay_buffer_size must be >= 1, got {capacity}")
        self.capacity = capacity
        self._schema = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in schema.items()}
        self._data = {k: np.zeros((capacity, *shape), dt) for k, (shape, dt) in self._schema.items()}
        self._next = 0
        self._size = 0
        self.pushed = 0  # transitions inserted over the buffer's life
        self.sampled = 0  # transitions sampled over the buffer's life
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._size

    def check(self, chunk: Any, what: str) -> int:
        """Validate a chunk against the schema; returns its row count (see :func:`check_chunk`)."""
        return check_chunk(self._schema, chunk, what)

    def extend(self, chunk: dict[str, np.ndarray], version: int = 0) -> None:
        """Insert the rows of a validated chunk (see :meth:`check`); any policy ``version`` is kept."""
        n = len(next(iter(chunk.values())))
        if n == 0:
            return
        with self._lock:
            idx = (self._next + np.arange(n)) % self.capacity
            for name, (_, dt) in self._schema.items():
                self._data[name][idx] = chunk[name].astype(dt, copy=False)
            self._next = int((self._next + n) % self.capacity)
            self._size = min(self.capacity, self._size + n)
            self.pushed += n

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``batch_size`` rows drawn uniformly with replacement.

        Raises:
            ValueError: the buffer is empty.
        """
        with self._lock:
            if self._size == 0:
                raise ValueError("cannot sample from an empty replay buffer")
            idx = rng.integers(0, self._size, size=batch_size)
            out = {k: v[idx] for k, v in self._data.items()}
            self.sampled += batch_size
        return out
