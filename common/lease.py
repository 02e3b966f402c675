"""A task's write lease: one key, shared by both planes (as RQ's ``suspension.py``).

The coordinator grants ``rqrl:{exp}:task:{task_id}:lease`` when it dispatches a task and
revokes it when it declares the task dead or done; every write a task makes (chunks, acks,
policy and checkpoint publications) runs in a Lua script that first checks the lease
(common/scripts.py), so a zombie task can never write after its replacement started.
"""

from __future__ import annotations

from typing import Union

import redis

from common import keys
from common.scripts import LeaseRevoked

Client = Union[redis.Redis, "redis.client.Pipeline"]

__all__ = ["LeaseRevoked", "grant", "held", "revoke"]


def grant(conn: Client, exp: str, task_id: str, ttl_s: int) -> None:
    """Give ``task_id`` its lease for ``ttl_s`` seconds (queued on ``conn`` when it is a pipeline)."""
    conn.set(keys.lease(exp, task_id), "1", ex=int(ttl_s))


def revoke(conn: Client, exp: str, *task_ids: str) -> None:
    """Take the leases of ``task_ids`` away: their later writes are refused."""
    if task_ids:
        conn.delete(*(keys.lease(exp, t) for t in task_ids))


def held(conn: redis.Redis, exp: str, task_id: str) -> bool:
    """True while ``task_id`` may write."""
    return bool(conn.exists(keys.lease(exp, task_id)))
