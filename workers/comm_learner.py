"""Learner-side I/O: the buffer-stream reader thread and policy / checkpoint publication.

The reader consumes ``rqrl:{exp}:buffer:{buffer_id}:meta`` through consumer group ``learner``
(XREADGROUP BLOCK), fetches the blobs of each batch of entries with one MGET, inserts them in
the replay buffer and XACKs. A blob that expired, fails to decode or has the wrong layout is
logged with its key, counted and acked (it can never become valid), and the rest goes on.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from typing import Any, Callable

import redis
import torch

from common import blobstore, keys, serialization, streams
from workers.replay_buffer import ReplayBuffer

_META_SPEC = {"data_id": str, "n_samples": int, "env_steps": int}


class BufferReader(threading.Thread):
    """Background thread filling ``buffer`` from the buffer stream.

    Counters (read from the trainer thread): ``env_steps`` (env steps of consumed chunks),
    ``chunks``, ``expired``, ``corrupt``, ``malformed``.
    """

    def __init__(self, conn: redis.Redis, exp: str, buffer_id: str, consumer: str, buffer: ReplayBuffer,
                 logger: logging.Logger, on_data: Callable[[], None], batch: int = 64, block_ms: int = 500) -> None:
        super().__init__(name=f"buffer-reader-{buffer_id}", daemon=True)
        self._conn = conn
        self._exp = exp
        self._stream = keys.buffer_meta(exp, buffer_id)
        self._consumer = consumer
        self._buffer = buffer
        self._logger = logger
        self._on_data = on_data
        self._batch = batch
        self._block_ms = block_ms
        self._halt = threading.Event()
        self.env_steps = 0
        self.chunks = 0
        self.expired = 0
        self.corrupt = 0
        self.malformed = 0
        self.error: BaseException | None = None
        streams.ensure_group(conn, self._stream, keys.LEARNER_GROUP)

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                entries = streams.read_group(self._conn, self._stream, keys.LEARNER_GROUP, self._consumer,
                                             self._batch, self._block_ms)
                if entries:
                    self._consume(entries)
            except redis.RedisError as e:
                # The client already retried with backoff; keep going unless told to stop.
                self._logger.warning("buffer reader: Redis error on %s: %s", self._stream, e)
                self._halt.wait(1.0)
            except BaseException as e:  # surfaced to the trainer, which fails the task
                self.error = e
                self._on_data()
                return

    def _consume(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        metas, ids, good = [], [], []
        for entry_id, raw in entries:
            ids.append(entry_id)
            try:
                meta = streams.decode_fields(raw)
                streams.require(meta, _META_SPEC, f"{self._stream} entry {entry_id.decode()}")
            except streams.MalformedEntry as e:
                self.malformed += 1
                self._logger.error("skipping malformed entry: %s", e)
                continue
            metas.append(meta)
        blobs = blobstore.get_many(self._conn, [keys.data(self._exp, m["data_id"]) for m in metas])
        for meta, blob in zip(metas, blobs):
            key = keys.data(self._exp, meta["data_id"])
            if blob is None:
                self.expired += 1
                self._logger.warning("step data %s expired before it was consumed", key)
                continue
            try:
                chunk = serialization.loads(blob, what=key)
                n = self._buffer.check(chunk, key)
            except ValueError as e:
                self.corrupt += 1
                self._logger.error("skipping corrupt step data: %s", e)
                continue
            good.append((meta, chunk, n))
        for meta, chunk, _ in good:
            self._buffer.extend(chunk)
            self.env_steps += meta["env_steps"]
            self.chunks += 1
        # Consumed blobs are no longer needed: delete them with the ack instead of waiting for the TTL.
        pipe = self._conn.pipeline(transaction=False)
        pipe.xack(self._stream, keys.LEARNER_GROUP, *ids)
        if metas:
            pipe.delete(*[keys.data(self._exp, m["data_id"]) for m in metas])
        pipe.execute()
        if good:
            self._on_data()


def publish_policy(conn: redis.Redis, exp: str, policy_id: str, weights: dict[str, Any], train_iter: int,
                   envstep_limit: int) -> int:
    """Publish collector weights as version ``train_iter`` and announce it on the updates channel.

    Args:
        envstep_limit: env steps the collectors may have sent before they wait for the next
            publication (the collector side of the replay-ratio limiter).

    Returns:
        The blob size in bytes.
    """
    payload = serialization.dumps(weights)
    blobstore.put_versioned(conn, keys.policy(exp, policy_id), payload, train_iter,
                            meta={"train_iter": train_iter, "envstep_limit": int(envstep_limit),
                                  "ts": round(time.time(), 3), "format": "msgpack-ndarray"})
    conn.publish(keys.policy_updates(exp, policy_id), f"{train_iter} {int(envstep_limit)}")
    return len(payload)


def save_checkpoint(conn: redis.Redis, exp: str, name: str, state: dict[str, Any], train_iter: int) -> int:
    """Store a learner checkpoint (torch.save bytes) under ``rqrl:{exp}:ckpt:{name}``; returns bytes."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    blobstore.put_versioned(conn, keys.ckpt(exp, name), payload, train_iter,
                            meta={"train_iter": train_iter, "ts": round(time.time(), 3), "format": "torch"})
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
