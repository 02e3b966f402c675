"""A learner's checkpoints: ``torch.save`` bytes under ``rqrl:{ns}:ckpt:{name}`` in Redis (parallel
mode) or ``{name}.pth`` files (a learner built without Redis), and the store that writes them.

A checkpoint is a versioned blob (common/blobstore.py, the layout of a policy) whose version is
the learner's ``train_iter``; a write goes through the task's lease, so a learner whose task was
taken over writes nothing. The learner's own resumable checkpoint is named by its task's
``ckpt_name`` ("latest" for the solo commander's one player); ``final`` and ``final_model`` are
written once at the end of a run.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from pathlib import Path
from typing import Any, Optional

import redis
import torch

from common import blobstore, keys
from common.connection import is_sentinel, write_replicated
from common.finite import check_arrays


def checkpoint_bytes(state: dict[str, Any], what: str) -> bytes:
    """``torch.save`` bytes of a learner checkpoint.

    Raises:
        common.finite.NonFiniteError: the state holds NaN or inf (``what`` names it).
    """
    check_arrays(state, what)
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def put_checkpoint(conn: redis.Redis, ns: str, name: str, payload: bytes, train_iter: int,
                   lease_key: str | None = None) -> int:
    """Store checkpoint bytes under ``rqrl:{ns}:ckpt:{name}`` so that they survive a failover
    (:func:`common.connection.write_replicated`: through Sentinel, written again on a new primary
    until one replica acknowledged them, or ``WAIT`` timed out).

    Returns:
        Replicas that acknowledged the write (-1: none to wait for; 0: none in time).

    Raises:
        common.scripts.LeaseRevoked: ``lease_key`` is given and gone.
    """
    meta = {"train_iter": train_iter, "ts": round(time.time(), 3), "format": "torch"}
    # A replica takes a checkpoint at well over 20 MB/s: past that something is wrong with it.
    return write_replicated(conn, lambda c: blobstore.put_versioned(c, keys.ckpt(ns, name), payload, train_iter,
                                                                     meta=meta, lease_key=lease_key),
                            timeout_s=max(1.0, len(payload) / 20e6))[1]


def save_checkpoint(conn: redis.Redis, ns: str, name: str, state: dict[str, Any], train_iter: int,
                    lease_key: str | None = None) -> int:
    """Store a learner checkpoint (torch.save bytes) under ``rqrl:{ns}:ckpt:{name}``
    (:func:`put_checkpoint`); returns its bytes.

    Raises:
        common.scripts.LeaseRevoked: ``lease_key`` is given and gone.
        common.finite.NonFiniteError: the state holds NaN or inf (nothing is stored).
    """
    payload = checkpoint_bytes(state, f"checkpoint {keys.ckpt(ns, name)} at train iter {train_iter}")
    put_checkpoint(conn, ns, name, payload, train_iter, lease_key)
    return len(payload)


def load_checkpoint(conn: redis.Redis, ns: str, name: str,
                    map_location: str | torch.device = "cpu") -> dict[str, Any] | None:
    """Load a checkpoint saved by :func:`save_checkpoint` with ``torch.load(weights_only=True)``.

    Returns:
        The state dict, or None when no checkpoint ``name`` exists.

    Raises:
        blobstore.BlobError: the checkpoint is incomplete or cannot be loaded (names the key).
    """
    key = keys.ckpt(ns, name)
    got = blobstore.get_versioned(conn, key)
    if got is None:
        return None
    try:
        return torch.load(io.BytesIO(got[1]), map_location=map_location, weights_only=True)
    except Exception as e:
        raise blobstore.BlobError(f"{key}: cannot load checkpoint ({type(e).__name__}: {e})") from None


class CheckpointStore:
    """Where a learner's checkpoints go: Redis (parallel mode) or files (when no Redis is given).

    ``writable`` False: loads only (ranks other than 0 of a learner group, workers/ddp.py, whose
    state is rank 0's; rank 0 alone saves). Through Sentinel the bytes of the last save of each
    name are kept, so :meth:`resave` can put them back on a new primary after a failover (one
    copy of each checkpoint in memory).
    """

    def __init__(self, conn: Optional[redis.Redis], ns: str, ckpt_dir: Path, lease_key: Optional[str] = None,
                 writable: bool = True, logger: Optional[logging.Logger] = None) -> None:
        self._conn, self._ns, self._dir, self._lease = conn, ns, ckpt_dir, lease_key
        self._writable = writable
        self.logger = logger
        self._keep = conn is not None and is_sentinel(conn)
        self._last: dict[str, tuple[bytes, int]] = {}  # name -> (bytes, train_iter), kept through Sentinel
        self._lock = threading.Lock()  # a save on the trainer thread vs a resave after a failover

    def save(self, name: str, state: dict[str, Any], train_iter: int) -> None:
        """Write checkpoint ``name`` (nothing when not ``writable``).

        Raises:
            common.scripts.LeaseRevoked: the store's lease is gone.
            common.finite.NonFiniteError: the state holds NaN or inf (nothing is stored).
        """
        if not self._writable:
            return
        if self._conn is not None:
            payload = checkpoint_bytes(state, f"checkpoint {keys.ckpt(self._ns, name)} at train iter {train_iter}")
            with self._lock:
                self._put(name, payload, train_iter)
                if self._keep:
                    self._last[name] = (payload, train_iter)
        else:
            self._dir.mkdir(parents=True, exist_ok=True)
            torch.save(state, self._dir / f"{name}.pth")

    def _put(self, name: str, payload: bytes, train_iter: int) -> None:
        acked = put_checkpoint(self._conn, self._ns, name, payload, train_iter, lease_key=self._lease)
        if acked == 0 and self.logger is not None:
            self.logger.warning("checkpoint %s (train iter %d) is not on a replica yet (WAIT timed out)",
                                keys.ckpt(self._ns, name), train_iter)

    def resave(self) -> None:
        """Write the last saved checkpoints again (after a failover: the new primary may lack them)."""
        with self._lock:
            for name, (payload, train_iter) in self._last.items():
                self._put(name, payload, train_iter)
                if self.logger is not None:
                    self.logger.warning("checkpoint %s (train iter %d) written again after the failover",
                                        keys.ckpt(self._ns, name), train_iter)

    def load(self, name: str, device: torch.device) -> Optional[dict[str, Any]]:
        """Checkpoint ``name``'s state dict on ``device``, or None when there is none."""
        if self._conn is not None:
            return load_checkpoint(self._conn, self._ns, name, map_location=device)
        path = self._dir / f"{name}.pth"
        return torch.load(path, map_location=device, weights_only=True) if path.exists() else None
