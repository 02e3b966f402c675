"""Redis server limits a run can hit: ``maxclients`` and ``proto-max-bulk-len``.

Hit mid-run, neither says so where rqrl looks: a connection Redis refuses (``maxclients``)
makes a task miss its heartbeat, and a value longer than ``proto-max-bulk-len`` fails every
write of it with "Protocol error: invalid bulk length", a task retried forever. So both are
read at the start (``maxclients`` from ``INFO clients``; ``proto-max-bulk-len`` with ``CONFIG
GET``, which a least-privilege ACL user may not run: then it is not checked) and a run that
cannot fit is refused naming the limit; mid-run, :class:`RejectionWatch` and :func:`explain`
name the limit in the reason the run stops.
"""

from __future__ import annotations

from typing import Any, Optional

import redis

from common import blobstore
from common.redis_memory import RedisNotSuitable, model_sizes

# Redis connections a run may hold at its peak (measured: 29 with 3 collector workers, a learner,
# the coordinator and rqrl train): RQ's and the task's clients, heartbeat and presence threads,
# pub/sub, per worker process; the coordinator's pool and its threads, the launcher, rqrl status.
CLIENTS_BASE = 5
CLIENTS_PER_WORKER = 6

_BULK_ERROR = "invalid bulk length"


def clients_needed(collectors: int, learners: int = 1) -> int:
    """Redis connections a run with ``collectors`` collector tasks (one more worker kept for evals)
    and ``learners`` learner workers may hold at its peak."""
    return CLIENTS_BASE + CLIENTS_PER_WORKER * (collectors + 1 + learners)


def largest_bulk(cfg: Any) -> int:
    """Bytes of the longest single value a run of ``cfg`` writes (an upper estimate): a chunk of
    a weights blob (a checkpoint holds ~4 tensors a parameter; blobs are split at
    :data:`common.blobstore.CHUNK_BYTES`) or a step-data chunk (``n_sample`` rows, twice over)."""
    params, row = model_sizes(cfg)
    n_sample = int(cfg.get("policy", {}).get("collect", {}).get("n_sample", 128) or 128)
    return max(min(blobstore.CHUNK_BYTES, 4 * 4 * params), 2 * n_sample * row)


def _acl_user(conn: redis.Redis) -> bool:
    """True when the client logs in as a named ACL user (who may not run ``CONFIG``: trying would
    leave a denial in ``ACL LOG``)."""
    user = conn.connection_pool.connection_kwargs.get("username")
    return bool(user) and user != "default"


def proto_max_bulk_len(conn: redis.Redis) -> Optional[int]:
    """``proto-max-bulk-len`` in bytes, or None when it cannot be read (an ACL user, ``CONFIG`` refused)."""
    if _acl_user(conn):
        return None
    try:
        got = conn.config_get("proto-max-bulk-len")
    except redis.ResponseError:
        return None
    value = got.get("proto-max-bulk-len") or got.get(b"proto-max-bulk-len")
    return int(value) if value is not None else None


def _mb(n: float) -> str:
    return f"{n / 2**20:.1f} MB"


def check(conn: redis.Redis, cfg: Any, collectors: int = 2) -> list[str]:
    """Check ``maxclients`` and ``proto-max-bulk-len`` before a run.

    Returns:
        Warnings to print (other clients leave the run less than it may need).

    Raises:
        RedisNotSuitable: ``maxclients`` is below what the run alone may need, or
            ``proto-max-bulk-len`` below the longest value it writes (limit and need named).
    """
    learners = int(cfg.get("policy", {}).get("learn", {}).get("learner_num", 1) or 1)
    need = clients_needed(int(collectors), learners)
    info = conn.info("clients")
    maxclients, connected = int(info.get("maxclients", 0) or 0), int(info.get("connected_clients", 0))
    out = []
    if maxclients and maxclients < need:
        raise RedisNotSuitable(f"Redis maxclients is {maxclients}; this run may open ~{need} connections "
                               f"({collectors} collector tasks, {learners} learner): raise maxclients "
                               "(redis.conf or CONFIG SET maxclients)")
    if maxclients and maxclients - connected < need:
        out.append(f"Redis maxclients {maxclients} leaves {maxclients - connected} connections free "
                   f"({connected} in use); this run may open ~{need}: a refused connection stops it")
    limit, bulk = proto_max_bulk_len(conn), largest_bulk(cfg)
    if limit is not None and limit < bulk:
        raise RedisNotSuitable(f"Redis proto-max-bulk-len is {_mb(limit)} ({limit} bytes); this run writes values "
                               f"of up to ~{_mb(bulk)} (weights in {_mb(blobstore.CHUNK_BYTES)} chunks, step data "
                               "chunks): raise proto-max-bulk-len (redis.conf or CONFIG SET)")
    return out


def explain(conn: redis.Redis, error: str) -> str:
    """The server limit a task's error text shows it hit, as a stop reason; "" for any other error.

    Raises:
        nothing: a Redis that cannot say its limit is named without the figure.
    """
    if _BULK_ERROR not in error:
        return ""
    try:
        limit = proto_max_bulk_len(conn)
    except redis.RedisError:
        limit = None
    figure = f" ({_mb(limit)}, {limit} bytes)" if limit is not None else ""
    return (f"Redis proto-max-bulk-len{figure} is below a value this run writes ({error.strip()[:200]}): "
            "raise proto-max-bulk-len; every retry would fail the same way")


class RejectionWatch:
    """Counts the connections Redis refused since the run started (``INFO stats``
    ``rejected_connections``): any refusal means ``maxclients`` was reached, and the worker whose
    connection was refused would be taken for a dead one."""

    def __init__(self, conn: redis.Redis) -> None:
        self._conn = conn
        self._base = self._rejected()

    def _rejected(self) -> int:
        return int(self._conn.info("stats").get("rejected_connections", 0))

    def reason(self) -> str:
        """A stop reason naming ``maxclients`` when Redis refused connections since the start, else "".

        Raises:
            redis.RedisError: INFO failed.
        """
        rejected = self._rejected() - self._base
        if rejected <= 0:
            return ""
        maxclients = self._conn.info("clients").get("maxclients", "?")
        return (f"Redis refused {rejected} connections: maxclients {maxclients} reached (INFO stats "
                "rejected_connections); raise maxclients, or run fewer workers against this Redis")

