"""Will the learner's replay buffer fit? Checked before it is allocated, and shown by ``rqrl config show``.

The estimate is the buffer's own arrays (common/frames.py :func:`buffer_bytes`: rows, plus each
image frame once) for ``policy.other.replay_buffer.replay_buffer_size`` transitions. Memory
available is the least of the host's ``MemAvailable`` (/proc/meminfo) and the room left under
a cgroup limit (containers, Kubernetes pods: ``memory.max`` - ``memory.current``). numpy
allocates lazily, so without this check an oversized buffer starts and is killed hours later.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from common import frames
from common.spaces import SpaceSpec

# Room kept for everything else the learner holds (torch, the model, batches, chunks in flight).
HEADROOM = 0.9


class MemoryBudgetError(MemoryError):
    """The replay buffer would not fit (names ``replay_buffer_size`` and the estimate); ends the run."""

    fatal = True  # a new learner task would fail the same way


def replay_bytes(cfg: Any, spec: SpaceSpec, schema: dict[str, Any], capacity: Optional[int] = None) -> int:
    """Bytes of a replay buffer of ``capacity`` rows (default ``replay_buffer_size``) with this policy schema."""
    if capacity is None:
        capacity = int(cfg.policy.other.replay_buffer.replay_buffer_size)
    return frames.buffer_bytes(capacity, schema, frames.framed_fields(spec, schema))


def _read_int(path: Path) -> Optional[int]:
    try:
        raw = path.read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(raw) if raw.isdigit() else None  # "max" (no limit) reads as None


def available_bytes() -> Optional[tuple[int, str]]:
    """``(bytes, where)``: memory this process may still allocate, or None where it cannot be read."""
    found: list[tuple[int, str]] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append((int(line.split()[1]) * 1024, "MemAvailable"))
    except OSError:
        pass
    cg = Path("/sys/fs/cgroup")
    limit, used = _read_int(cg / "memory.max"), _read_int(cg / "memory.current")
    if limit is not None and used is not None:
        found.append((max(0, limit - used), "cgroup memory.max"))
    return min(found) if found else None


def _gb(n: float) -> str:
    return f"{n / 2**30:.2f} GB" if n >= 2**30 else f"{n / 2**20:.1f} MB"


def check(cfg: Any, spec: SpaceSpec, schema: dict[str, Any], capacity: Optional[int] = None) -> tuple[int, str]:
    """Estimate the replay buffer of ``capacity`` rows (default ``replay_buffer_size``; a rank of
    a learner group holds its share) and compare it with the memory available.

    Returns:
        ``(bytes, message)``: the estimate and a line to log.

    Raises:
        MemoryBudgetError: the estimate exceeds :data:`HEADROOM` of the memory available.
    """
    size = int(cfg.policy.other.replay_buffer.replay_buffer_size)
    rows = size if capacity is None else capacity
    need = replay_bytes(cfg, spec, schema, rows)
    avail = available_bytes()
    where = f"{_gb(avail[0])} available ({avail[1]})" if avail else "memory available unknown"
    msg = f"replay buffer: {rows} transitions need {_gb(need)} ({need / max(rows, 1):.0f} bytes each); {where}"
    if avail and need > HEADROOM * avail[0]:
        share = f" ({rows} rows on this learner rank)" if rows != size else ""
        raise MemoryBudgetError(f"config key 'policy.other.replay_buffer.replay_buffer_size' = {size}{share} needs "
                                f"~{_gb(need)} but only {where} on this machine; lower replay_buffer_size or give the "
                                "learner more memory")
    return need, msg
