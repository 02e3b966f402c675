"""Blobs in Redis: step-data chunks (strings with a TTL) and versioned blobs (policies, checkpoints).

A versioned blob lives in one hash::

    HGET rqrl:{exp}:policy:{policy_id} version     -> b"42"   (cheap check for collectors)
    fields: version, train_iter, nbytes, n_chunks, chunk:0 .. chunk:{n-1}, plus caller metadata

It is written in one MULTI/EXEC transaction (DEL + HSET) and read with one HGETALL. Redis
runs both atomically, so a reader can never observe a half-written or mixed-version blob; this
replaces the seed's file lock (``read_file(path, use_lock=True)``) without lock round trips.
Payloads are split into chunks of at most :data:`CHUNK_BYTES` so no field approaches Redis's
512 MB string limit.
"""

from __future__ import annotations

from typing import Iterable

import redis

CHUNK_BYTES = 8 * 1024 * 1024


class BlobError(RuntimeError):
    """A blob is missing, incomplete or corrupt; the message names the key."""


def versioned_fields(payload: bytes, version: int,
                     meta: dict[str, str | int | float] | None = None) -> dict[str, bytes | str | int | float]:
    """The hash fields of version ``version`` of a versioned blob holding ``payload`` (module docstring)."""
    chunks = [payload[i : i + CHUNK_BYTES] for i in range(0, len(payload), CHUNK_BYTES)] or [b""]
    fields: dict[str, bytes | str | int | float] = dict(meta or {})
    fields.update(version=int(version), nbytes=len(payload), n_chunks=len(chunks))
    fields.update({f"chunk:{i}": c for i, c in enumerate(chunks)})
    return fields


def put_versioned(
    conn: redis.Redis, key: str, payload: bytes, version: int, meta: dict[str, str | int | float] | None = None,
    lease_key: str | None = None, channel: str = "", message: str = "",
) -> None:
    """Atomically replace the versioned blob at ``key``.

    Args:
        payload: the bytes (any size; split into ``CHUNK_BYTES`` chunks).
        version: monotonically increasing version (e.g. the learner's train iteration).
        meta: extra scalar fields stored beside the chunks (readable with ``redis-cli HGET``).
        lease_key: when given, write only while this lease exists (see common/scripts.py), and
            PUBLISH ``message`` on ``channel`` in the same atomic step.

    Raises:
        common.scripts.LeaseRevoked: ``lease_key`` is gone.
    """
    mapping = versioned_fields(payload, version, meta)
    if lease_key is not None:
        from common.scripts import put_versioned_leased

        put_versioned_leased(conn, lease_key, key, mapping, channel, message)
        return
    pipe = conn.pipeline(transaction=True)
    pipe.delete(key)
    pipe.hset(key, mapping=mapping)
    if channel:
        pipe.publish(channel, message)
    pipe.execute()


def get_versioned(conn: redis.Redis, key: str) -> tuple[dict[str, str], bytes] | None:
    """Read a versioned blob atomically.

    Returns:
        ``(meta, payload)`` where ``meta`` holds the scalar fields as ``str`` (``version``,
        ``nbytes``, ...), or ``None`` when the key does not exist.

    Raises:
        BlobError: a chunk is missing or the size does not match ``nbytes``.
    """
    fields = conn.hgetall(key)
    if not fields:
        return None
    try:
        n_chunks = int(fields[b"n_chunks"])
        nbytes = int(fields[b"nbytes"])
        payload = b"".join(fields[f"chunk:{i}".encode()] for i in range(n_chunks))
    except (KeyError, ValueError) as e:
        raise BlobError(f"{key}: incomplete versioned blob (missing or bad field {e})") from None
    if len(payload) != nbytes:
        raise BlobError(f"{key}: payload is {len(payload)} bytes, header says {nbytes}")
    meta = {k.decode(): v.decode() for k, v in fields.items() if not k.startswith(b"chunk:")}
    return meta, payload


def get_many(conn: redis.Redis, keys: Iterable[str]) -> list[bytes | None]:
    """Fetch many data blobs in one MGET; ``None`` where a key expired or never existed."""
    keys = list(keys)
    return conn.mget(keys) if keys else []

