"""A run's phases: when it passed each step from launch to exit, recorded by the run itself.

Each phase is a unix timestamp (seconds) in the hash ``rqrl:{exp}:phases``
(:func:`common.keys.phases`), written by the process that passed it: ``rqrl train`` (launch,
Redis, workers, exit), the learner (first policy version, first train iteration) and the
coordinator (evals, final.pt). The coordinator copies the hash into summary.json (``phases``);
``rqrl status`` and the closing block show it as seconds after launch. Timestamps are the
writer's wall clock: on one machine one clock, across machines each writer's own.
"""

from __future__ import annotations

import os
import time
from typing import Optional

import redis

from common import keys

# (name, label, what marks it), in the order a run passes them.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("launch", "launch", "`rqrl train`'s process started"),
    ("redis_up", "redis up", "the private Redis answered (or the given one was checked)"),
    ("workers_up", "workers up", "every worker `rqrl train` started had registered with RQ"),
    ("first_policy", "first policy", "the learner published its first policy version"),
    ("first_train_step", "first train step", "the learner finished its first train iteration"),
    ("first_eval", "first eval", "the first eval task finished"),
    ("passing_eval", "passing eval", "the eval that reached stop_value, the one confirmed, finished"),
    ("confirmation", "confirmation", "the confirming eval finished"),
    ("final_pt", "final.pt", "final.pt and summary.json were written"),
    ("exit", "exit", "`rqrl train` returned"),
)
NAMES = tuple(name for name, _, _ in PHASES)


def record(conn: redis.Redis | redis.client.Pipeline, exp: str, name: str, ts: Optional[float] = None,
           first_only: bool = True) -> None:
    """Write phase ``name`` of run ``exp`` at ``ts`` (default now, unix seconds).

    ``first_only``: keep an earlier value (HSETNX: a replacement learner's first train step is
    not the run's); False overwrites (the passing eval is the last one before convergence).

    Raises:
        ValueError: ``name`` is not one of :data:`NAMES`.
    """
    if name not in NAMES:
        raise ValueError(f"unknown phase {name!r}; phases are {', '.join(NAMES)}")
    value = round(time.time() if ts is None else float(ts), 3)
    if first_only:
        conn.hsetnx(keys.phases(exp), name, value)
    else:
        conn.hset(keys.phases(exp), name, value)


def read(conn: redis.Redis, exp: str) -> dict[str, float]:
    """The phases run ``exp`` recorded so far (name -> unix seconds), in run order."""
    raw = {(k.decode() if isinstance(k, bytes) else k): float(v) for k, v in conn.hgetall(keys.phases(exp)).items()}
    return {name: raw[name] for name in NAMES if name in raw}


def process_start_time(pid: Optional[int] = None) -> float:
    """When process ``pid`` (default this one) started, in unix seconds (10 ms resolution).

    From ``/proc/{pid}/stat`` (start time in clock ticks since boot) and ``CLOCK_BOOTTIME``, so
    the interpreter's own start-up counts; where /proc is missing, the time of this call.
    """
    try:
        stat = open(f"/proc/{pid or os.getpid()}/stat").read()
        ticks = int(stat.rpartition(")")[2].split()[19])  # field 22: starttime (fields after "comm")
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


def seconds(phases: dict[str, float]) -> dict[str, float]:
    """Each phase as seconds after ``launch`` (after the earliest phase when launch is missing)."""
    if not phases:
        return {}
    origin = phases.get("launch", min(phases.values()))
    return {name: round(phases[name] - origin, 2) for name in NAMES if name in phases}


def render(phases: dict[str, float], width: Optional[int] = None, indent: str = "") -> str:
    """Seconds after launch, e.g. ``launch 0.00 s | redis up 0.31 | ... | exit 6.20`` (``none`` when
    empty); with ``width``, broken between phases into lines of at most ``width`` characters, the
    lines after the first starting with ``indent`` (the first is meant to follow a label as
    long as ``indent``)."""
    rel = seconds(phases)
    if not rel:
        return "none"
    labels = {name: label for name, label, _ in PHASES}
    parts = [f"{labels[name]} {value:.2f}" for name, value in rel.items()]
    parts[0] += " s"
    if width is None:
        return " | ".join(parts)
    lines = [parts[0]]
    for part in parts[1:]:
        if len(indent) + len(lines[-1]) + len(" | ") + len(part) + len(" |") > width:
            lines[-1] += " |"
            lines.append(part)
        else:
            lines[-1] += " | " + part
    return ("\n" + indent).join(lines)
