"""The step-data store: every step-data key of one run, its connection and its scripts.

Step data is what collectors send and the learner consumes: the chunk blobs
(``rqrl:{ns}:data:{data_id}``), one metadata stream per buffer
(``rqrl:{ns}:buffer:{buffer_id}:meta``) and its exactly-once accounting
(``rqrl:{ns}:buffer:{buffer_id}:stats``). :class:`StepDataStore` is the one place that names
them (tests/unit/test_step_data_keys.py checks it), in the manner of RQ's registries: a class that
owns a key template, its connection and the operations on it.

The store is handed its *data* connection explicitly. By default it is the run's one connection,
the same that holds the control keys (task leases, the env-step counter, the policy hash, the
stop flag, the collect setting), and the chunk script reads and writes those control keys in the
same atomic step as the step data (see :data:`_SEND_CHUNK`, :data:`_ACK_CHUNKS`).

A *data shard* (``--data-redis-url``, common/data_shards.py) is another Redis server: the store is
then given the ``control`` connection too, and one script can no longer fence and write
atomically. A send is then three round trips: the lease is checked on the control server, the
shard's script writes the chunk (idempotent by ``data_id``: :data:`_WRITE_CHUNK`), and the control
server's script adds the new env steps and reads back the policy, stop flag and collect setting
(:data:`_COUNT_SENT`). An ack checks the lease on the control server, then acks on the shard
(:data:`_ACK_ON_SHARD`). A task revoked between the check and the write may still write (or ack)
that one batch; it is counted once all the same (by ``data_id`` and by XACK), so the accounting
holds; what the fence no longer guarantees on a shard is only that a revoked task adds nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, NamedTuple, Optional, Sequence

import redis

from common import blobstore, keys, streams
from common.scripts import LeaseRevoked, cached_script


class SendKeys(NamedTuple):
    """The KEYS of :data:`_SEND_CHUNK`, in order; the script names them by these field names."""

    lease: str  # control: the sending task's lease
    data: str  # the chunk's blob
    meta: str  # the buffer's metadata stream
    envstep: str  # control: the run's env-step counter
    stats: str  # the buffer's stats hash
    policy: str  # control: the policy hash (version, envstep_limit read back)
    stop: str  # control: the stop flag
    staged: str  # where the blob is SET before the script renames it to ``data``
    collect_setting: str  # control: the run's collect setting (read back)


class AckKeys(NamedTuple):
    """The KEYS of :data:`_ACK_CHUNKS`, in order; the script names them by these field names."""

    lease: str  # control: the acking learner's lease
    meta: str  # the buffer's metadata stream
    stats: str  # the buffer's stats hash


class WriteKeys(NamedTuple):
    """The KEYS of :data:`_WRITE_CHUNK` (a data shard's half of a send), in order."""

    data: str
    meta: str
    stats: str
    staged: str


class CountKeys(NamedTuple):
    """The KEYS of :data:`_COUNT_SENT` (the control server's half of a send to a data shard), in order."""

    envstep: str
    policy: str
    stop: str
    collect_setting: str


class ShardAckKeys(NamedTuple):
    """The KEYS of :data:`_ACK_ON_SHARD` (an ack on a data shard, its lease checked before), in order."""

    meta: str
    stats: str


def _with_named_keys(fields: Sequence[str], body: str) -> str:
    """``body`` preceded by one Lua local per KEYS slot, named as the NamedTuple's fields: the
    Python side and the Lua side then name each slot once, in the same order."""
    return f"local {', '.join(fields)} = unpack(KEYS)\n{body}"


# ARGV: maxlen, env_steps, field1, value1, ...
# -> {1, counter, policy version|nil, envstep_limit|nil, stop, policy error|'', collect setting|nil}
#    or {0} when the lease is gone.
# The blob itself is not an argument: the same pipeline first SETs it (with its TTL) at the
# staged key, and the script RENAMENXes it to the data key (O(1): Redis moves the value, where a
# SET from Lua would copy it twice, ~0.6 ms per 800 KB) or deletes it, so nothing is left when
# the lease is gone. Idempotent by data key: a call whose data key already exists (a retry after
# a lost reply; the learner leaves an empty tombstone there until the TTL) adds no stream entry
# and no env steps, and is counted as `resent`.
# The policy is read with pcall: a key of the wrong type there must not fail the chunk (whose
# writes a script error would leave half done); the error comes back for the caller to report.
_SEND_CHUNK = _with_named_keys(SendKeys._fields, """
if redis.call('EXISTS', lease) == 0 then
  redis.call('DEL', staged)
  return {0}
end
local counter
if redis.call('RENAMENX', staged, data) == 1 then
  local fields = {}
  for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('XADD', meta, 'MAXLEN', '~', ARGV[1], '*', unpack(fields))
  counter = redis.call('INCRBY', envstep, ARGV[2])
  redis.call('HINCRBY', stats, 'produced', 1)
  redis.call('HINCRBY', stats, 'produced_env_steps', ARGV[2])
else
  redis.call('DEL', staged)
  counter = tonumber(redis.call('GET', envstep) or '0')
  redis.call('HINCRBY', stats, 'resent', 1)
end
local pol = redis.pcall('HMGET', policy, 'version', 'envstep_limit')
local setting = redis.call('GET', collect_setting)
if pol.err then return {1, counter, false, false, redis.call('EXISTS', stop), pol.err, setting} end
return {1, counter, pol[1], pol[2], redis.call('EXISTS', stop), '', setting}
""")

# ARGV: group, then per entry: id, data key ('' for none), env_steps, status (consumed, expired,
# corrupt, malformed, duplicate, trimmed)
# -> per entry 1 (first ack: counted under status) or 0 (a duplicate: counted as `duplicate`);
#    or {-1} when the lease is gone.
# An entry is a duplicate when its id was acked already (a re-delivery) or when its chunk was
# consumed under another entry: a consumed blob is replaced by an empty tombstone that keeps
# the blob's TTL, so a second entry with the same data_id finds it (status 'duplicate' from the
# reader, or 'consumed' when both copies are in one batch).
_ACK_BODY = """
local out = {}
for i = 2, #ARGV, 4 do
  local acked = redis.call('XACK', meta, ARGV[1], ARGV[i])
  local key, status = ARGV[i + 1], ARGV[i + 3]
  -- A 'trimmed' entry (its stream entry is gone) may have left the pending list already: Redis 7's
  -- XAUTOCLAIM drops it and names it to that one caller, so it is counted here once either way.
  if status == 'trimmed' then acked = 1 end
  if acked == 1 and status == 'consumed' and redis.call('EXISTS', key) == 1 and redis.call('STRLEN', key) == 0 then
    status = 'duplicate'
  end
  if acked == 1 and status ~= 'duplicate' then
    if key ~= '' and redis.call('EXISTS', key) == 1 then redis.call('SET', key, '', 'KEEPTTL') end
    redis.call('HINCRBY', stats, status, 1)
    if status == 'consumed' then redis.call('HINCRBY', stats, 'env_steps', ARGV[i + 2]) end
    out[#out + 1] = 1
  else
    redis.call('HINCRBY', stats, 'duplicate', 1)
    out[#out + 1] = 0
  end
end
return out
"""
_ACK_CHUNKS = _with_named_keys(AckKeys._fields, "if redis.call('EXISTS', lease) == 0 then return {-1} end" + _ACK_BODY)
_ACK_ON_SHARD = _with_named_keys(ShardAckKeys._fields, _ACK_BODY)

# A data shard's half of a send. ARGV: maxlen, env_steps, nbytes, field1, value1, ... -> 1 (a new
# chunk) or 0 (its data key exists: a retry, counted as `resent`). As :data:`_SEND_CHUNK`, less
# the control keys; ``produced_bytes`` gives summary.json its bytes per shard.
_WRITE_CHUNK = _with_named_keys(WriteKeys._fields, """
if redis.call('RENAMENX', staged, data) == 1 then
  local fields = {}
  for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end
  redis.call('XADD', meta, 'MAXLEN', '~', ARGV[1], '*', unpack(fields))
  redis.call('HINCRBY', stats, 'produced', 1)
  redis.call('HINCRBY', stats, 'produced_env_steps', ARGV[2])
  redis.call('HINCRBY', stats, 'produced_bytes', ARGV[3])
  return 1
end
redis.call('DEL', staged)
redis.call('HINCRBY', stats, 'resent', 1)
return 0
""")

# The control server's half of a send to a data shard. ARGV: env steps of the new chunks
# -> {1, counter, policy version|nil, envstep_limit|nil, stop, policy error|'', collect setting|nil}
# (the reply of :data:`_SEND_CHUNK`).
_COUNT_SENT = _with_named_keys(CountKeys._fields, """
local counter = redis.call('INCRBY', envstep, ARGV[1])
local pol = redis.pcall('HMGET', policy, 'version', 'envstep_limit')
local setting = redis.call('GET', collect_setting)
if pol.err then return {1, counter, false, false, redis.call('EXISTS', stop), pol.err, setting} end
return {1, counter, pol[1], pol[2], redis.call('EXISTS', stop), '', setting}
""")


class Chunk(NamedTuple):
    """One chunk for :meth:`StepDataStore.put`: its id, blob, env steps and metadata fields
    (stream field -> encoded value, as :func:`common.streams.encode_fields` gives)."""

    data_id: str
    payload: bytes
    env_steps: int
    fields: dict[str, str]


class AckEntry(NamedTuple):
    """One stream entry for :meth:`StepDataStore.ack`: the entry id, its chunk's data key ("" for
    none, e.g. a malformed entry), its env steps and its status (consumed, expired, corrupt,
    malformed, duplicate, trimmed)."""

    entry_id: bytes
    data_key: str
    env_steps: int
    status: str


class PutReply(NamedTuple):
    """What :meth:`StepDataStore.put` reads back with the last chunk.

    ``counter``: the run's env-step counter; ``policy_version`` / ``envstep_limit``: raw fields of
    the policy hash (bytes, None while unpublished); ``stop``: the stop flag is set;
    ``policy_error``: names the policy key when it could not be read (by any chunk), else "";
    ``collect_setting``: the raw JSON of the run's collect setting (bytes, None while unwritten).
    """

    counter: int
    policy_version: Optional[bytes]
    envstep_limit: Optional[bytes]
    stop: bool
    policy_error: str
    collect_setting: Optional[bytes]


def _text(raw: Any) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _put_reply(reply: Sequence[Any], policy_error: str) -> PutReply:
    _, counter, version, limit, stop, _, setting = reply
    return PutReply(int(counter), version, limit, bool(stop), policy_error, setting)


def _staged_calls(conn: redis.Redis, name: str, body: str, ttl_s: int,
                  calls: Sequence[tuple[str, bytes, Sequence[str], list[Any], dict[str, str]]]) -> list[Any]:
    """One pipeline of, per call ``(staged key, blob, KEYS, leading ARGV, stream fields)``, the
    blob's SET (TTL ``ttl_s``) and script ``body``; returns the scripts' replies."""
    script = cached_script(conn, name, body)

    def once() -> list[Any]:
        pipe = conn.pipeline(transaction=False)
        for staged, payload, slots, args, fields in calls:
            flat: list[Any] = list(args)
            for field_name, value in fields.items():
                flat += [field_name, value]
            pipe.set(staged, payload, ex=int(ttl_s))
            pipe.evalsha(script.sha, len(slots), *slots, *flat)
        return pipe.execute()[1::2]

    try:
        return once()
    except redis.exceptions.NoScriptError:
        # Redis lost its script cache (a restart, SCRIPT FLUSH): only the staged blobs were
        # written, and the second attempt overwrites them.
        conn.script_load(body)
        return once()


class DataShardError(RuntimeError):
    """A data shard failed (its connection, after the client's retries): names the shard and its
    redacted URL, so that the failure reads as the shard's, never as the worker's."""


class StepDataStore:
    """The step data of run ``ns`` (one buffer's, where ``buffer_id`` is given) on ``conn``.

    Args:
        conn: the data connection: the run's one connection, or a data shard's (module docstring).
        ns: the run's namespace (common/keys.py ``namespace``).
        buffer_id: the buffer whose stream and stats the buffer operations use; "" for a store
            used only run-wide (:meth:`drop_run`, :meth:`drop_blobs`).
        control: the control connection when ``conn`` is a data shard on another server (leases,
            env-step counter, policy, stop flag and collect setting live there); None: ``conn`` is it.
        label: the shard's name in errors, e.g. ``data shard 1 (redis://host:6380/0)``, URL redacted.
        tag: the shard's hash tag when ``conn`` is a Redis Cluster client (common/keys.py
            ``slot_tag``): every key of the store carries it, so each script's keys share a slot.

    Raises:
        ValueError: ``ns`` or ``buffer_id`` is not a valid key component (names it).
    """

    def __init__(self, conn: redis.Redis, ns: str, buffer_id: str = "", control: Optional[redis.Redis] = None,
                 label: str = "", tag: str = "") -> None:
        self.conn, self.ns, self.buffer_id, self.tag = conn, ns, buffer_id, tag
        self.control = conn if control is None else control
        self.label = label
        keys.exp_prefix(ns)  # validates ns now, not at the first operation
        self.meta_key = keys.buffer_meta(ns, buffer_id, tag) if buffer_id else ""
        self._stats_key = keys.buffer_stats(ns, buffer_id, tag) if buffer_id else ""

    @property
    def sharded(self) -> bool:
        """True when the step data is on a data shard, apart from the control keys."""
        return self.control is not self.conn

    @property
    def where(self) -> str:
        """The buffer's stream, with the shard's label when on a data shard (for log lines and errors)."""
        return f"{self.meta_key} on {self.label}" if self.label else self.meta_key

    @contextlib.contextmanager
    def named(self) -> Iterator[None]:
        """Raise a connection failure of a data shard as :class:`DataShardError` naming the shard."""
        if not self.label:
            yield
            return
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError,
                redis.exceptions.RedisClusterException) as e:  # a cluster's: down, no primary for the slot
            raise DataShardError(f"{self.label} failed: {type(e).__name__}: {e}") from e

    def _buffer(self) -> None:
        if not self.buffer_id:
            raise ValueError(f"step-data store of {self.ns!r} was made without a buffer_id")

    def data_key(self, data_id: str) -> str:
        """The key of chunk ``data_id``'s blob (for ack entries and messages).

        Raises:
            ValueError: ``data_id`` is not a valid key component (names it).
        """
        return keys.data(self.ns, data_id, self.tag)

    # -- collector ------------------------------------------------------------------------
    def put(self, chunks: Sequence[Chunk], lease_key: str, policy_key: str, ttl_s: int, maxlen: int) -> PutReply:
        """Send chunks in one round trip (three on a data shard: module docstring): a pipeline
        holding, per chunk, the blob's SET at its staged key and the chunk script (:data:`_SEND_CHUNK`:
        lease-checked, idempotent by ``data_id``). No MULTI/EXEC is needed: only this call writes
        the staged key, and the script decides everything else atomically; a staged blob whose
        script never ran (a lost connection) is written again by the retry, or expires after ``ttl_s`` seconds.

        Args:
            lease_key: the sending task's lease; policy_key: the policy hash read back.
            maxlen: the stream's approximate MAXLEN.

        Raises:
            LeaseRevoked: the lease is gone (names it); no chunk sent after it was revoked was written
                (on a data shard: none sent after the lease check saw it gone).
            DataShardError: the data shard failed (names it).
            ValueError: no chunks, or a ``data_id`` is not a valid key component (nothing is sent).
        """
        self._buffer()
        if not chunks:
            raise ValueError(f"step-data put to {self.meta_key}: no chunks")
        if self.sharded:
            return self._put_on_shard(chunks, lease_key, policy_key, ttl_s, maxlen)
        slots = [SendKeys(lease_key, keys.data(self.ns, c.data_id, self.tag), self.meta_key, keys.envstep(self.ns),
                          self._stats_key, policy_key, keys.stop(self.ns), keys.data_staged(self.ns, c.data_id, self.tag),
                          keys.collect_setting(self.ns)) for c in chunks]
        replies = _staged_calls(self.conn, "send_chunk", _SEND_CHUNK, ttl_s, [
            (k.staged, c.payload, k, [int(maxlen), int(c.env_steps)], c.fields) for c, k in zip(chunks, slots)])
        errors = []
        for k, reply in zip(slots, replies):
            if reply[0] == 0:
                raise LeaseRevoked(f"lease {k.lease} was revoked; this task was replaced")
            if reply[5]:
                errors.append(f"{k.policy}: {_text(reply[5])}")
        return _put_reply(replies[-1], errors[-1] if errors else "")

    def _put_on_shard(self, chunks: Sequence[Chunk], lease_key: str, policy_key: str, ttl_s: int,
                      maxlen: int) -> PutReply:
        if not self.control.exists(lease_key):
            raise LeaseRevoked(f"lease {lease_key} was revoked; this task was replaced")
        slots = [WriteKeys(keys.data(self.ns, c.data_id, self.tag), self.meta_key, self._stats_key,
                           keys.data_staged(self.ns, c.data_id, self.tag)) for c in chunks]
        with self.named():
            new = _staged_calls(self.conn, "write_chunk", _WRITE_CHUNK, ttl_s, [
                (k.staged, c.payload, k, [int(maxlen), int(c.env_steps), len(c.payload)], c.fields)
                for c, k in zip(chunks, slots)])
        env_steps = sum(int(c.env_steps) for c, n in zip(chunks, new) if n == 1)
        count = CountKeys(keys.envstep(self.ns), policy_key, keys.stop(self.ns), keys.collect_setting(self.ns))
        reply = cached_script(self.control, "count_sent", _COUNT_SENT)(keys=list(count), args=[env_steps])
        return _put_reply(reply, f"{policy_key}: {_text(reply[5])}" if reply[5] else "")

    # -- learner --------------------------------------------------------------------------
    def ensure_group(self, group: str = keys.LEARNER_GROUP) -> None:
        """Create consumer group ``group`` on the buffer's stream (and the stream) unless it exists."""
        self._buffer()
        streams.ensure_group(self.conn, self.meta_key, group)

    def read(self, consumer: str, count: int, block_ms: int,
             group: str = keys.LEARNER_GROUP) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """New entries of the buffer's stream for ``consumer`` (XREADGROUP ``>``, blocking at most
        ``block_ms``); ``[(entry_id, raw fields)]``, empty when none came."""
        self._buffer()
        return streams.read_group(self.conn, self.meta_key, group, consumer, count, block_ms)

    def read_own_pending(self, consumer: str, count: int,
                         group: str = keys.LEARNER_GROUP) -> list[tuple[bytes, dict[bytes, bytes]]]:
        """Entries delivered to ``consumer`` and not acked yet (XREADGROUP ``0``); an entry trimmed
        from the stream meanwhile comes with empty fields."""
        self._buffer()
        reply = self.conn.xreadgroup(group, consumer, {self.meta_key: "0"}, count=count)
        return [e for _, got in reply or [] for e in got]

    def claim(self, consumer: str, count: int, group: str = keys.LEARNER_GROUP,
              min_idle_ms: int = 0) -> Iterator[tuple[list, list, int]]:
        """Take over every entry pending for another consumer (XAUTOCLAIM) for at least
        ``min_idle_ms``, ``count`` at a time: yields ``(claimed entries, ids trimmed away
        (Redis >= 7), nil entries (Redis 6.2))`` (see :func:`common.streams.claim_pending`)."""
        self._buffer()
        return streams.claim_pending(self.conn, self.meta_key, group, consumer, count, min_idle_ms)

    def pending_ids(self, consumer: str, count: int, group: str = keys.LEARNER_GROUP) -> list[bytes]:
        """Ids of at most ``count`` entries pending for ``consumer``, oldest first."""
        self._buffer()
        pending = self.conn.xpending_range(self.meta_key, group, min="-", max="+", count=count,
                                           consumername=consumer)
        return [p["message_id"] for p in pending]

    def blobs(self, data_keys: Sequence[str]) -> list[Optional[bytes]]:
        """The blobs at ``data_keys`` (:meth:`data_key`) in one round trip: None where expired,
        ``b""`` where consumed already (a tombstone)."""
        return blobstore.get_many(self.conn, list(data_keys))

    def ack(self, lease_key: str, entries: Sequence[AckEntry], group: str = keys.LEARNER_GROUP) -> list[int]:
        """Ack entries of the buffer's stream atomically with their accounting (:data:`_ACK_CHUNKS`);
        a consumed chunk's blob becomes an empty tombstone that keeps its TTL.

        Returns:
            per entry 1 (its first ack, counted under its status) or 0 (counted as ``duplicate``).

        Raises:
            LeaseRevoked: ``lease_key`` is gone (names it); nothing was acked or counted.
            DataShardError: the data shard failed (names it).
        """
        self._buffer()
        args: list[Any] = [group]
        for e in entries:
            args += [e.entry_id, e.data_key, int(e.env_steps), e.status]
        if self.sharded:
            if not self.control.exists(lease_key):
                raise LeaseRevoked(f"lease {lease_key} was revoked; this learner was replaced")
            with self.named():
                reply = cached_script(self.conn, "ack_on_shard", _ACK_ON_SHARD)(
                    keys=list(ShardAckKeys(self.meta_key, self._stats_key)), args=args)
            return [int(x) for x in reply]
        slots = AckKeys(lease_key, self.meta_key, self._stats_key)
        reply = cached_script(self.conn, "ack_chunks", _ACK_CHUNKS)(keys=list(slots), args=args)
        if reply and reply[0] == -1:
            raise LeaseRevoked(f"lease {lease_key} was revoked; this learner was replaced")
        return [int(x) for x in reply]

    # -- accounting -----------------------------------------------------------------------
    def stats(self) -> dict[str, int]:
        """The buffer's counters: produced, produced_env_steps, resent, consumed, env_steps,
        expired, corrupt, malformed, duplicate, trimmed (absent ones are 0 and left out)."""
        self._buffer()
        return {k.decode(): int(v) for k, v in self.conn.hgetall(self._stats_key).items()}

    def consumed_env_steps(self) -> int:
        """Env steps of every chunk consumed from the buffer by any learner."""
        self._buffer()
        return int(self.conn.hget(self._stats_key, "env_steps") or 0)

    def set_consumed_env_steps(self, env_steps: int) -> None:
        """Start the buffer's consumed env steps at ``env_steps`` (a run resumed from its folder)."""
        self._buffer()
        self.conn.hset(self._stats_key, "env_steps", int(env_steps))

    def accounting(self) -> dict[str, int]:
        """The buffer's exactly-once balance: produced, consumed, expired, corrupt, malformed,
        duplicate, trimmed (from the stats hash) and ``unconsumed`` (entries of its stream not yet
        delivered to the learner group, plus those delivered and not acked). With nothing lost,
        produced = consumed + expired + corrupt + malformed + trimmed + unconsumed."""
        self._buffer()
        raw = self.stats()
        out = {k: raw.get(k, 0) for k in ("produced", "consumed", "expired", "corrupt", "malformed", "duplicate",
                                          "trimmed")}
        groups = [g for g in self.conn.xinfo_groups(self.meta_key) if g["name"] == keys.LEARNER_GROUP.encode()] \
            if self.conn.exists(self.meta_key) else []
        if not groups:
            out["unconsumed"] = int(self.conn.xlen(self.meta_key))
            return out
        last = groups[0]["last-delivered-id"].decode()
        undelivered = len(self.conn.xrange(self.meta_key, min=f"({last}", max="+"))
        out["unconsumed"] = undelivered + int(groups[0]["pending"])
        return out

    def run_totals(self) -> dict[str, int]:
        """Summed over every buffer of the run: ``chunks`` produced and their ``bytes`` (blob bytes,
        counted on data shards only: 0 on the control Redis)."""
        chunks = size = 0
        for k in self.conn.scan_iter(match=keys.buffers_pattern(self.ns, self.tag), count=1000):
            if k.endswith(b":stats"):
                produced, nbytes = self.conn.hmget(k, "produced", "produced_bytes")
                chunks, size = chunks + int(produced or 0), size + int(nbytes or 0)
        return {"chunks": chunks, "bytes": size}

    # -- dropping -------------------------------------------------------------------------
    def _delete_matching(self, pattern: str) -> int:
        deleted, batch = 0, []
        for k in self.conn.scan_iter(match=pattern, count=1000):
            batch.append(k)
            if len(batch) >= 1000:
                deleted += int(self.conn.delete(*batch))
                batch.clear()
        if batch:
            deleted += int(self.conn.delete(*batch))
        return deleted

    def drop_blobs(self) -> int:
        """Delete every chunk blob of the run (staged ones too); returns how many keys went."""
        return self._delete_matching(keys.data_pattern(self.ns, self.tag))

    def drop_stream(self) -> int:
        """Delete the buffer's metadata stream (its unread chunks can no longer be found); returns 0 or 1."""
        self._buffer()
        return int(self.conn.delete(self.meta_key))

    def drop_run(self) -> int:
        """Delete every step-data key of the run: blobs, and every buffer's stream and stats;
        returns how many keys went."""
        return self.drop_blobs() + self._delete_matching(keys.buffers_pattern(self.ns, self.tag))
