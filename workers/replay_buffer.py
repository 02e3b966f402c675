"""Replay buffers of stacked transition arrays (ring buffers, thread-safe): uniform, and
proportional prioritized replay (Schaul et al. 2016) on a numpy sum tree."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np


def check_chunk(schema: dict[str, tuple[tuple[int, ...], np.dtype]], chunk: Any, what: str) -> int:
    """Validate a chunk (dict of arrays, one row per transition) against ``schema``; returns its rows.

    Raises:
        ValueError: a missing field, a wrong row shape, a dtype that does not cast to the schema's
            within its kind (floats into uint8 images), or unequal lengths, naming ``what``.
    """
    if not isinstance(chunk, dict):
        raise ValueError(f"{what}: expected a dict of arrays, got {type(chunk).__name__}")
    n = None
    for name, (shape, dt) in schema.items():
        arr = chunk.get(name)
        if not isinstance(arr, np.ndarray) or arr.ndim == 0:
            raise ValueError(f"{what}: field {name!r} missing, not an array, or 0-d (expected one row per transition)")
        if tuple(arr.shape[1:]) != tuple(shape):
            raise ValueError(f"{what}: field {name!r} rows have shape {tuple(arr.shape[1:])}, expected {tuple(shape)}")
        if not np.can_cast(arr.dtype, dt, "same_kind"):  # e.g. float pixels where the schema keeps uint8 images
            raise ValueError(f"{what}: field {name!r} has dtype {arr.dtype}, expected {np.dtype(dt)}")
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
            self._inserted(idx)

    def _inserted(self, idx: np.ndarray) -> None:
        """Called under the lock with the slots just written (prioritized replay sets their priority)."""

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


class SumTree:
    """Sum tree over ``capacity`` leaves with ``fanout`` children per node, vectorised in numpy:
    batched updates and prefix-sum searches in O(log N) (the structure of Schaul et al.'s
    proportional variant). A wide node (16 children) keeps the depth at 4 for 65,536 leaves, so
    each batched call is a handful of numpy operations rather than one per binary level.

    ``levels[0]`` is the root (one node), ``levels[-1]`` the leaves; node ``i`` of level ``d`` is
    the sum of nodes ``i * fanout .. i * fanout + fanout - 1`` of level ``d + 1``.
    """

    def __init__(self, capacity: int, fanout: int = 16) -> None:
        self.fanout = int(fanout)
        depth = 1
        while self.fanout ** depth < max(1, capacity):
            depth += 1
        self.depth = depth
        self.levels = [np.zeros(self.fanout ** d, np.float64) for d in range(depth + 1)]

    @property
    def total(self) -> float:
        return float(self.levels[0][0])

    def update(self, idx: np.ndarray, values: np.ndarray) -> None:
        """Set leaves ``idx`` (int (B,)) to ``values`` (float (B,)) and fix the sums above them."""
        node = np.asarray(idx, np.int64)
        self.levels[-1][node] = values  # a repeated index keeps its last value
        for d in range(self.depth - 1, -1, -1):
            node = node // self.fanout  # repeated nodes recompute the same sum: no need to deduplicate
            self.levels[d][node] = self.levels[d + 1].reshape(-1, self.fanout)[node].sum(axis=1)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """Leaf index whose prefix-sum interval holds each of ``mass`` (float (B,), in [0, total))."""
        mass = np.array(mass, np.float64)
        node = np.zeros(len(mass), np.int64)
        rows = np.arange(len(mass))
        for d in range(1, self.depth + 1):
            children = self.levels[d].reshape(-1, self.fanout)[node]
            cum = np.cumsum(children, axis=1)
            child = np.minimum((cum <= mass[:, None]).sum(axis=1), self.fanout - 1)
            mass -= cum[rows, child] - children[rows, child]  # the mass of the children left of it
            node = node * self.fanout + child
        return node

    def get(self, idx: np.ndarray) -> np.ndarray:
        return self.levels[-1][np.asarray(idx, np.int64)]

    def leaves(self) -> np.ndarray:
        """All leaf values (a view)."""
        return self.levels[-1]


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016, "Prioritized Experience Replay").

    Sampling probability P(i) = p_i / sum_k p_k with p_i = (|delta_i| + eps)^alpha; new rows
    enter at the largest priority seen so far, so each is replayed at least once soon. Samples
    carry importance-sampling weights w_i = (N * P(i))^-beta / max_batch w (field ``weight``,
    float32 (B,)), with beta annealed linearly from ``beta`` to 1 over ``beta_anneal_iters``
    train iterations; the learner then feeds back |delta| through :meth:`update_priorities`.

    Args:
        capacity, schema: as :class:`ReplayBuffer`.
        alpha: priority exponent (0 = uniform).
        beta: initial importance-sampling exponent.
        beta_anneal_iters: train iterations over which beta reaches 1 (0: stays at ``beta``).
        eps: added to |delta| so no transition's probability reaches 0.
    """

    def __init__(self, capacity: int, schema: dict[str, tuple[tuple[int, ...], np.dtype]], alpha: float = 0.6,
                 beta: float = 0.4, beta_anneal_iters: int = 0, eps: float = 1e-6) -> None:
        super().__init__(capacity, schema)
        if alpha < 0 or not 0 <= beta <= 1 or not eps > 0:
            raise ValueError(f"priority_alpha must be >= 0, priority_beta in [0, 1] and priority_eps > 0, "
                             f"got {alpha}, {beta}, {eps}")
        self.alpha, self.beta0, self.anneal, self.eps = float(alpha), float(beta), int(beta_anneal_iters), float(eps)
        self._tree = SumTree(capacity)
        self._max_priority = 1.0  # in |delta| units, before the exponent
        self._generation = np.zeros(capacity, np.int64)  # bumped on overwrite: stale updates are dropped
        self.last_idx = np.zeros(0, np.int64)
        self._last_gen = np.zeros(0, np.int64)

    def beta(self, train_iter: int) -> float:
        """The importance-sampling exponent at ``train_iter``."""
        if self.anneal <= 0:
            return self.beta0
        return self.beta0 + (1.0 - self.beta0) * min(1.0, train_iter / self.anneal)

    def _inserted(self, idx: np.ndarray) -> None:
        self._generation[idx] += 1
        self._tree.update(idx, np.full(len(idx), (self._max_priority + self.eps) ** self.alpha))

    def sample(self, batch_size: int, rng: np.random.Generator, train_iter: int = 0) -> dict[str, np.ndarray]:
        """``batch_size`` rows drawn with P(i) proportional to p_i (stratified over the total mass),
        plus ``weight`` float32 (B,); remembers the rows for :meth:`update_priorities`.

        Raises:
            ValueError: the buffer is empty.
        """
        with self._lock:
            if self._size == 0:
                raise ValueError("cannot sample from an empty replay buffer")
            total = self._tree.total
            mass = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
            idx = np.minimum(self._tree.find(np.minimum(mass, np.nextafter(total, 0))), self._size - 1)
            prob = self._tree.get(idx) / total
            w = (self._size * prob) ** -self.beta(train_iter)
            out = {k: v[idx] for k, v in self._data.items()}
            out["weight"] = (w / w.max()).astype(np.float32)
            self.last_idx, self._last_gen = idx, self._generation[idx].copy()
            self.sampled += batch_size
        return out

    def update_priorities(self, idx: np.ndarray, td_abs: np.ndarray, generation: np.ndarray | None = None) -> int:
        """Set p_i = (|delta_i| + eps)^alpha for rows ``idx``; rows overwritten since they were sampled
        (their ``generation`` changed) keep their new priority. Returns how many were updated.

        Raises:
            ValueError: ``td_abs`` is not finite or has another length than ``idx``.
        """
        td_abs = np.abs(np.asarray(td_abs, np.float64))
        idx = np.asarray(idx, np.int64)
        if td_abs.shape != idx.shape or not np.all(np.isfinite(td_abs)):
            raise ValueError(f"priorities must be {idx.shape} finite values, got shape {td_abs.shape}")
        with self._lock:
            keep = np.ones(len(idx), bool) if generation is None else self._generation[idx] == generation
            if keep.any():
                self._max_priority = max(self._max_priority, float(td_abs[keep].max()))
                self._tree.update(idx[keep], (td_abs[keep] + self.eps) ** self.alpha)
        return int(keep.sum())

    def update_last(self, td_abs: np.ndarray) -> int:
        """:meth:`update_priorities` for the rows of the last :meth:`sample`."""
        return self.update_priorities(self.last_idx, td_abs, self._last_gen)
