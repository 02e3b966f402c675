"""Lua scripts for the writes that must be atomic and lease-checked.

A task whose lease (``rqrl:{exp}:task:{task_id}:lease``) was revoked — the coordinator
declared it dead and issued a replacement — must not publish anything more. Each script checks
the lease and performs its writes in one atomic step, so a zombie can never interleave with
its replacement. Scripts are sent with EVALSHA (redis-py's ``register_script``). The step-data
scripts (a chunk's send, a batch's ack) live with the keys they write, in common/step_data.py.
"""

from __future__ import annotations

from typing import Any

import redis

# KEYS: lease, hash ; ARGV: channel ('' for none), message, field1, value1, ...  -> 1, or 0 without lease
_PUT_VERSIONED = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2])
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
if ARGV[1] ~= '' then redis.call('PUBLISH', ARGV[1], ARGV[2]) end
return 1
"""


class LeaseRevoked(RuntimeError):
    """The task's lease is gone: it was declared dead and replaced; it must stop writing."""


def cached_script(conn: redis.Redis, name: str, body: str) -> Any:
    """Script ``body`` registered on ``conn`` once (redis-py's ``register_script``: EVALSHA,
    loading it again when Redis lost its script cache), cached on the client under ``name``."""
    cache = conn.__dict__.setdefault("_rqrl_scripts", {})
    if name not in cache:
        cache[name] = conn.register_script(body)
    return cache[name]


def put_versioned_leased(conn: redis.Redis, lease_key: str, key: str, mapping: dict[str, Any],
                         channel: str = "", message: str = "") -> None:
    """Replace hash ``key`` with ``mapping`` (and PUBLISH) only while ``lease_key`` exists.

    Raises:
        LeaseRevoked: the lease is gone (names it).
    """
    if cached_script(conn, "put_versioned", _PUT_VERSIONED)(keys=[lease_key, key],
                                                             args=_put_versioned_args(mapping, channel, message)) == 0:
        raise LeaseRevoked(f"lease {lease_key} was revoked; not writing {key}")


def put_versioned_command(conn: redis.Redis, lease_key: str, key: str, mapping: dict[str, Any],
                          channel: str = "", message: str = "") -> list[Any]:
    """:func:`put_versioned_leased` as one EVALSHA command's arguments, for a caller that sends it
    on a connection of its own and reads the reply later (workers/publication.py): the reply is 1,
    or 0 when the lease is gone; a Redis that lost its script cache answers NOSCRIPT, and
    :func:`put_versioned_leased` then loads it again."""
    sha = cached_script(conn, "put_versioned", _PUT_VERSIONED).sha
    return ["EVALSHA", sha, 2, lease_key, key, *_put_versioned_args(mapping, channel, message)]


def _put_versioned_args(mapping: dict[str, Any], channel: str, message: str) -> list[Any]:
    args: list[Any] = [channel, message]
    for k, v in mapping.items():
        args += [k, v]
    return args
