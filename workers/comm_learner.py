"""The learner's buffer reader: the thread that takes chunks from the buffer stream into its data source.

The reader consumes ``rqrl:{exp}:buffer:{buffer_id}:meta`` through consumer group ``learner``
(XREADGROUP BLOCK; at start it first claims, with XAUTOCLAIM, entries a dead learner read but
never acked), fetches the blobs of each batch with one MGET, then acks them in one Lua script
that also empties the blobs (an empty tombstone keeps each blob's TTL) and counts each entry
once in ``rqrl:{exp}:buffer:{id}:stats``. Only entries whose XACK succeeded there and whose
chunk was not consumed before — a first delivery of a new ``data_id`` — are inserted in the
replay buffer, so neither a re-delivered entry nor a second entry for one chunk (a collector's
retried send) can be inserted or counted twice. A blob that expired,
fails to decode or has the wrong layout is logged with its key, counted, and acked.

After a Sentinel failover (:func:`common.connection.primary_changes`) the new primary may lack
the reader's last acks (asynchronous replication): those entries come back, delivered again or
still pending for this consumer. The reader remembers the ``data_id`` of the chunks it inserted
(the last :data:`_SEEN` of them), acks and counts such an entry on the new primary without
inserting it again (``redelivered``), re-reads its own pending entries, and calls ``on_failover``
so the learner puts back its last policy and checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable, Optional, Sequence

import numpy as np
import redis

from common import chunk_codec, serialization, streams
from common.connection import primary_changes
from common.messages import ChunkMeta, MessageError
from common.step_data import AckEntry, StepDataStore

_LAG_WINDOW = 1000  # chunks whose policy lag the percentiles cover
# data_ids of inserted chunks remembered for a failover's re-deliveries: far more than the
# chunks a replica can lag behind (~2 MB).
_SEEN = 16384
# Entries another consumer holds unacked this long are a lost learner's (a live reader acks each
# batch within a second): one frozen past its replacement's start read them after the start's
# claim, and its revoked lease refused their ack. The lead claims them again this often (seconds).
_RECLAIM_IDLE_S = 10.0


class BufferReader(threading.Thread):
    """Background thread filling ``buffer`` (a replay buffer or a rollout queue) from the buffer stream.

    Counters (read from the trainer thread): ``env_steps`` (env steps of chunks consumed by this
    reader), ``chunks``, ``expired``, ``corrupt``, ``malformed``, ``duplicates``, ``trimmed``; ``env_steps_base``
    holds the buffer's consumed env steps before this reader started (from the stats hash).
    :meth:`policy_lag` gives percentiles of the policy lag: the learner's ``train_iter`` when a
    chunk is ingested minus the policy version that produced it, in train iterations.
    ``claim_orphans`` False skips the XAUTOCLAIM at start: ranks other than 0 of a learner group
    (workers/ddp.py), whose siblings' unacked entries are no orphans. ``on_failover`` runs on
    this thread once a Sentinel failover was seen (module docstring); ``redelivered`` counts the
    entries it acked again there without inserting them. ``store``: the buffer's store on one data
    shard (:class:`ShardReaders` runs one reader per shard); default: on ``conn``.
    """

    def __init__(self, conn: redis.Redis, exp: str, buffer_id: str, consumer: str, buffer: Any,
                 logger: logging.Logger, on_data: Callable[[], None], lease_key: str,
                 train_iter: Callable[[], int] = lambda: 0, batch: int = 64, block_ms: int = 500,
                 claim_orphans: bool = True, on_failover: Callable[[], None] = lambda: None,
                 store: Optional[StepDataStore] = None) -> None:
        self._store = store or StepDataStore(conn, exp, buffer_id)
        super().__init__(name=f"buffer-reader-{buffer_id}{'-' + self._store.label if store else ''}", daemon=True)
        self._conn = self._store.conn  # the step data's server: its failovers are this reader's to follow
        self._stream = self._store.where  # named in log lines and errors
        self._lease = lease_key
        self._consumer = consumer
        self._buffer = buffer
        self._logger = logger
        self._on_data = on_data
        self._batch = batch
        self._block_ms = block_ms
        self._halt = threading.Event()
        # Held from a batch's ack to its counting, so that once stop() returned the counters agree
        # with what this reader acked in the stats hash (the learner's closing report reads them).
        self._counting = threading.Lock()
        self.env_steps = 0
        self.chunks = 0
        self.expired = 0
        self.corrupt = 0
        self.malformed = 0
        self.duplicates = 0
        self.trimmed = 0
        self.redelivered = 0
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._failovers = len(primary_changes(conn))
        self._on_failover = on_failover
        self._train_iter = train_iter
        self._claim = claim_orphans
        self._reclaim_at = time.monotonic() + _RECLAIM_IDLE_S
        self._lags: deque[int] = deque(maxlen=_LAG_WINDOW)
        self.error: BaseException | None = None
        self._store.ensure_group()
        self.env_steps_base = self._store.consumed_env_steps()

    def stop(self) -> None:
        """Ack and count no further batch; a batch being acked is counted before this returns.
        Entries read after this stay pending for this consumer (the next learner claims them)."""
        self._halt.set()
        with self._counting:
            pass

    def consumed_env_steps(self) -> int:
        """Env steps of every chunk consumed from this buffer by any learner (the stats hash)."""
        return self._store.consumed_env_steps()

    def policy_lag(self) -> dict[str, float]:
        """``policy_lag_mean`` / ``_p50`` / ``_p95`` / ``_max`` over the last chunks ingested (train iterations)."""
        return _lag_percentiles(self.recent_lags())

    def recent_lags(self) -> list[int]:
        """The policy lags of the last chunks ingested (at most :data:`_LAG_WINDOW`), oldest first."""
        return list(self._lags)

    def run(self) -> None:
        try:
            if self._claim:
                self._claim_orphans()
        except BaseException as e:
            self.error = e
            self._on_data()
            return
        while not self._halt.is_set():
            try:
                if len(primary_changes(self._conn)) != self._failovers:
                    self._after_failover()
                if self._claim and time.monotonic() >= self._reclaim_at:
                    self._reclaim_at = time.monotonic() + _RECLAIM_IDLE_S
                    self._claim_orphans(int(_RECLAIM_IDLE_S * 1000))
                entries = self._store.read(self._consumer, self._batch, self._block_ms)
                if entries:
                    self._consume(entries)
            except redis.ResponseError as e:
                if "NOGROUP" in str(e):
                    self.error = RuntimeError(f"{self._stream} lost its consumer group: was Redis restarted "
                                              "without persistence?")
                else:
                    self.error = e
                self._on_data()
                return
            except redis.RedisError as e:
                # The client already retried with backoff; keep going unless told to stop.
                self._logger.warning("buffer reader: Redis error on %s: %s", self._stream, e)
                self._halt.wait(1.0)
            except BaseException as e:  # surfaced to the trainer, which fails the task
                self.error = e
                self._on_data()
                return

    def _claim_orphans(self, min_idle_ms: int = 0) -> None:
        """Take over entries delivered to a dead learner and never acked (XAUTOCLAIM), those
        delivered at least ``min_idle_ms`` ago (0 at start: every one; :data:`_RECLAIM_IDLE_S` later).

        An orphan whose stream entry was trimmed away meanwhile (the stream's MAXLEN) is acked
        and counted as ``trimmed``, the same on every Redis: 7.x drops it from the pending list
        itself and names it in XAUTOCLAIM's third reply element; 6.2 keeps it pending and
        answers nil for it, without its id, so the ids come from this consumer's pending list.
        """
        gone: list[bytes] = []
        nil = 0
        for claimed, gone_now, nil_now in self._store.claim(self._consumer, self._batch, min_idle_ms=min_idle_ms):
            gone += gone_now  # Redis >= 7
            nil += nil_now  # Redis 6.2
            if claimed:
                self._logger.info("claimed %d unacked entries of %s from a previous learner%s", len(claimed),
                                  self._stream, f" (unacked for over {min_idle_ms / 1000:g} s: it was frozen past "
                                  "this learner's start)" if min_idle_ms else "")
                self._consume(claimed)
        if nil:  # what is still pending here after _consume acked the rest is exactly the trimmed entries
            gone += self._store.pending_ids(self._consumer, nil)
        if gone:
            self._logger.warning("%d unacked entries of %s were trimmed from the stream before a learner read "
                                 "them; their chunks are lost", len(gone), self._stream)
            self._store.ack(self._lease, [AckEntry(entry_id, "", 0, "trimmed") for entry_id in gone])
            self.trimmed += len(gone)

    def _after_failover(self) -> None:
        """The primary changed (module docstring): ack what the new primary still holds pending for
        this consumer, then let the learner put back its policy and checkpoint."""
        self._failovers = len(primary_changes(self._conn))
        self._logger.warning("Redis failover seen (primary now %s): re-reading this learner's pending entries of %s",
                             primary_changes(self._conn)[-1]["to"], self._stream)
        self._store.ensure_group()
        before = self.redelivered
        for _ in range(10_000):  # each round acks what it read, so the pending list shrinks
            entries = self._store.read_own_pending(self._consumer, self._batch)
            if not entries:
                break
            gone = [eid for eid, fields in entries if not fields]  # trimmed from the stream meanwhile
            if gone:
                self._store.ack(self._lease, [AckEntry(eid, "", 0, "trimmed") for eid in gone])
                self.trimmed += len(gone)
            self._consume([e for e in entries if e[1]])
        self._logger.warning("after the failover: %d entries acked again without a second insert",
                             self.redelivered - before)
        self._on_failover()

    def _consume(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        plan: list[AckEntry] = []
        chunks: dict[bytes, Any] = {}
        metas: dict[bytes, ChunkMeta] = {}
        for entry_id, raw in entries:
            try:
                where = f"{self._stream} entry {entry_id.decode()}"
                metas[entry_id] = ChunkMeta.from_dict(streams.decode_fields(raw), where)
            except (streams.MalformedEntry, MessageError) as e:
                self._logger.error("skipping malformed entry: %s", e)
                plan.append(AckEntry(entry_id, "", 0, "malformed"))
        for entry_id in list(metas):
            try:
                self._store.data_key(metas[entry_id].data_id)
            except ValueError as e:
                self._logger.error("skipping malformed entry %s of %s: %s", entry_id.decode(), self._stream, e)
                plan.append(AckEntry(entry_id, "", 0, "malformed"))
                del metas[entry_id]
        ids = list(metas)
        data_keys = [self._store.data_key(metas[i].data_id) for i in ids]
        again: set[bytes] = set()
        for entry_id, key, blob in zip(ids, data_keys, self._store.blobs(data_keys)):
            env_steps = metas[entry_id].env_steps
            if metas[entry_id].data_id in self._seen and blob != b"":
                # Inserted here before a failover lost its ack (a tombstone would be there otherwise):
                # count it on the new primary, do not insert it again.
                again.add(entry_id)
                plan.append(AckEntry(entry_id, key, env_steps, "consumed"))
                continue
            if blob is None:
                self._logger.warning("step data %s expired before it was consumed", key)
                plan.append(AckEntry(entry_id, key, env_steps, "expired"))
                continue
            if blob == b"":  # the tombstone of a chunk consumed under another entry
                plan.append(AckEntry(entry_id, key, env_steps, "duplicate"))
                continue
            try:
                # No copy: the buffer copies the rows into its own storage (replay) or stacks them (on-policy).
                chunk = serialization.loads(chunk_codec.decode(blob, key), what=key, copy=False)
                self._buffer.check(chunk, key)
            except ValueError as e:
                self._logger.error("skipping corrupt step data: %s", e)
                plan.append(AckEntry(entry_id, key, env_steps, "corrupt"))
                continue
            chunks[entry_id] = chunk
            plan.append(AckEntry(entry_id, key, env_steps, "consumed"))
        if not plan:
            return
        with self._counting:
            if self._halt.is_set():
                return
            first = self._store.ack(self._lease, plan)
            inserted = self._count(plan, first, metas, chunks, again)
        if inserted:
            self._on_data()

    def _count(self, plan: list[AckEntry], first: list[int], metas: dict[bytes, ChunkMeta],
               chunks: dict[bytes, Any], again: set[bytes]) -> bool:
        """Insert the chunks whose ack was a first consumption and count every entry of ``plan``
        by status; True when a chunk was inserted."""
        inserted = False
        for (entry_id, _, env_steps, status), new in zip(plan, first):
            if not new:
                self.duplicates += 1
                continue
            if entry_id in again:
                self.redelivered += 1
                continue
            if status == "consumed":
                self._seen[metas[entry_id].data_id] = None
                if len(self._seen) > _SEEN:
                    self._seen.popitem(last=False)
                version = metas[entry_id].policy_version
                self._lags.append(self._train_iter() - version)
                self._buffer.extend(chunks[entry_id], version)
                self.env_steps += env_steps
                self.chunks += 1
                inserted = True
            else:
                setattr(self, status, getattr(self, status) + 1)
        return inserted



class ShardReaders:
    """One :class:`BufferReader` per data shard of a buffer, filling one data source: the reader
    the learner sees (the counters :class:`BufferReader` has, summed; the first reader's error).
    A thread per shard, so that a shard without new entries never holds up another's (each
    blocks in its own XREADGROUP).

    Args:
        stores: the buffer's store on each shard (common/data_shards.py ``task_stores``).
        kwargs: :class:`BufferReader`'s other arguments, the same for every shard; only the lead
            (``claim_orphans``) claims orphans, on every shard.
    """

    _SUMMED = ("env_steps", "chunks", "expired", "corrupt", "malformed", "duplicates", "trimmed", "redelivered",
               "env_steps_base")

    def __init__(self, conn: redis.Redis, exp: str, buffer_id: str, consumer: str, buffer: Any,
                 logger: logging.Logger, on_data: Callable[[], None], lease_key: str,
                 stores: Sequence[StepDataStore], **kwargs: Any) -> None:
        self.readers = [BufferReader(conn, exp, buffer_id, consumer, buffer, logger, on_data, lease_key,
                                     store=store, **kwargs) for store in stores]

    def __getattr__(self, name: str) -> Any:
        if name in self._SUMMED:
            return sum(getattr(r, name) for r in self.readers)
        raise AttributeError(name)

    @property
    def error(self) -> Optional[BaseException]:
        """The first shard reader's error (None while none failed)."""
        return next((r.error for r in self.readers if r.error is not None), None)

    def start(self) -> None:
        for r in self.readers:
            r.start()

    def stop(self) -> None:
        """As :meth:`BufferReader.stop`, for every shard."""
        for r in self.readers:
            r.stop()

    def join(self, timeout: Optional[float] = None) -> None:
        for r in self.readers:
            r.join(timeout)

    def consumed_env_steps(self) -> int:
        """Env steps consumed from the buffer on every shard by any learner."""
        return sum(r.consumed_env_steps() for r in self.readers)

    def policy_lag(self) -> dict[str, float]:
        """As :meth:`BufferReader.policy_lag`, over the chunks of every shard."""
        return _lag_percentiles([lag for r in self.readers for lag in r.recent_lags()])


def _lag_percentiles(lags: list[int]) -> dict[str, float]:
    if not lags:
        return {}
    p50, p95 = np.percentile(lags, (50, 95))
    return {"policy_lag_mean": round(sum(lags) / len(lags), 2), "policy_lag_p50": float(p50),
            "policy_lag_p95": float(p95), "policy_lag_max": float(max(lags))}
