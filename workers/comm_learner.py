"""Learner-side I/O: the buffer-stream reader thread and policy / checkpoint publication.

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

import io
import logging
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable

import numpy as np
import redis
import torch

from common.finite import check_arrays
from common import blobstore, chunk_codec, keys, serialization, streams
from common.connection import primary_changes, write_replicated
from common.scripts import ack_chunks

_META_SPEC = {"data_id": str, "n_samples": int, "env_steps": int, "policy_version": int}
_LAG_WINDOW = 1000  # chunks whose policy lag the percentiles cover
# data_ids of inserted chunks remembered for a failover's re-deliveries: far more than the
# chunks a replica can lag behind (~2 MB).
_SEEN = 16384


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
    entries it acked again there without inserting them.
    """

    def __init__(self, conn: redis.Redis, exp: str, buffer_id: str, consumer: str, buffer: Any,
                 logger: logging.Logger, on_data: Callable[[], None], lease_key: str,
                 train_iter: Callable[[], int] = lambda: 0, batch: int = 64, block_ms: int = 500,
                 claim_orphans: bool = True, on_failover: Callable[[], None] = lambda: None) -> None:
        super().__init__(name=f"buffer-reader-{buffer_id}", daemon=True)
        self._conn = conn
        self._exp = exp
        self._stream = keys.buffer_meta(exp, buffer_id)
        self._stats_key = keys.buffer_stats(exp, buffer_id)
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
        self._lags: deque[int] = deque(maxlen=_LAG_WINDOW)
        self.error: BaseException | None = None
        streams.ensure_group(conn, self._stream, keys.LEARNER_GROUP)
        self.env_steps_base = int(conn.hget(self._stats_key, "env_steps") or 0)

    def stop(self) -> None:
        """Ack and count no further batch; a batch being acked is counted before this returns.
        Entries read after this stay pending for this consumer (the next learner claims them)."""
        self._halt.set()
        with self._counting:
            pass

    def consumed_env_steps(self) -> int:
        """Env steps of every chunk consumed from this buffer by any learner (the stats hash)."""
        return int(self._conn.hget(self._stats_key, "env_steps") or 0)

    def policy_lag(self) -> dict[str, float]:
        """``policy_lag_p50`` / ``_p95`` / ``_max`` over the last chunks ingested (train iterations)."""
        lags = list(self._lags)
        if not lags:
            return {}
        return {"policy_lag_p50": float(np.percentile(lags, 50)), "policy_lag_p95": float(np.percentile(lags, 95)),
                "policy_lag_max": float(max(lags))}

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
                entries = streams.read_group(self._conn, self._stream, keys.LEARNER_GROUP, self._consumer,
                                             self._batch, self._block_ms)
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

    def _claim_orphans(self) -> None:
        """Take over entries delivered to a dead learner and never acked (XAUTOCLAIM).

        An orphan whose stream entry was trimmed away meanwhile (the stream's MAXLEN) is acked
        and counted as ``trimmed``, the same on every Redis: 7.x drops it from the pending list
        itself and names it in XAUTOCLAIM's third reply element; 6.2 keeps it pending and
        answers nil for it, without its id, so the ids come from this consumer's pending list.
        """
        gone: list[bytes] = []
        nil = 0
        for claimed, gone_now, nil_now in streams.claim_pending(self._conn, self._stream, keys.LEARNER_GROUP,
                                                                self._consumer, self._batch):
            gone += gone_now  # Redis >= 7
            nil += nil_now  # Redis 6.2
            if claimed:
                self._logger.info("claimed %d unacked entries of %s from a previous learner", len(claimed), self._stream)
                self._consume(claimed)
        if nil:  # what is still pending here after _consume acked the rest is exactly the trimmed entries
            pending = self._conn.xpending_range(self._stream, keys.LEARNER_GROUP, min="-", max="+", count=nil,
                                                consumername=self._consumer)
            gone += [p["message_id"] for p in pending]
        if gone:
            self._logger.warning("%d unacked entries of %s were trimmed from the stream before a learner read "
                                 "them; their chunks are lost", len(gone), self._stream)
            ack_chunks(self._conn, self._lease, self._stream, self._stats_key, keys.LEARNER_GROUP,
                       [(entry_id, "", 0, "trimmed") for entry_id in gone])
            self.trimmed += len(gone)

    def _after_failover(self) -> None:
        """The primary changed (module docstring): ack what the new primary still holds pending for
        this consumer, then let the learner put back its policy and checkpoint."""
        self._failovers = len(primary_changes(self._conn))
        self._logger.warning("Redis failover seen (primary now %s): re-reading this learner's pending entries of %s",
                             primary_changes(self._conn)[-1]["to"], self._stream)
        streams.ensure_group(self._conn, self._stream, keys.LEARNER_GROUP)
        before = self.redelivered
        for _ in range(10_000):  # each round acks what it read, so the pending list shrinks
            reply = self._conn.xreadgroup(keys.LEARNER_GROUP, self._consumer, {self._stream: "0"}, count=self._batch)
            entries = [e for _, got in reply or [] for e in got]
            if not entries:
                break
            gone = [eid for eid, fields in entries if not fields]  # trimmed from the stream meanwhile
            if gone:
                ack_chunks(self._conn, self._lease, self._stream, self._stats_key, keys.LEARNER_GROUP,
                           [(eid, "", 0, "trimmed") for eid in gone])
                self.trimmed += len(gone)
            self._consume([e for e in entries if e[1]])
        self._logger.warning("after the failover: %d entries acked again without a second insert",
                             self.redelivered - before)
        self._on_failover()

    def _consume(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        plan: list[tuple[bytes, str, int, str]] = []
        chunks: dict[bytes, Any] = {}
        metas: dict[bytes, dict[str, Any]] = {}
        for entry_id, raw in entries:
            try:
                meta = streams.decode_fields(raw)
                streams.require(meta, _META_SPEC, f"{self._stream} entry {entry_id.decode()}")
                metas[entry_id] = meta
            except streams.MalformedEntry as e:
                self._logger.error("skipping malformed entry: %s", e)
                plan.append((entry_id, "", 0, "malformed"))
        for entry_id in list(metas):
            try:
                keys.data(self._exp, metas[entry_id]["data_id"])
            except ValueError as e:
                self._logger.error("skipping malformed entry %s of %s: %s", entry_id.decode(), self._stream, e)
                plan.append((entry_id, "", 0, "malformed"))
                del metas[entry_id]
        ids = list(metas)
        data_keys = [keys.data(self._exp, metas[i]["data_id"]) for i in ids]
        again: set[bytes] = set()
        for entry_id, key, blob in zip(ids, data_keys, blobstore.get_many(self._conn, data_keys)):
            env_steps = metas[entry_id]["env_steps"]
            if metas[entry_id]["data_id"] in self._seen and blob != b"":
                # Inserted here before a failover lost its ack (a tombstone would be there otherwise):
                # count it on the new primary, do not insert it again.
                again.add(entry_id)
                plan.append((entry_id, key, env_steps, "consumed"))
                continue
            if blob is None:
                self._logger.warning("step data %s expired before it was consumed", key)
                plan.append((entry_id, key, env_steps, "expired"))
                continue
            if blob == b"":  # the tombstone of a chunk consumed under another entry
                plan.append((entry_id, key, env_steps, "duplicate"))
                continue
            try:
                # No copy: the buffer copies the rows into its own storage (replay) or stacks them (on-policy).
                chunk = serialization.loads(chunk_codec.decode(blob, key), what=key, copy=False)
                self._buffer.check(chunk, key)
            except ValueError as e:
                self._logger.error("skipping corrupt step data: %s", e)
                plan.append((entry_id, key, env_steps, "corrupt"))
                continue
            chunks[entry_id] = chunk
            plan.append((entry_id, key, env_steps, "consumed"))
        if not plan:
            return
        with self._counting:
            if self._halt.is_set():
                return
            first = ack_chunks(self._conn, self._lease, self._stream, self._stats_key, keys.LEARNER_GROUP, plan)
            inserted = self._count(plan, first, metas, chunks, again)
        if inserted:
            self._on_data()

    def _count(self, plan: list[tuple[bytes, str, int, str]], first: list[int], metas: dict[bytes, dict[str, Any]],
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
                self._seen[metas[entry_id]["data_id"]] = None
                if len(self._seen) > _SEEN:
                    self._seen.popitem(last=False)
                version = metas[entry_id]["policy_version"]
                self._lags.append(self._train_iter() - version)
                self._buffer.extend(chunks[entry_id], version)
                self.env_steps += env_steps
                self.chunks += 1
                inserted = True
            else:
                setattr(self, status, getattr(self, status) + 1)
        return inserted


def publish_policy(conn: redis.Redis, exp: str, policy_id: str, weights: dict[str, Any], train_iter: int,
                   envstep_limit: int, lease_key: str | None = None, envstep: int = 0) -> int:
    """Publish collector weights as version ``train_iter`` and announce it on the updates channel.

    Args:
        envstep_limit: env steps the collectors may have sent before they wait for the next
            publication (the collector side of the replay-ratio limiter).
        envstep: env steps the learner had consumed when it made these weights (stored with
            the version, so an eval of it reports the env steps that produced the policy).
        lease_key: the publishing task's lease; nothing is written once it is revoked.

    Returns:
        The blob size in bytes.

    Raises:
        common.scripts.LeaseRevoked: the lease is gone.
        common.finite.NonFiniteError: a weight is NaN or inf (nothing is published).
    """
    check_arrays(weights, f"policy version {train_iter} for {keys.policy(exp, policy_id)}")
    payload = serialization.dumps(weights)
    put_policy(conn, exp, policy_id, payload, train_iter, envstep_limit, lease_key, envstep)
    return len(payload)


def put_policy(conn: redis.Redis, exp: str, policy_id: str, payload: bytes, train_iter: int, envstep_limit: int,
               lease_key: str | None = None, envstep: int = 0) -> None:
    """Write policy bytes (msgpack, :func:`publish_policy`) as version ``train_iter`` and announce it."""
    blobstore.put_versioned(conn, keys.policy(exp, policy_id), payload, train_iter,
                            meta={"train_iter": train_iter, "envstep_limit": int(envstep_limit), "envstep": int(envstep),
                                  "ts": round(time.time(), 3), "format": "msgpack-ndarray"},
                            lease_key=lease_key, channel=keys.policy_updates(exp, policy_id),
                            message=f"{train_iter} {int(envstep_limit)}")


def checkpoint_bytes(state: dict[str, Any], what: str) -> bytes:
    """``torch.save`` bytes of a learner checkpoint.

    Raises:
        common.finite.NonFiniteError: the state holds NaN or inf (``what`` names it).
    """
    check_arrays(state, what)
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def put_checkpoint(conn: redis.Redis, exp: str, name: str, payload: bytes, train_iter: int,
                   lease_key: str | None = None) -> int:
    """Store checkpoint bytes under ``rqrl:{exp}:ckpt:{name}`` so that they survive a failover
    (:func:`common.connection.write_replicated`: through Sentinel, written again on a new primary
    until one replica acknowledged them, or ``WAIT`` timed out).

    Returns:
        Replicas that acknowledged the write (-1: none to wait for; 0: none in time).

    Raises:
        common.scripts.LeaseRevoked: ``lease_key`` is given and gone.
    """
    meta = {"train_iter": train_iter, "ts": round(time.time(), 3), "format": "torch"}
    # A replica takes a checkpoint at well over 20 MB/s: past that something is wrong with it.
    return write_replicated(conn, lambda c: blobstore.put_versioned(c, keys.ckpt(exp, name), payload, train_iter,
                                                                     meta=meta, lease_key=lease_key),
                            timeout_s=max(1.0, len(payload) / 20e6))[1]


def save_checkpoint(conn: redis.Redis, exp: str, name: str, state: dict[str, Any], train_iter: int,
                    lease_key: str | None = None) -> int:
    """Store a learner checkpoint (torch.save bytes) under ``rqrl:{exp}:ckpt:{name}``
    (:func:`put_checkpoint`); returns its bytes.

    Raises:
        common.scripts.LeaseRevoked: ``lease_key`` is given and gone.
        common.finite.NonFiniteError: the state holds NaN or inf (nothing is stored).
    """
    payload = checkpoint_bytes(state, f"checkpoint {keys.ckpt(exp, name)} at train iter {train_iter}")
    put_checkpoint(conn, exp, name, payload, train_iter, lease_key)
    return len(payload)


def load_checkpoint(conn: redis.Redis, exp: str, name: str, map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """Load a checkpoint saved by :func:`save_checkpoint` with ``torch.load(weights_only=True)``.

    Returns:
        The state dict, or None when no checkpoint ``name`` exists.

    Raises:
        blobstore.BlobError: the checkpoint is incomplete or cannot be loaded (names the key).
    """
    key = keys.ckpt(exp, name)
    got = blobstore.get_versioned(conn, key)
    if got is None:
        return None
    try:
        return torch.load(io.BytesIO(got[1]), map_location=map_location, weights_only=True)
    except Exception as e:
        raise blobstore.BlobError(f"{key}: cannot load checkpoint ({type(e).__name__}: {e})") from None
