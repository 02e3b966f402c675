"""Publishing collector weights: policy version ``train_iter`` under ``rqrl:{ns}:policy:{policy_id}``.

A version is a versioned blob (common/blobstore.py) of msgpack'd numpy weights, written through
the learner task's lease and announced on the policy's updates channel as
``"{train_iter} {envstep_limit}"``; collectors adopt it from there (workers/comm_collector.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import redis

from common import blobstore, keys, serialization
from common.finite import check_arrays


def publish_policy(conn: redis.Redis, ns: str, policy_id: str, weights: dict[str, Any], train_iter: int,
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
    check_arrays(weights, f"policy version {train_iter} for {keys.policy(ns, policy_id)}")
    payload = serialization.dumps(weights)
    put_policy(conn, ns, policy_id, payload, train_iter, envstep_limit, lease_key, envstep)
    return len(payload)


def put_policy(conn: redis.Redis, ns: str, policy_id: str, payload: bytes, train_iter: int, envstep_limit: int,
               lease_key: str | None = None, envstep: int = 0) -> None:
    """Write policy bytes (msgpack, :func:`publish_policy`) as version ``train_iter`` and announce it.

    Raises:
        common.scripts.LeaseRevoked: ``lease_key`` is given and gone.
    """
    blobstore.put_versioned(conn, keys.policy(ns, policy_id), payload, train_iter,
                            meta={"train_iter": train_iter, "envstep_limit": int(envstep_limit), "envstep": int(envstep),
                                  "ts": round(time.time(), 3), "format": "msgpack-ndarray"},
                            lease_key=lease_key, channel=keys.policy_updates(ns, policy_id),
                            message=f"{train_iter} {int(envstep_limit)}")


class PolicyPublisher:
    """Publishes collector weights (:func:`put_policy`) from a writer thread of its own, so a train
    iteration never waits for Redis's reply (py-spy: the synchronous write was 5 % of a CartPole
    DQN learner's samples).

    :meth:`publish` checks and serializes on the caller's thread (a snapshot of the weights) and
    hands the bytes over; a publication not written yet when the next one comes is replaced by it
    (collectors want the newest version; versions they see still only rise). An error of the
    writer (a revoked lease, a Redis that stayed down past the retries) is raised by the next
    :meth:`publish` or :meth:`flush`. It keeps the last publication's bytes, so :meth:`republish`
    can put the newest version back on a new primary after a failover (from the buffer reader's
    thread: bytes only, no torch).
    """

    def __init__(self, conn: redis.Redis, ns: str, policy_id: str, lease_key: str) -> None:
        self._conn, self._ns, self._policy_id, self._lease = conn, ns, policy_id, lease_key
        self._last: Optional[tuple[bytes, int, int, int]] = None  # payload, version, envstep_limit, envstep
        self._lock = threading.Lock()  # one write at a time: the writer's, or a republish
        self._state = threading.Condition()
        self._pending: Optional[tuple[bytes, int, int, int]] = None
        self._writing = False
        self._error: Optional[BaseException] = None
        self._closed = False
        self._writer: Optional[threading.Thread] = None

    def publish(self, weights: dict[str, Any], train_iter: int, envstep_limit: int, envstep: int) -> None:
        """Publish ``weights`` (numpy arrays by name) as version ``train_iter``, without waiting
        for the write.

        Raises:
            common.scripts.LeaseRevoked: an earlier write found the task's lease gone.
            common.finite.NonFiniteError: a weight is NaN or inf (nothing is published).
        """
        check_arrays(weights, f"policy version {train_iter} for {keys.policy(self._ns, self._policy_id)}")
        payload = serialization.dumps(weights)
        with self._state:
            self._raise_error()
            self._pending = (payload, train_iter, int(envstep_limit), int(envstep))
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, daemon=True, name="policy-publisher")
                self._writer.start()
            self._state.notify_all()

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until every publication handed over is written (``timeout`` seconds at most).

        Raises:
            common.scripts.LeaseRevoked, redis.RedisError: as the writer met them.
            TimeoutError: the write still hangs after ``timeout`` seconds.
        """
        with self._state:
            if not self._state.wait_for(lambda: self._error is not None or (self._pending is None and not self._writing),
                                        timeout):
                raise TimeoutError(f"policy {keys.policy(self._ns, self._policy_id)}: a publication still "
                                   f"unwritten after {timeout:g} s")
            self._raise_error()

    def close(self) -> None:
        """Stop the writer after what it is writing; publications not written yet are dropped."""
        with self._state:
            self._closed = True
            self._state.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _write_loop(self) -> None:
        while True:
            with self._state:
                if not self._state.wait_for(lambda: self._pending is not None or self._closed, timeout=5.0):
                    continue
                if self._closed:
                    return
                item, self._pending, self._writing = self._pending, None, True
                self._state.notify_all()  # every change of the state is announced to its waiters
            try:
                with self._lock:
                    self._last = item
                    put_policy(self._conn, self._ns, self._policy_id, item[0], item[1], item[2], self._lease, item[3])
            except BaseException as e:  # handed to the train loop; nothing more is written
                with self._state:
                    self._error, self._writing = e, False
                    self._state.notify_all()
                return
            with self._state:
                self._writing = False
                self._state.notify_all()

    def republish(self) -> Optional[int]:
        """Publish the last version again; returns it (None when nothing was published yet)."""
        with self._lock:
            if self._last is None:
                return None
            payload, version, limit, envstep = self._last
            put_policy(self._conn, self._ns, self._policy_id, payload, version, limit, self._lease, envstep)
            return version
