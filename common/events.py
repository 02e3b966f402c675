"""Worker -> coordinator events on the ``rqrl:{exp}:events`` stream.

Each entry has the fields ``type`` (one of :data:`EVENT_TYPES`), ``task_id``, ``task_type``
(``collector`` or ``learner``), ``ts`` (unix seconds) and the event's own scalar fields, e.g.::

    redis-cli XRANGE rqrl:cartpole_dqn/20261130T021500Z-s0:events - + COUNT 5
    ... type finished task_id collector_task_3f2a... task_type collector eval_flag true reward_mean 200.4 ...
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Optional

import redis

from common import keys, streams

# "scalars" and "log" carry a task's TensorBoard scalars and log lines to the coordinator's run
# folder (common/logs.py): a learner on another machine writes nothing on its own disk. A collector's
# "scalars" also carry its finished training episodes (workers/episode_shipper.py).
EVENT_TYPES = ("started", "finished", "failed", "learner_info", "scalars", "log")

# Fields of a collector's ``finished`` event that are per-episode figures: a task that finished
# no episode (``real_episode_count`` 0) has none of them, and sends none.
EPISODE_FIELDS = ("reward_mean", "reward_std", "avg_step_per_episode", "avg_time_per_episode")
TASK_TYPES = ("collector", "learner")


def emit(conn: redis.Redis, exp: str, type_: str, task_id: str, task_type: str, **fields: Any) -> bytes:
    """XADD one event; returns its stream id (``conn`` a pipeline: the pipeline, the id comes with
    its ``execute()``, and this process's clock is not checked against Redis's).

    Raises:
        ValueError: unknown event or task type.
    """
    if type_ not in EVENT_TYPES:
        raise ValueError(f"event type {type_!r} is not one of {EVENT_TYPES}")
    if task_type not in TASK_TYPES:
        raise ValueError(f"task_type {task_type!r} is not one of {TASK_TYPES}")
    body = {"type": type_, "task_id": task_id, "task_type": task_type, "ts": round(time.time(), 3)}
    body.update(fields)
    # No MAXLEN here: a cap would drop events the coordinator has not read yet (it may be down
    # for a while). The coordinator trims what it has read (see coordinator/daemon.py).
    entry_id = streams.add(conn, keys.events(exp), body, maxlen=None)
    if isinstance(entry_id, (bytes, str)):  # on a pipeline the id comes with its execute(): no check
        _warn_if_skewed(clock_offset_s(entry_id, body["ts"]))
    return entry_id


# Seconds a process's clock may differ from Redis's before it is warned about (its log; the
# coordinator's log and rqrl status for the workers' clocks).
CLOCK_SKEW_WARN_S = 5.0
_skew_warned = False


def clock_offset_s(entry_id: bytes | str, ts: float) -> float:
    """This writer's clock minus Redis's, in seconds: ``ts`` (its unix time when it sent the entry)
    against the stream entry id Redis gave it (milliseconds of the server's clock). A round trip
    adds at most its own length."""
    ms = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")[0]
    return float(ts) - int(ms) / 1000.0


def _warn_if_skewed(offset: float) -> None:
    global _skew_warned
    if abs(offset) > CLOCK_SKEW_WARN_S and not _skew_warned:
        _skew_warned = True
        logging.getLogger("rqrl.clock").warning(
            "this machine's clock is %+.1f s off Redis's (more than %g s): rqrl takes run times from one clock, "
            "but RQ's own job bookkeeping on this worker uses this one; synchronize it (NTP)", offset,
            CLOCK_SKEW_WARN_S)


def parse(stream: str, entry_id: bytes, raw: dict[bytes, bytes]) -> dict[str, Any]:
    """Decode and check an event entry.

    Raises:
        streams.MalformedEntry: a missing/ill-typed common field or an unknown type, naming the entry.
    """
    where = f"{stream} entry {entry_id.decode() if isinstance(entry_id, bytes) else entry_id}"
    ev = streams.decode_fields(raw)
    streams.require(ev, {"type": str, "task_id": str, "task_type": str}, where)
    if ev["type"] not in EVENT_TYPES:
        raise streams.MalformedEntry(f"{where}: unknown event type {ev['type']!r}")
    if ev["task_type"] not in TASK_TYPES:
        raise streams.MalformedEntry(f"{where}: unknown task_type {ev['task_type']!r}")
    return ev


def consumed_env_steps(info: dict[str, Any], default: int = 0) -> int:
    """Env steps the learner had consumed, from a ``learner_info`` report or a learner checkpoint's
    state (``default`` when it has none); those written before the field's rename carry the seed's
    name ``collector_envstep`` (DI-engine's ``BaseLearner``).

    Raises:
        ValueError, TypeError: the field is not a number.
    """
    value = info.get("consumed_env_steps", info.get("collector_envstep"))
    return default if value is None else int(value)


def figure(ev: dict[str, Any], name: str) -> Optional[float]:
    """Field ``name`` of a decoded event (or of a record built from one) as a finite float, or
    None when there is no number: the field is absent, empty, not a number, NaN or infinite.

    A collector task that finished no episode sends no ``reward_mean`` (its workers omit the
    :data:`EPISODE_FIELDS`); readers treat None as "no number": never plotted, never the best,
    never passing ``stop_value``, shown as ``-`` (JSON: absent or null).
    """
    value = ev.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def episode_figure(ev: dict[str, Any], name: str) -> Optional[float]:
    """A per-episode figure (one of :data:`EPISODE_FIELDS`) of a collector's ``finished`` event or
    of an eval record: :func:`figure`, but None whenever the event says it finished no episode
    (``real_episode_count`` or a record's ``episodes`` is 0), whatever number it carries: a
    collector of an earlier version sent 0.0 there, which is no reward."""
    for count in ("real_episode_count", "episodes"):
        if count in ev and ev[count] == 0:
            return None
    return figure(ev, name)
