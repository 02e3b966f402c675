"""Lua scripts for the writes that must be atomic and lease-checked.

A task whose lease (``rqrl:{exp}:task:{task_id}:lease``) was revoked — the coordinator
declared it dead and issued a replacement — must not publish anything more. Each script checks
the lease and performs its writes in one atomic step, so a zombie can never interleave with
its replacement. Scripts are sent with EVALSHA (redis-py's ``register_script``).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import redis

# KEYS: lease, data, meta stream, envstep counter, buffer stats, policy hash, stop, staged data, collect setting
# ARGV: maxlen, env_steps, field1, value1, ...
# -> {1, counter, policy version|nil, envstep_limit|nil, stop, policy error|'', collect setting|nil}
#    or {0} when the lease is gone.
# The blob itself is not an argument: the same MULTI/EXEC first SETs it (with its TTL) at the
# staged key, and the script RENAMENXes it to the data key (O(1): Redis moves the value, where a
# SET from Lua would copy it twice, ~0.6 ms per 800 KB) or deletes it, so nothing is left when
# the lease is gone. Idempotent by data key: a call whose data key already exists (a retry after
# a lost reply; the learner leaves an empty tombstone there until the TTL) adds no stream entry
# and no env steps, and is counted as `resent`.
# The policy is read with pcall: a key of the wrong type there must not fail the chunk (whose
# writes a script error would leave half done); the error comes back for the caller to report.
_SEND_CHUNK = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[8])
  return {0}
end
local counter
if redis.call('RENAMENX', KEYS[8], KEYS[2]) == 1 then
  local fields = {}
  for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[1], '*', unpack(fields))
  counter = redis.call('INCRBY', KEYS[4], ARGV[2])
  redis.call('HINCRBY', KEYS[5], 'produced', 1)
  redis.call('HINCRBY', KEYS[5], 'produced_env_steps', ARGV[2])
else
  redis.call('DEL', KEYS[8])
  counter = tonumber(redis.call('GET', KEYS[4]) or '0')
  redis.call('HINCRBY', KEYS[5], 'resent', 1)
end
local pol = redis.pcall('HMGET', KEYS[6], 'version', 'envstep_limit')
local setting = redis.call('GET', KEYS[9])
if pol.err then return {1, counter, false, false, redis.call('EXISTS', KEYS[7]), pol.err, setting} end
return {1, counter, pol[1], pol[2], redis.call('EXISTS', KEYS[7]), '', setting}
"""

# KEYS: lease, meta stream, buffer stats
# ARGV: group, then per entry: id, data key ('' for none), env_steps, status (consumed, expired,
# corrupt, malformed, duplicate, trimmed)
# -> per entry 1 (first ack: counted under status) or 0 (a duplicate: counted as `duplicate`);
#    or {-1} when the lease is gone.
# An entry is a duplicate when its id was acked already (a re-delivery) or when its chunk was
# consumed under another entry: a consumed blob is replaced by an empty tombstone that keeps
# the blob's TTL, so a second entry with the same data_id finds it (status 'duplicate' from the
# reader, or 'consumed' when both copies are in one batch).
_ACK_CHUNKS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
local out = {}
for i = 2, #ARGV, 4 do
  local acked = redis.call('XACK', KEYS[2], ARGV[1], ARGV[i])
  local key, status = ARGV[i + 1], ARGV[i + 3]
  -- A 'trimmed' entry (its stream entry is gone) may have left the pending list already: Redis 7's
  -- XAUTOCLAIM drops it and names it to that one caller, so it is counted here once either way.
  if status == 'trimmed' then acked = 1 end
  if acked == 1 and status == 'consumed' and redis.call('EXISTS', key) == 1 and redis.call('STRLEN', key) == 0 then
    status = 'duplicate'
  end
  if acked == 1 and status ~= 'duplicate' then
    if key ~= '' and redis.call('EXISTS', key) == 1 then redis.call('SET', key, '', 'KEEPTTL') end
    redis.call('HINCRBY', KEYS[3], status, 1)
    if status == 'consumed' then redis.call('HINCRBY', KEYS[3], 'env_steps', ARGV[i + 2]) end
    out[#out + 1] = 1
  else
    redis.call('HINCRBY', KEYS[3], 'duplicate', 1)
    out[#out + 1] = 0
  end
end
return out
"""

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


def _script(conn: redis.Redis, name: str, body: str) -> Any:
    cache = conn.__dict__.setdefault("_rqrl_scripts", {})
    if name not in cache:
        cache[name] = conn.register_script(body)
    return cache[name]


class Chunk(NamedTuple):
    """One staged chunk for :func:`send_chunks`: ``keys`` as the chunk script's KEYS (see
    ``_SEND_CHUNK``: lease, data, ..., staged data, collect setting), the blob, its env steps and
    metadata fields."""

    keys: Sequence[str]
    payload: bytes
    env_steps: int
    fields: dict[str, str]


def send_chunks(conn: redis.Redis, chunks: Sequence[Chunk], ttl_s: int, maxlen: int) -> list:
    """Send chunks in one round trip: a pipeline holding, per chunk, the blob's SET at its staged
    key and the chunk script (see ``_SEND_CHUNK``). No MULTI/EXEC is needed: only this call writes
    the staged key, and the script decides everything else atomically; a staged blob whose
    script never ran (a lost connection) is written again by the retry, or expires.

    Returns:
        The last chunk's ``[1, counter, version|None, envstep_limit|None, stop, policy_error,
        collect_setting|None]``; ``policy_error`` names the policy key when it could not be read
        (by any chunk), else ``""``; ``collect_setting`` is the raw JSON of the run's current
        collect setting (bytes), None while the coordinator has written none.

    Raises:
        LeaseRevoked: the lease is gone (names it); no chunk sent after it was revoked was written.
    """
    script = _script(conn, "send_chunk", _SEND_CHUNK)
    for attempt in (0, 1):
        pipe = conn.pipeline(transaction=False)
        for c in chunks:
            flat: list[Any] = [int(maxlen), int(c.env_steps)]
            for k, v in c.fields.items():
                flat += [k, v]
            pipe.set(c.keys[7], c.payload, ex=int(ttl_s))
            pipe.evalsha(script.sha, len(c.keys), *c.keys, *flat)
        try:
            replies = pipe.execute()[1::2]
            break
        except redis.exceptions.NoScriptError:
            # Redis lost its script cache (a restart, SCRIPT FLUSH): only the staged blobs were
            # written, and the next attempt overwrites them.
            if attempt:
                raise
            conn.script_load(_SEND_CHUNK)
    errors = []
    for c, reply in zip(chunks, replies):
        if reply[0] == 0:
            raise LeaseRevoked(f"lease {c.keys[0]} was revoked; this task was replaced")
        if reply[5]:
            err = reply[5].decode(errors="replace") if isinstance(reply[5], bytes) else str(reply[5])
            errors.append(f"{c.keys[5]}: {err}")
    last = list(replies[-1])
    last[5] = errors[-1] if errors else ""
    return last


def ack_chunks(conn: redis.Redis, lease_key: str, stream: str, stats_key: str, group: str,
               entries: Sequence[tuple[bytes, str, int, str]]) -> list[int]:
    """Ack entries atomically with their accounting (see ``_ACK_CHUNKS``); returns per-entry 1/0."""
    args: list[Any] = [group]
    for entry_id, data_key, env_steps, status in entries:
        args += [entry_id, data_key, int(env_steps), status]
    reply = _script(conn, "ack_chunks", _ACK_CHUNKS)(keys=[lease_key, stream, stats_key], args=args)
    if reply and reply[0] == -1:
        raise LeaseRevoked(f"lease {lease_key} was revoked; this learner was replaced")
    return [int(x) for x in reply]


def put_versioned_leased(conn: redis.Redis, lease_key: str, key: str, mapping: dict[str, Any],
                         channel: str = "", message: str = "") -> None:
    """Replace hash ``key`` with ``mapping`` (and PUBLISH) only while ``lease_key`` exists.

    Raises:
        LeaseRevoked: the lease is gone (names it).
    """
    args: list[Any] = [channel, message]
    for k, v in mapping.items():
        args += [k, v]
    if _script(conn, "put_versioned", _PUT_VERSIONED)(keys=[lease_key, key], args=args) == 0:
        raise LeaseRevoked(f"lease {lease_key} was revoked; not writing {key}")
