"""Redis Streams helpers: consumer groups, XADD with a cap, blocking group reads, field coding.

Stream fields are plain strings so ``redis-cli XRANGE`` is readable; :func:`encode_fields` and
:func:`decode_fields` convert to and from Python scalars (int, float, bool, str).
"""

from __future__ import annotations

from typing import Any, Iterator

import redis

# Entries are capped approximately; a learner that falls this far behind loses the oldest metadata.
DEFAULT_MAXLEN = 100_000


class MalformedEntry(ValueError):
    """A stream entry lacks a required field or has one of the wrong type (names stream, id, field)."""


def ensure_group(conn: redis.Redis, stream: str, group: str, start_id: str = "0") -> None:
    """Create consumer group ``group`` on ``stream`` (and the stream) if missing; idempotent."""
    try:
        conn.xgroup_create(stream, group, id=start_id, mkstream=True)
    except redis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise


def encode_fields(fields: dict[str, Any]) -> dict[str, str]:
    """Scalars to strings: bools as ``true``/``false``, floats with ``repr`` precision."""
    out = {}
    for k, v in fields.items():
        if isinstance(v, bool):
            out[k] = "true" if v else "false"
        elif isinstance(v, (int, float, str)):
            out[k] = str(v)
        elif v is None:
            out[k] = ""
        else:
            raise TypeError(f"stream field {k!r}: {type(v).__name__} is not a scalar")
    return out


_NUMERIC_START = frozenset("0123456789-+.")


def _decode_value(raw: bytes) -> Any:
    s = raw.decode()
    if s == "true":
        return True
    if s == "false":
        return False
    # Only text that can be a number pays for int()/float() (the coordinator's hot path).
    if s and (s[0] in _NUMERIC_START or s in ("nan", "inf")):
        for cast in (int, float):
            try:
                return cast(s)
            except ValueError:
                pass
    return s


def decode_fields(fields: dict[bytes, bytes]) -> dict[str, Any]:
    """Inverse of :func:`encode_fields` (numbers back to int/float, ``true``/``false`` to bool)."""
    return {k.decode(): _decode_value(v) for k, v in fields.items()}


def require(entry: dict[str, Any], spec: dict[str, type | tuple[type, ...]], where: str) -> None:
    """Check ``entry`` has each field in ``spec`` with the given type.

    Raises:
        MalformedEntry: naming ``where`` (stream and entry id) and the field.
    """
    for name, typ in spec.items():
        if name not in entry:
            raise MalformedEntry(f"{where}: missing field {name!r}")
        types = typ if isinstance(typ, tuple) else (typ,)
        value = entry[name]
        # bool is an int subclass; a "true" where a count belongs is still malformed.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise MalformedEntry(f"{where}: field {name!r} = {value!r} is not {'/'.join(t.__name__ for t in types)}")


def add(conn: redis.Redis, stream: str, fields: dict[str, Any], maxlen: int | None = DEFAULT_MAXLEN) -> bytes:
    """XADD ``fields`` (encoded) with approximate MAXLEN (``None``: no cap); returns the entry id."""
    return conn.xadd(stream, encode_fields(fields), maxlen=maxlen, approximate=True)


def read_group(
    conn: redis.Redis, stream: str, group: str, consumer: str, count: int, block_ms: int
) -> list[tuple[bytes, dict[bytes, bytes]]]:
    """XREADGROUP new entries (``>``), blocking at most ``block_ms`` milliseconds.

    Returns:
        ``[(entry_id, raw_fields), ...]``, empty on timeout.
    """
    reply = conn.xreadgroup(group, consumer, {stream: ">"}, count=count, block=block_ms)
    if not reply:
        return []
    # RESP2 reply: [[stream, [(id, fields), ...]]]; fields is None for an entry trimmed away.
    return [e for _, entries in reply for e in entries if e[1] is not None]


def claim_pending(conn: redis.Redis, stream: str, group: str, consumer: str, count: int,
                  min_idle_ms: int = 0) -> Iterator[tuple[list[tuple[bytes, dict[bytes, bytes]]], list[bytes], int]]:
    """Take over every entry pending in ``group`` on ``stream`` for ``consumer`` (XAUTOCLAIM from
    ``0-0`` to the end, at most ``count`` entries a round): an earlier reader's unacked entries,
    those delivered at least ``min_idle_ms`` milliseconds ago.

    Yields, per round:
        ``(claimed, gone, nil)``: the entries still on the stream (``[(entry_id, raw_fields)]``);
        the ids of pending entries the stream no longer holds (Redis >= 7 names them and drops
        them from the pending list); and how many such entries Redis 6.2 answered as nil, without
        their ids (they stay pending for ``consumer``).
    """
    start: bytes | str = "0-0"
    while True:
        reply = conn.xautoclaim(stream, group, consumer, min_idle_time=min_idle_ms, start_id=start, count=count)
        start, claimed = reply[0], [e for e in reply[1] if e[1] is not None]
        yield claimed, list(reply[2]) if len(reply) > 2 else [], len(reply[1]) - len(claimed)
        if start in (b"0-0", "0-0"):
            return
