"""Lua scripts for the writes that must be atomic and lease-checked.

A task whose lease (``rqrl:{exp}:task:{task_id}:lease``) was revoked — the coordinator
declared it dead and issued a replacement — must not publish anything more. Each script checks
the lease and performs its writes in one atomic step, so a zombie can never interleave with
its replacement. Scripts are sent with EVALSHA (redis-py's ``register_script``).
"""

from __future__ import annotations

from typing import Any, Sequence

import redis

# KEYS: lease, data, meta stream, envstep counter, buffer stats, policy hash, stop
# ARGV: payload, ttl_s, maxlen, env_steps, field1, value1, ...
# -> {1, counter, policy version|nil, envstep_limit|nil, stop, policy error|''} or {0} when the lease is gone.
# Idempotent by data key: the blob is SET NX, and a call whose data key already exists (a retry
# after a lost reply; the learner leaves an empty tombstone there until the TTL) adds no stream
# entry and no env steps, and is counted as `resent`.
# The policy is read with pcall: a key of the wrong type there must not fail the chunk (whose
# writes a script error would leave half done); the error comes back for the caller to report.
_SEND_CHUNK = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local counter
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[2]) then
  local fields = {}
  for i = 5, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', unpack(fields))
  counter = redis.call('INCRBY', KEYS[4], ARGV[4])
  redis.call('HINCRBY', KEYS[5], 'produced', 1)
  redis.call('HINCRBY', KEYS[5], 'produced_env_steps', ARGV[4])
else
  counter = tonumber(redis.call('GET', KEYS[4]) or '0')
  redis.call('HINCRBY', KEYS[5], 'resent', 1)
end
local pol = redis.pcall('HMGET', KEYS[6], 'version', 'envstep_limit')
if pol.err then return {1, counter, false, false, redis.call('EXISTS', KEYS[7]), pol.err} end
return {1, counter, pol[1], pol[2], redis.call('EXISTS', KEYS[7]), ''}
"""

# KEYS: lease, meta stream, buffer stats
# ARGV: group, then per entry: id, data key ('' for none), env_steps, status
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


def send_chunk(conn: redis.Redis, keys_: Sequence[str], payload: bytes, ttl_s: int, maxlen: int, env_steps: int,
               fields: dict[str, str]) -> list:
    """Run the chunk script (see ``_SEND_CHUNK``); raises :class:`LeaseRevoked` (naming the lease key).

    Returns:
        ``[1, counter, version|None, envstep_limit|None, stop, policy_error]``; ``policy_error``
        names the policy key (``keys_[5]``) when it could not be read, else ``""``.
    """
    flat: list[Any] = [payload, int(ttl_s), int(maxlen), int(env_steps)]
    for k, v in fields.items():
        flat += [k, v]
    reply = _script(conn, "send_chunk", _SEND_CHUNK)(keys=list(keys_), args=flat)
    if reply[0] == 0:
        raise LeaseRevoked(f"lease {keys_[0]} was revoked; this task was replaced")
    err = reply[5].decode(errors="replace") if isinstance(reply[5], bytes) else str(reply[5] or "")
    reply[5] = f"{keys_[5]}: {err}" if err else ""
    return reply


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
