"""Replay buffers of stacked transition arrays (ring buffers, thread-safe): uniform, and
proportional prioritized replay (Schaul et al. 2016) on a numpy sum tree.

Image fields packed as frames (common/frames.py) are kept once each in a :class:`FrameStore`:
a row holds the frame numbers of its stacked observations, so a DQN transition of 4 stacked
84x84 frames (obs and next_obs: 8 frames sent plain) costs about one frame of memory.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from common import frames


def check_chunk(schema: dict[str, tuple[tuple[int, ...], np.dtype]], chunk: Any, what: str) -> int:
    """Validate a chunk (dict of arrays, one row per transition) against ``schema``; returns its rows.

    Raises:
        ValueError: a missing field, a wrong row shape, a dtype that does not cast to the schema's
            within its kind (floats into uint8 images), or unequal lengths, naming ``what``.
    """
    if not isinstance(chunk, dict):
        raise ValueError(f"{what}: expected a dict of arrays, got {type(chunk).__name__}")
    framed: set[str] = set()
    if frames.is_packed(chunk):  # image fields as frame indices (common/frames.py)
        frames.check_packed(chunk, schema, what)
        framed = set(chunk[frames.FRAMED])
    n = None
    for name, (shape, dt) in schema.items():
        arr = chunk.get(name)
        if not isinstance(arr, np.ndarray) or arr.ndim == 0:
            raise ValueError(f"{what}: field {name!r} missing, not an array, or 0-d (expected one row per transition)")
        if name not in framed:  # packed fields: indices, checked by check_packed
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
        framed: image fields kept as frames in a :class:`FrameStore` (``common.frames.framed_fields``);
            chunks may arrive packed (common/frames.py) or plain.
        frames_per_row: frames stored per transition on average that the store is sized for
            (``common.frames.frame_capacity``; bytes: ``common.frames.buffer_bytes``); when
            episodes are so short that more are needed, the oldest transitions are dropped
            before their frames are overwritten, so the buffer then holds fewer than ``capacity``.
    """

    def __init__(self, capacity: int, schema: dict[str, tuple[tuple[int, ...], np.dtype]],
                 framed: list[str] | tuple[str, ...] = (), frames_per_row: float = 1.1) -> None:
        if capacity < 1:
            raise ValueError(f"replay_buffer_size must be >= 1, got {capacity}")
        self.capacity = capacity
        self._schema = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in schema.items()}
        self._framed = list(framed)
        self._frames = FrameStore(capacity, self._schema, self._framed, frames_per_row) if framed else None
        self._data = {k: np.zeros((capacity, *shape), dt) for k, (shape, dt) in frames.row_layout(self._schema, framed)}
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

    def extend(self, chunk: dict[str, Any], version: int = 0) -> None:
        """Insert the rows of a validated chunk (see :meth:`check`); any policy ``version`` is kept."""
        n = len(chunk[next(iter(self._schema))])
        if n == 0:
            return
        if frames.is_packed(chunk) and list(chunk[frames.FRAMED]) != self._framed:
            chunk = frames.unpack(chunk, self._schema)  # packed otherwise than this buffer keeps frames
        if self._framed and not frames.is_packed(chunk):
            chunk = frames.pack(chunk, self._framed)
        with self._lock:
            if n > self.capacity:  # only the last `capacity` rows would stay: store no frames for the others
                chunk = {k: v[n - self.capacity:] if k in self._schema else v for k, v in chunk.items()}
            rows = dict(chunk)
            if self._frames is not None:
                rows.update(self._frames.add(chunk))
            m = min(n, self.capacity)
            idx = (self._next + np.arange(m)) % self.capacity
            for name, arr in self._data.items():
                arr[idx] = rows[name]
            self._next = int((self._next + m) % self.capacity)
            self._size = min(self.capacity, self._size + m)
            self.pushed += n
            self._inserted(idx)
            if self._frames is not None:  # after the insert: the chunk's own frames may have overwritten some
                self._evict(self._frames.oldest_intact())

    def _evict(self, intact: int) -> None:
        """Drop the oldest rows that reference a frame numbered below ``intact`` (overwritten): rows
        are nondecreasing in ``_oldest`` from the oldest to the newest, so these are a prefix."""
        oldest = self._data[frames.OLDEST]
        drop = 0
        while drop < self._size and oldest[(self._next - self._size + drop) % self.capacity] < intact:
            drop += 1
        if drop:
            gone = (self._next - self._size + np.arange(drop)) % self.capacity
            self._size -= drop
            self._evicted(gone)

    def _inserted(self, idx: np.ndarray) -> None:
        """Called under the lock with the slots just written (prioritized replay sets their priority)."""

    def _evicted(self, idx: np.ndarray) -> None:
        """Called under the lock with slots dropped before the ring reached them (their frames go)."""

    def _rows(self, idx: np.ndarray) -> dict[str, np.ndarray]:
        out = {k: v[idx] for k, v in self._data.items() if k != frames.OLDEST}
        if self._frames is not None:
            for name in self._framed:
                out[name] = self._frames.gather(out[name], self._schema[name][0])
        return out

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """``batch_size`` rows drawn uniformly with replacement.

        Raises:
            ValueError: the buffer is empty.
        """
        with self._lock:
            if self._size == 0:
                raise ValueError("cannot sample from an empty replay buffer")
            # Live rows are the ring segment ending at _next (all slots once full).
            idx = (self._next - self._size + rng.integers(0, self._size, size=batch_size)) % self.capacity
            out = self._rows(idx)
            self.sampled += batch_size
        return out


class FrameStore:
    """The frames of a replay buffer's image fields, each kept once (a ring of H x W uint8 frames).

    Frame ``s`` (numbered from 0 over the store's life) sits in slot ``s % size`` until frame
    ``s + size`` takes the slot. A chunk's distinct frames (common/frames.py) are matched by
    content against the last :data:`WINDOW` frames stored (consecutive chunks of one env share
    their stacked frames; reset frames recur) and stored only when new.

    Each row gets ``_oldest``, a lower bound on its frame numbers that never decreases from one
    row to the next in insertion order: the smallest frame number of the row and of the later rows
    of its chunk, capped at ``total - WINDOW`` after the chunk (later chunks match only frames at
    or above that). The buffer drops rows, oldest first, while ``_oldest < total - size``
    (:meth:`oldest_intact`), so no kept row references a slot that another frame took, however
    far apart a frame recurs. A match is refused (the frame stored again) where the chunk's own
    new frames could take its slot, so a chunk's newest rows are kept unless the chunk holds
    more distinct frames than the store. The dedup index (hash -> frame numbers) holds the frames
    numbered ``>= total - WINDOW``: at most ``WINDOW + 1`` entries.
    """

    WINDOW = frames.WINDOW

    def __init__(self, capacity: int, schema: dict[str, tuple[tuple[int, ...], np.dtype]], framed: list[str],
                 frames_per_row: float) -> None:
        shape = schema[framed[0]][0]
        self.size = frames.frame_capacity(capacity, frames_per_row)
        self._frames = np.zeros((self.size, *shape[-2:]), np.uint8)
        self.total = 0  # frames stored over the store's life
        self._recent: dict[int, list[int]] = {}  # hash of a frame's bytes -> frame numbers in the window
        self._order: list[tuple[int, int]] = []  # (hash, frame number), oldest first, for expiry
        self._order_head = 0

    def add(self, chunk: dict[str, Any]) -> dict[str, np.ndarray]:
        """Store a packed chunk's new frames; returns its framed fields as frame numbers int64
        (B, C) and ``_oldest`` int64 (B,) (class docstring)."""
        names = chunk[frames.FRAMED]
        refs = np.concatenate([chunk[name].reshape(len(chunk[name]), -1) for name in names], axis=1)  # (B, K)
        used = np.unique(refs)
        local = chunk[frames.FRAMES]
        # The chunk stores at most len(used) new frames: a match below `floor` could lose its slot to them.
        floor = self.total + len(used) - self.size
        number = np.zeros(len(local), np.int64)
        for j in used:
            number[j] = self._find_or_store(local[j], floor)
        out = {name: number[chunk[name]] for name in names}
        oldest = np.minimum.accumulate(number[refs].min(axis=1)[::-1])[::-1]
        out[frames.OLDEST] = np.minimum(oldest, self.total - self.WINDOW)
        return out

    def _find_or_store(self, frame: np.ndarray, floor: int) -> int:
        raw = frame.tobytes()
        h = hash(raw)
        self._expire()
        for s in reversed(self._recent.get(h, ())):  # newest first
            if s >= floor and self._frames[s % self.size].tobytes() == raw:  # equal hashes confirmed byte for byte
                return s
        s = self.total
        self._frames[s % self.size] = frame
        self.total += 1
        self._recent.setdefault(h, []).append(s)
        self._order.append((h, s))
        return s

    def _expire(self) -> None:
        """Forget frames older than the window: they are never matched again."""
        lo = self.total - self.WINDOW
        while self._order_head < len(self._order) and self._order[self._order_head][1] < lo:
            h, s = self._order[self._order_head]
            bucket = self._recent[h]
            bucket.remove(s)
            if not bucket:
                del self._recent[h]
            self._order_head += 1
        if self._order_head > 2 * self.WINDOW:  # compact the expiry list now and then
            del self._order[: self._order_head]
            self._order_head = 0

    def oldest_intact(self) -> int:
        """The oldest frame number whose slot still holds it; rows whose ``_oldest`` is below must go."""
        return self.total - self.size

    def gather(self, numbers: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Frame numbers int64 (B, C) -> uint8 (B, *shape) images."""
        return self._frames[numbers % self.size].reshape(len(numbers), *shape)


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


class PrioritizedReplayBuffer(ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016, "Prioritized Experience Replay").

    Sampling probability P(i) = p_i / sum_k p_k with p_i = (|delta_i| + eps)^alpha; new rows
    enter at the largest priority seen so far, so each is replayed at least once soon. Samples
    carry importance-sampling weights w_i = (N * P(i))^-beta / max_batch w (field ``weight``,
    float32 (B,)), with beta annealed linearly from ``beta`` to 1 over ``beta_anneal_iters``
    train iterations; the learner then feeds back |delta| through :meth:`update_priorities`.

    Args:
        capacity, schema, framed: as :class:`ReplayBuffer`.
        alpha: priority exponent (0 = uniform).
        beta: initial importance-sampling exponent.
        beta_anneal_iters: train iterations over which beta reaches 1 (0: stays at ``beta``).
        eps: added to |delta| so no transition's probability reaches 0.
    """

    def __init__(self, capacity: int, schema: dict[str, tuple[tuple[int, ...], np.dtype]], alpha: float = 0.6,
                 beta: float = 0.4, beta_anneal_iters: int = 0, eps: float = 1e-6,
                 framed: list[str] | tuple[str, ...] = ()) -> None:
        super().__init__(capacity, schema, framed)
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

    def _evicted(self, idx: np.ndarray) -> None:
        self._tree.update(idx, np.zeros(len(idx)))

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
            idx = self._tree.find(np.minimum(mass, np.nextafter(total, 0)))
            # Float rounding can land on an empty leaf (never written, or evicted): take the newest row there.
            idx = np.where(self._tree.get(idx) > 0, idx, (self._next - 1) % self.capacity)
            prob = self._tree.get(idx) / total
            w = (self._size * prob) ** -self.beta(train_iter)
            out = self._rows(idx)
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
