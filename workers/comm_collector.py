"""The seed's comm collector over Redis: step data as msgpack blobs, metadata on a stream.

The seed's FlaskFileSystemCollector wrote one file per sample, queued metadata in memory behind
``sleep(0.1)`` loops and served it over HTTP. Here :meth:`RedisCommCollector.flush` sends the
staged chunks in one round trip (common/step_data.py ``StepDataStore.put``), each chunk as a SET of
its blob and one atomic Lua script: check the task's lease, move the blob to its data key with
its TTL, XADD its metadata, count it (env-step counter and buffer stats), and read back the
policy version, the learner's ``envstep_limit`` and the stop flag — refused, writing nothing,
once the coordinator revoked the task's lease. The collector flushes every chunk of
``n_sample`` transitions; staging several before a flush sends them in the same round trip.

Replay-ratio limiter (collector side): when the env-step counter passes the ``envstep_limit``
the learner published with its last policy, the collector waits on the policy's pub/sub
channel until the learner catches up (or the stop flag, or ``max_wait_s``). The learner side
of the limiter (not training faster than ``train_iter_per_env_step``) is in workers/sources/replay.py.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

import numpy as np
import redis

from common import blobstore, chunk_codec, events, keys, serialization, streams
from common.finite import NonFiniteError, check_arrays
from common.data_shards import task_stores
from common.step_data import Chunk
from workers.task import task_namespace

log = logging.getLogger(__name__)


# What reading published weights (a policy, a league snapshot) can raise: a missing chunk or a
# wrong key type, a payload that is not msgpack or not a dict of arrays, NaN / inf in them.
WEIGHT_ERRORS = (blobstore.BlobError, serialization.DecodeError, NonFiniteError, redis.ResponseError, KeyError,
                 ValueError, TypeError)


def decode_weights(payload: bytes, what: str) -> dict[str, np.ndarray]:
    """The weight arrays of a versioned blob's ``payload`` (``what``: its key and version, for errors).

    Raises:
        one of :data:`WEIGHT_ERRORS`: not msgpack, not a dict of arrays, or non-finite values.
    """
    weights = serialization.loads(payload, what=what)
    if not isinstance(weights, dict):
        raise TypeError(f"{what} holds a {type(weights).__name__}, not a dict of weight arrays")
    check_arrays(weights, what)
    return weights


def _worker_name() -> str:
    """The RQ worker running this task ("" outside RQ)."""
    from rq import get_current_job

    return getattr(get_current_job(), "worker_name", None) or ""


class RedisCommCollector:
    """Collector-side I/O for one task (``task`` as made by the commander).

    Args:
        conn: Redis client.
        task: the collector task dict (``exp_name``, ``task_id``, ``buffer_id``, ``policy_id``).
        data_ttl_s: seconds a step-data blob lives unless consumed.
    """

    def __init__(self, conn: redis.Redis, task: dict, data_ttl_s: int) -> None:
        self._conn = conn
        self._task = task
        self._exp = task_namespace(task)
        self._task_id = task["task_id"]
        self._data_ttl = int(data_ttl_s)
        self._store = task_stores(conn, task, self._exp)[0]  # its data shard, or the control Redis
        self._policy_key = keys.policy(self._exp, task["policy_id"])
        self._updates_channel = keys.policy_updates(self._exp, task["policy_id"])
        self._lease = keys.lease(self._exp, self._task_id)
        self._pending: dict[str, Any] = {}
        self._staged: list[Chunk] = []
        self._pubsub = None
        self._next_stop_poll = 0.0
        self.policy_version: int | None = None
        self.stop_flag = False
        self.limiter_wait_s = 0.0  # seconds spent waiting for the learner (replay-ratio limiter)
        self.policy_published_at = 0.0  # unix seconds the held policy version was published
        self.policy_envstep = 0  # env steps the learner had consumed when it made the held version
        self.policy_errors = 0  # unreadable policy publications skipped (corrupt, wrong type, non-finite)
        self._bad_version: int | None = None  # the last version found unreadable: not read again
        self._ready: tuple[int, float, dict[str, np.ndarray], int] | None = None  # read by wait_for_policy
        # The run's collect setting as the last flush read it: raw JSON bytes (None: never written).
        self.collect_setting_raw: bytes | None = None

    @property
    def conn(self) -> redis.Redis:
        """The control connection (policies, league snapshots, events)."""
        return self._conn

    # -- the seed's interface -------------------------------------------------------------
    def deal_with_collector_start(self) -> None:
        """Announce the task: a ``started`` event with the host, pid and RQ worker name running it."""
        events.emit(self._conn, self._exp, "started", self._task_id, "collector",
                    host=socket.gethostname(), pid=os.getpid(), worker=_worker_name(),
                    eval_flag=bool(self._task["eval_flag"]))

    def deal_with_collector_close(self, finish_info: dict[str, Any]) -> None:
        """Report the seed's finish info in a ``finished`` event (with the RQ worker's name: the
        ``started`` event may be trimmed from the stream by the time a long task ends)."""
        events.emit(self._conn, self._exp, "finished", self._task_id, "collector",
                    buffer_id=self._task["buffer_id"], worker=_worker_name(), **finish_info)

    def send_episodes(self, fields: dict[str, str]) -> None:
        """Send finished training episodes as one ``scalars`` event (``fields``: workers/episode_shipper.py)."""
        events.emit(self._conn, self._exp, "scalars", self._task_id, "collector", **fields)

    def send_stepdata(self, data_id: str, stepdata: dict[str, Any], codec: str = "none") -> int:
        """Serialise one chunk of stacked transitions to a msgpack blob compressed with ``codec``
        (common/chunk_codec.py; staged with its metadata by :meth:`send_metadata`, sent by
        :meth:`flush`); returns its bytes."""
        payload = chunk_codec.encode(serialization.dumps(stepdata), codec)
        self._pending["data_id"] = data_id
        self._pending["payload"] = payload
        return len(payload)

    def send_metadata(self, metadata: dict[str, Any]) -> None:
        """Stage the chunk with its metadata entry (needs ``data_id`` — the one given to
        :meth:`send_stepdata` — and ``policy_version``, as the seed's ``policy_iter``).

        Raises:
            ValueError: a field is missing, or :meth:`send_stepdata` was not called for this ``data_id``.
        """
        missing = {"data_id", "policy_version"} - metadata.keys()
        if missing:
            raise ValueError(f"task {self._task_id}: metadata lacks {sorted(missing)}")
        p, self._pending = self._pending, {}
        if p.get("data_id") != metadata["data_id"]:
            raise ValueError(f"task {self._task_id}: metadata for data_id {metadata['data_id']!r} without "
                             "send_stepdata for it first")
        self._store.data_key(p["data_id"])  # a bad data_id fails here, at its chunk, not at the flush
        self._staged.append(Chunk(p["data_id"], p["payload"], int(metadata.get("env_steps", 0)),
                                  streams.encode_fields(metadata)))

    def wait_for_policy(self, timeout_s: float) -> None:
        """Block until the learner has published a first policy (pub/sub, checking the stop flag).

        Raises:
            TimeoutError: nothing published within ``timeout_s`` seconds (names the key).
        """
        self._subscribe()
        deadline = time.monotonic() + timeout_s
        # A first publication that cannot be read is skipped like a later one: wait for the next.
        while self._ready is None:
            self._ready = self._read_policy()
            if self._ready is not None:
                break
            if self._conn.exists(keys.stop(self._exp)):
                self.stop_flag = True
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"task {self._task_id}: no readable policy published at {self._policy_key} within "
                                   f"{timeout_s:.0f} s ({self.policy_errors} unreadable); is a learner worker "
                                   "running (rq worker learner)?")
            self._pubsub.get_message(timeout=min(0.5, remaining))

    def store_evaluated(self, bundle: bytes, version: int, ttl_s: int = 7200) -> str:
        """Eval task: keep the final.pt bundle it played (lease-checked), for the coordinator to
        export as best.pt / final.pt. Returns the key.

        Raises:
            common.scripts.LeaseRevoked: the task was declared dead.
        """
        key = keys.evaluated_policy(self._exp, self._task_id)
        blobstore.put_versioned(self._conn, key, bundle, version, meta={"format": "torch"}, lease_key=self._lease)
        self._conn.expire(key, int(ttl_s))
        return key

    def load_evaluated(self, key: str) -> bytes:
        """The bundle another eval task stored (a confirmation eval replays exactly those weights).

        Raises:
            blobstore.BlobError: the key is gone or incomplete (named).
        """
        got = blobstore.get_versioned(self._conn, key)
        if got is None:
            raise blobstore.BlobError(f"{key}: the policy to confirm is gone (expired or deleted)")
        return got[1]

    def wait_for_policy_update(self, timeout_s: float) -> bool:
        """On-policy data: block until a version other than the one held is published (pub/sub),
        the stop flag is set, or ``timeout_s`` seconds pass.

        Returns:
            True when another version is available (fetch it with :meth:`get_policy_update_info`).
        """
        t0 = time.monotonic()
        self._subscribe()
        deadline = t0 + timeout_s
        try:
            while True:
                # Read after subscribing: a publication between the last read and SUBSCRIBE is not lost.
                raw = self._conn.hget(self._policy_key, "version")
                if raw is not None and (self.policy_version is None or int(raw) != self.policy_version):
                    return True
                if self.poll_stop(0.0):
                    return False
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._pubsub.get_message(timeout=min(0.5, remaining))
        finally:
            self.limiter_wait_s += time.monotonic() - t0

    def _subscribe(self) -> None:
        if self._pubsub is None:
            self._pubsub = self._conn.pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(self._updates_channel)

    def get_policy_update_info(self) -> dict[str, np.ndarray] | None:
        """The published weights if their version differs from the one held, else None.

        A publication that cannot be read (corrupt blob, wrong key type, non-finite weights) is
        logged with the key and the error, counted in :attr:`policy_errors` and skipped: the
        caller keeps acting with the weights it holds until the next good version.
        """
        got, self._ready = self._ready or self._read_policy(), None
        if got is None:
            return None
        self.policy_version, self.policy_published_at, weights, self.policy_envstep = got
        return weights

    def _read_policy(self) -> tuple[int, float, dict[str, np.ndarray], int] | None:
        """``(version, published_at, weights, envstep)`` of a readable publication other than the one held."""
        raw = None
        try:
            raw = self._conn.hget(self._policy_key, "version")
            # "Different", not "newer": a replacement learner resumes from its last checkpoint and
            # republishes an older version, which is then the one it trains on.
            if raw is None or (self.policy_version is not None and int(raw) == self.policy_version) \
                    or int(raw) == self._bad_version:
                return None
            got = blobstore.get_versioned(self._conn, self._policy_key)
            if got is None:
                return None
            meta, payload = got
            version = int(meta["version"])
            if self.policy_version is not None and version == self.policy_version:
                return None
            weights = decode_weights(payload, f"{self._policy_key} version {version}")
            return version, float(meta.get("ts", 0.0)), weights, int(meta.get("envstep", 0))
        except WEIGHT_ERRORS as e:
            self._policy_unreadable(f"{type(e).__name__}: {e}", raw)
            return None

    def _policy_unreadable(self, error: str, raw_version: bytes | None = None) -> None:
        try:
            self._bad_version = int(raw_version) if raw_version is not None else None
        except ValueError:
            self._bad_version = None
        self.policy_errors += 1
        log.warning("task %s: skipping unreadable policy %s (%s); %d so far; acting with version %s",
                    self._task_id, self._policy_key, error, self.policy_errors, self.policy_version)

    # -- batching -------------------------------------------------------------------------
    def flush(self, max_wait_s: float = 30.0) -> bool:
        """Send the staged chunks with their metadata in one round trip (each chunk atomically); read
        the policy version, limit, stop flag and the run's collect setting (:attr:`collect_setting_raw`).

        Blocks (pub/sub, at most ``max_wait_s`` seconds) while the collectors are ahead of the
        learner's ``envstep_limit``.

        Returns:
            True when the published policy version differs from the one held.

        Raises:
            common.scripts.LeaseRevoked: the coordinator declared this task dead (nothing was sent).
            ValueError: nothing is staged (:meth:`send_stepdata` and :meth:`send_metadata` first).
        """
        staged, self._staged = self._staged, []
        if not staged:
            raise ValueError(f"task {self._task_id}: flush needs send_stepdata and send_metadata first")
        sent = self._store.put(staged, self._lease, self._policy_key, self._data_ttl, streams.DEFAULT_MAXLEN)
        self.stop_flag, self.collect_setting_raw, version_raw = sent.stop, sent.collect_setting, sent.policy_version
        if sent.policy_error:
            self._policy_unreadable(sent.policy_error)
            return False
        if sent.envstep_limit is not None and sent.counter > int(sent.envstep_limit) and not self.stop_flag:
            version_raw = self._wait_for_learner(sent.counter, max_wait_s) or version_raw
        if version_raw is None:
            return False
        try:
            return self.policy_version is None or int(version_raw) != self.policy_version
        except ValueError:
            self._policy_unreadable(f"version field {version_raw!r} is not an integer")
            return False

    def poll_stop(self, interval_s: float = 0.5) -> bool:
        """Refresh :attr:`stop_flag` at most every ``interval_s`` seconds (for tasks that send no data)."""
        now = time.monotonic()
        if now >= self._next_stop_poll:
            self._next_stop_poll = now + interval_s
            self.stop_flag = bool(self._conn.exists(keys.stop(self._exp)))
        return self.stop_flag

    def _wait_for_learner(self, counter: int, max_wait_s: float) -> bytes | None:
        """Wait for a publication whose envstep_limit admits ``counter``; returns its version."""
        t0 = time.monotonic()
        self._subscribe()
        version = None
        # Re-read after subscribing: a publication between the pipeline and SUBSCRIBE is not lost.
        try:
            version_raw, limit_raw = self._conn.hmget(self._policy_key, ["version", "envstep_limit"])
        except redis.ResponseError as e:
            self._policy_unreadable(f"{self._policy_key}: {e}")
            return None
        limit = int(limit_raw) if limit_raw is not None else counter
        while counter > limit and not self.stop_flag:
            remaining = max_wait_s - (time.monotonic() - t0)
            if remaining <= 0:
                break
            msg = self._pubsub.get_message(timeout=min(0.5, remaining))
            if msg is None:
                self.stop_flag = bool(self._conn.exists(keys.stop(self._exp)))
                continue
            v, lim = msg["data"].split()
            version, limit = v, int(lim)
        self.limiter_wait_s += time.monotonic() - t0
        return version if version is not None else version_raw

    def close(self) -> None:
        """Release the pub/sub connection, if one was opened."""
        if self._pubsub is not None:
            self._pubsub.close()
            self._pubsub = None
