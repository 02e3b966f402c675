"""Each image frame once: the chunk encoding of stacked image observations.

A stacked image observation (layout ``chw``: C frames of H x W, e.g. FrameStackObservation's
(4, 84, 84)) shares C-1 frames with the next step's, and a row's ``next_obs`` is a later row's
``obs``: sent as is, a DQN row carries 2C frames of which about one is new. :func:`pack`
replaces every image field of a chunk by indices into one array of the chunk's distinct frames
(found by content: a hash of the frame's bytes, confirmed by comparing the bytes), so a chunk
carries about one frame per row whatever the stack size, n-step or algorithm::

    plain chunk                               packed chunk
    obs       uint8 (B, C, H, W)       ->     obs       int32 (B, C)     indices into frames
    next_obs  uint8 (B, C, H, W)              next_obs  int32 (B, C)
                                              frames    uint8 (N, H, W)  N distinct frames
                                              framed    list[str]        the packed fields

A single-frame image (layout ``hw``) is packed the same way with C = 1 (a row's ``next_obs``
is still a later row's ``obs``). Channels-last images (``hwc``: colour, not a stack) travel as
they are. :func:`unpack` is the exact inverse. The replay buffer keeps the frames once too
(workers/replay_buffer.py :class:`FrameStore`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.spaces import SpaceSpec

FRAMES, FRAMED = "frames", "framed"


def framed_fields(spec: SpaceSpec, schema: dict[str, tuple[tuple[int, ...], np.dtype]]) -> list[str]:
    """The schema's fields that hold the env's image observation and can be packed (``chw`` / ``hw``)."""
    if spec.obs_kind != "image" or spec.obs_layout not in ("chw", "hw"):
        return []
    return [k for k, (shape, dt) in schema.items() if tuple(shape) == tuple(spec.obs_shape) and np.dtype(dt) == np.uint8]


class FrameIndex:
    """Distinct frames by content: ``add`` returns the index of an equal frame seen before, or stores it."""

    def __init__(self) -> None:
        self._by_hash: dict[int, list[int]] = {}
        self._raw: list[bytes] = []
        self.frames: list[np.ndarray] = []

    def add(self, frame: np.ndarray) -> int:
        raw = frame.tobytes()
        bucket = self._by_hash.setdefault(hash(raw), [])
        for i in bucket:  # equal hashes are confirmed byte for byte
            if self._raw[i] == raw:
                return i
        bucket.append(len(self.frames))
        self._raw.append(raw)
        self.frames.append(frame)
        return len(self.frames) - 1


def pack(chunk: dict[str, np.ndarray], fields: list[str]) -> dict[str, Any]:
    """The packed form of ``chunk`` (module docstring); ``chunk`` itself is returned when ``fields`` is empty."""
    if not fields:
        return chunk
    index = FrameIndex()
    out: dict[str, Any] = {k: v for k, v in chunk.items() if k not in fields}
    for name in fields:
        arr = chunk[name]
        stack = arr if arr.ndim == 4 else arr[:, None]  # (B, C, H, W); C = 1 for hw
        out[name] = np.array([[index.add(f) for f in row] for row in stack], np.int32).reshape(stack.shape[:2])
    out[FRAMES] = np.stack(index.frames) if index.frames else np.zeros((0, *chunk[fields[0]].shape[-2:]), np.uint8)
    out[FRAMED] = list(fields)
    return out


def is_packed(chunk: Any) -> bool:
    return isinstance(chunk, dict) and FRAMED in chunk


def check_packed(chunk: dict[str, Any], schema: dict[str, tuple[tuple[int, ...], np.dtype]], what: str) -> int:
    """Validate the packed fields of ``chunk``: frames uint8 (N, H, W) of the schema's frame size,
    indices ints (B, C) within [0, N). Returns N.

    Raises:
        ValueError: naming ``what`` and the field.
    """
    framed, frames = chunk.get(FRAMED), chunk.get(FRAMES)
    if not isinstance(framed, list) or not all(isinstance(f, str) and f in schema for f in framed):
        raise ValueError(f"{what}: field {FRAMED!r} must list schema fields, got {framed!r}")
    if not framed:
        raise ValueError(f"{what}: field {FRAMED!r} is empty")
    shape = tuple(schema[framed[0]][0])
    hw, c = shape[-2:], (shape[0] if len(shape) == 3 else 1)
    if not isinstance(frames, np.ndarray) or frames.dtype != np.uint8 or frames.shape[1:] != hw:
        raise ValueError(f"{what}: field {FRAMES!r} must be uint8 (N, {hw[0]}, {hw[1]}), got "
                         f"{getattr(frames, 'dtype', type(frames).__name__)} {getattr(frames, 'shape', '')}")
    for name in framed:
        idx = chunk.get(name)
        if not isinstance(idx, np.ndarray) or idx.dtype.kind not in "iu" or idx.ndim != 2 or idx.shape[1] != c:
            raise ValueError(f"{what}: packed field {name!r} must be int indices (B, {c})")
        if idx.size and (idx.min() < 0 or idx.max() >= len(frames)):
            raise ValueError(f"{what}: packed field {name!r} indexes outside its {len(frames)} frames")
    return len(frames)


def unpack(chunk: dict[str, Any], schema: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack` (a plain chunk is returned as is)."""
    if not is_packed(chunk):
        return chunk
    frames = chunk[FRAMES]
    out = {k: v for k, v in chunk.items() if k not in (FRAMES, FRAMED)}
    for name in chunk[FRAMED]:
        out[name] = frames[chunk[name]].reshape(len(chunk[name]), *schema[name][0])
    return out


# ---------------------------------------------------------------- replay memory layout (workers/replay_buffer.py)

WINDOW = 4096  # frames a replay buffer searches for a match (~29 MB of 84x84 frames)
OLDEST = "_oldest"  # per-row field: a lower bound on the row's frame numbers (workers/replay_buffer.py)


def row_layout(schema: dict[str, tuple[tuple[int, ...], np.dtype]], framed: Any) -> list[tuple[str, tuple]]:
    """A replay buffer's per-row arrays: a framed field keeps int64 frame numbers (C,) instead of
    pixels, and framed buffers add :data:`OLDEST` int64."""
    out = []
    for k, (shape, dt) in schema.items():
        out.append((k, ((shape[0] if len(shape) == 3 else 1,), np.dtype(np.int64)) if k in framed else (tuple(shape), np.dtype(dt))))
    if framed:
        out.append((OLDEST, ((), np.dtype(np.int64))))
    return out


def frame_capacity(capacity: int, frames_per_row: float) -> int:
    """Frames a replay buffer of ``capacity`` rows keeps: ``capacity * frames_per_row`` plus the match window."""
    return int(np.ceil(capacity * frames_per_row)) + WINDOW


def buffer_bytes(capacity: int, schema: dict[str, tuple[tuple[int, ...], np.dtype]], framed: Any = (),
                 frames_per_row: float = 1.1) -> int:
    """Bytes a replay buffer of ``capacity`` rows allocates for its arrays (rows and frames)."""
    row = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize for _, (shape, dt) in row_layout(schema, framed))
    total = capacity * row
    if framed:
        shape = schema[list(framed)[0]][0]
        total += frame_capacity(capacity, frames_per_row) * int(shape[-1] * shape[-2])
    return int(total)
