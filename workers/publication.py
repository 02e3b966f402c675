"""Publishing collector weights: policy version ``train_iter`` under ``rqrl:{ns}:policy:{policy_id}``.

A version is a versioned blob (common/blobstore.py) of msgpack'd numpy weights, written through
the learner task's lease and announced on the policy's updates channel as
``"{train_iter} {envstep_limit}"``; collectors adopt it from there (workers/comm_collector.py).
"""

from __future__ import annotations

import inspect
import threading
import time
from typing import Any, Optional

import redis
from redis.connection import Connection
from redis.exceptions import NoScriptError

from common import blobstore, keys, serialization
from common.finite import check_arrays
from common.scripts import LeaseRevoked, put_versioned_command


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
                            meta=_meta(train_iter, envstep_limit, envstep), lease_key=lease_key,
                            channel=keys.policy_updates(ns, policy_id), message=_announcement(train_iter, envstep_limit))


def _meta(train_iter: int, envstep_limit: int, envstep: int) -> dict[str, str | int | float]:
    return {"train_iter": train_iter, "envstep_limit": int(envstep_limit), "envstep": int(envstep),
            "ts": round(time.time(), 3), "format": "msgpack-ndarray"}


def _announcement(train_iter: int, envstep_limit: int) -> str:
    return f"{train_iter} {int(envstep_limit)}"


def _pool_connection(pool: Any) -> Connection:
    """A connection of ``pool`` for the caller's own use: redis-py 5.3+ takes no arguments (a
    command name is deprecated there), 5.0-5.2 (the floor) needs one."""
    if inspect.signature(pool.get_connection).parameters["command_name"].default is inspect.Parameter.empty:
        return pool.get_connection("EVALSHA")
    return pool.get_connection()


# A publication: payload, version (train_iter), envstep_limit, envstep.
Publication = tuple[bytes, int, int, int]
# What a write on the publisher's own connection can meet that a write through the client (its
# Retry reconnects; a lost script cache is loaded again) gets past.
_LINK_ERRORS = (redis.ConnectionError, redis.TimeoutError, NoScriptError)


class PolicyPublisher:
    """Publishes collector weights (:func:`put_policy`) without waiting for Redis's reply: each
    version is sent on a connection of the publisher's own and its reply read when the next one is
    published (or at :meth:`flush`), by which time it has long come, so a train iteration does not
    wait for the round trip. This replaced a writer thread, whose Python work held the GIL while the
    training thread waited for it (CartPole DQN: the data source's call took 500-550 µs after each
    publication against 120-143 µs otherwise; docs/performance.md).

    Every version is sent, in order: a collector in lockstep waits for the very version that
    trained on its chunk (common/config.py ``apply_deterministic``), and a learner waiting for data
    publishes nothing more that could carry a kept-back version out. Where the reply of the version
    before is late (a stalled Redis), the next :meth:`publish` waits for it, up to the connection's
    socket timeout; the learner's data waits on the same Redis then. Where the own connection fails
    (a dropped connection, a Redis that lost its script cache) that version is written again through
    the client, whose Retry reconnects. A write's error (a revoked lease, a Redis that stayed down
    past the retries) is raised by that and every later :meth:`publish` or :meth:`flush`: nothing
    more is written. It keeps the last written version's bytes, so :meth:`republish` can put it
    back on a new primary after a failover (from the buffer reader's thread, through the client:
    bytes only, no torch).

    Used from one thread (the training thread); :meth:`republish` from any.
    """

    def __init__(self, conn: redis.Redis, ns: str, policy_id: str, lease_key: str) -> None:
        self._conn, self._ns, self._policy_id, self._lease = conn, ns, policy_id, lease_key
        self._key = keys.policy(ns, policy_id)
        self._link: Optional[Connection] = None  # the publisher's own connection, from the client's pool
        self._sent: Optional[Publication] = None  # sent on the link, its reply not read yet
        self._last: Optional[Publication] = None  # the newest version written
        self._lock = threading.Lock()  # a write through the client: the training thread's, or a republish
        self._error: Optional[BaseException] = None

    def publish(self, weights: dict[str, Any], train_iter: int, envstep_limit: int, envstep: int) -> None:
        """Publish ``weights`` (numpy arrays by name) as version ``train_iter``: read the reply to
        the version before (waiting for it only when Redis is late), then send this one without
        waiting for its reply.

        Raises:
            common.scripts.LeaseRevoked: a write found the task's lease gone.
            redis.RedisError: a write failed past the client's retries.
            common.finite.NonFiniteError: a weight is NaN or inf (nothing is published).
        """
        check_arrays(weights, f"policy version {train_iter} for {self._key}")
        payload = serialization.dumps(weights)
        self._raise_error()
        self._settle((payload, train_iter, int(envstep_limit), int(envstep)))

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until the last version published is written (``timeout`` seconds at most).

        Raises:
            common.scripts.LeaseRevoked, redis.RedisError: as the writes met them.
            TimeoutError: Redis did not answer within ``timeout`` seconds (names the version).
        """
        self._raise_error()
        if self._sent is not None and not self._reply_ready(timeout):
            raise TimeoutError(f"policy {self._key}: version {self._sent[1]} still unwritten after {timeout:g} s")
        self._settle(None)

    def close(self) -> None:
        """Give the connection back; a version sent and not answered yet may still be written by Redis."""
        self._sent = None
        self._drop_link()

    def republish(self) -> Optional[int]:
        """Publish the last written version again; returns it (None when nothing was written yet)."""
        with self._lock:
            if self._last is None:
                return None
            self._write_through_client(self._last)
            return self._last[1]

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _settle(self, item: Optional[Publication]) -> None:
        """Read the reply in flight, then send ``item`` (if any); an error is kept and raised by
        every later call: nothing more is written."""
        try:
            self._collect()
            if item is not None:
                self._send(item)
        except BaseException as e:
            self._error = e
            raise

    def _reply_ready(self, timeout: float) -> bool:
        try:
            return bool(self._link.can_read(timeout=timeout))
        except _LINK_ERRORS:
            return True  # the read that follows meets the error and writes through the client

    def _send(self, item: Publication) -> None:
        payload, version, limit, envstep = item
        command = put_versioned_command(self._conn, self._lease, self._key,
                                        blobstore.versioned_fields(payload, version, _meta(version, limit, envstep)),
                                        keys.policy_updates(self._ns, self._policy_id), _announcement(version, limit))
        try:
            if self._link is None:
                self._link = _pool_connection(self._conn.connection_pool)
            self._link.send_command(*command)
        except _LINK_ERRORS:
            self._drop_link()
            self._write_now(item)
            return
        self._sent = item

    def _collect(self) -> None:
        """Read the reply of the version in flight (blocking); raise what it says."""
        item, self._sent = self._sent, None
        if item is None:
            return
        try:
            reply = self._link.read_response()
        except _LINK_ERRORS:
            self._drop_link()
            self._write_now(item)
            return
        if reply == 0:
            raise LeaseRevoked(f"lease {self._lease} was revoked; not writing {self._key}")
        self._last = item

    def _write_now(self, item: Publication) -> None:
        with self._lock:
            self._write_through_client(item)
            self._last = item

    def _write_through_client(self, item: Publication) -> None:
        payload, version, limit, envstep = item
        put_policy(self._conn, self._ns, self._policy_id, payload, version, limit, self._lease, envstep)

    def _drop_link(self) -> None:
        """Close the own connection (an unread reply must not reach the pool's next user) and give it back."""
        if self._link is not None:
            link, self._link = self._link, None
            link.disconnect()
            self._conn.connection_pool.release(link)
