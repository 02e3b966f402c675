"""The seed's comm collector over Redis: step data as msgpack blobs, metadata on a stream.

The seed's FlaskFileSystemCollector wrote one file per sample, queued metadata in memory behind
``sleep(0.1)`` loops and served it over HTTP. Here each call becomes a Redis command on one
pipeline, sent once per chunk (:meth:`RedisCommCollector.flush`): SET the blob with a TTL,
XADD its metadata, INCRBY the experiment's env-step counter, and read back the policy version,
the learner's ``envstep_limit`` and the stop flag — one round trip per ``n_sample`` transitions.

Replay-ratio limiter (collector side): when the env-step counter passes the ``envstep_limit``
the learner published with its last policy, the collector waits on the policy's pub/sub
channel until the learner catches up (or the stop flag, or ``max_wait_s``). The learner side
of the limiter (not training faster than ``train_iter_per_env_step``) is in workers/learner.py.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import numpy as np
import redis

from common import blobstore, events, keys, serialization, streams


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
        self._exp = task["exp_name"]
        self._task_id = task["task_id"]
        self._data_ttl = int(data_ttl_s)
        self._meta_stream = keys.buffer_meta(self._exp, task["buffer_id"])
        self._policy_key = keys.policy(self._exp, task["policy_id"])
        self._updates_channel = keys.policy_updates(self._exp, task["policy_id"])
        self._pipe = conn.pipeline(transaction=False)
        self._pubsub = None
        self._pending_env_steps = 0
        self._n_sent = 0
        self.policy_version: int | None = None
        self.stop_flag = False
        self.limiter_wait_s = 0.0  # seconds spent waiting for the learner (replay-ratio limiter)

    # -- the seed's interface -------------------------------------------------------------
    def deal_with_resource(self) -> dict[str, int]:
        """Resources a collector task needs (the seed asked for 1 GPU; CartPole needs none)."""
        return {"cpu": 1, "gpu": 0}

    def deal_with_collector_start(self) -> None:
        """Announce the task: a ``started`` event with the worker's host and pid."""
        events.emit(self._conn, self._exp, "started", self._task_id, "collector",
                    host=socket.gethostname(), pid=os.getpid(), eval_flag=bool(self._task["eval_flag"]))

    def deal_with_collector_close(self, finish_info: dict[str, Any]) -> None:
        """Flush what is queued and report the seed's finish info in a ``finished`` event."""
        self.flush()
        events.emit(self._conn, self._exp, "finished", self._task_id, "collector",
                    buffer_id=self._task["buffer_id"], **finish_info)

    def send_stepdata(self, data_id: str, stepdata: dict[str, np.ndarray]) -> int:
        """Queue one chunk of stacked transitions as a msgpack blob; returns its size in bytes."""
        payload = serialization.dumps(stepdata)
        blobstore.put_data(self._pipe, keys.data(self._exp, data_id), payload, self._data_ttl)
        return len(payload)

    def send_metadata(self, metadata: dict[str, Any]) -> None:
        """Queue the chunk's metadata entry (needs ``data_id`` and ``policy_iter``, as the seed)."""
        missing = {"data_id", "policy_iter"} - metadata.keys()
        if missing:
            raise ValueError(f"task {self._task_id}: metadata lacks {sorted(missing)}")
        self._pipe.xadd(self._meta_stream, streams.encode_fields(metadata),
                        maxlen=streams.DEFAULT_MAXLEN, approximate=True)
        self._pending_env_steps += int(metadata.get("env_steps", 0))
        self._n_sent += 1

    def wait_for_policy(self, timeout_s: float) -> None:
        """Block until the learner has published a first policy (pub/sub, checking the stop flag).

        Raises:
            TimeoutError: nothing published within ``timeout_s`` seconds (names the key).
        """
        self._subscribe()
        deadline = time.monotonic() + timeout_s
        while self._conn.hget(self._policy_key, "version") is None:
            if self._conn.exists(keys.stop(self._exp)):
                self.stop_flag = True
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"task {self._task_id}: no policy published at {self._policy_key} within "
                                   f"{timeout_s:.0f} s; is a learner worker running (rq worker learner)?")
            self._pubsub.get_message(timeout=min(0.5, remaining))

    def _subscribe(self) -> None:
        if self._pubsub is None:
            self._pubsub = self._conn.pubsub(ignore_subscribe_messages=True)
            self._pubsub.subscribe(self._updates_channel)

    def get_policy_update_info(self) -> dict[str, np.ndarray] | None:
        """The latest published weights if their version is newer than the one held, else None.

        Raises:
            serialization.DecodeError / blobstore.BlobError: a corrupt policy blob (names the key).
        """
        got = blobstore.get_versioned(self._conn, self._policy_key)
        if got is None:
            return None
        meta, payload = got
        version = int(meta["version"])
        if self.policy_version is not None and version <= self.policy_version:
            return None
        weights = serialization.loads(payload, what=self._policy_key)
        self.policy_version = version
        return weights

    # -- batching -------------------------------------------------------------------------
    def flush(self, max_wait_s: float = 30.0) -> bool:
        """Send everything queued in one round trip; read policy version, envstep_limit and stop flag.

        Blocks (pub/sub, at most ``max_wait_s`` seconds) while the collectors are ahead of the
        learner's ``envstep_limit``.

        Returns:
            True when the published policy version is newer than the one held.
        """
        self._pipe.incrby(keys.envstep(self._exp), self._pending_env_steps)
        self._pending_env_steps = 0
        self._pipe.hmget(self._policy_key, ["version", "envstep_limit"])
        self._pipe.exists(keys.stop(self._exp))
        replies = self._pipe.execute()
        counter, (version_raw, limit_raw), stop = replies[-3], replies[-2], replies[-1]
        self.stop_flag = bool(stop)
        if limit_raw is not None and counter > int(limit_raw) and not self.stop_flag:
            version_raw = self._wait_for_learner(counter, max_wait_s) or version_raw
        if version_raw is None:
            return False
        return self.policy_version is None or int(version_raw) > self.policy_version

    def _wait_for_learner(self, counter: int, max_wait_s: float) -> bytes | None:
        """Wait for a publication whose envstep_limit admits ``counter``; returns its version."""
        t0 = time.monotonic()
        self._subscribe()
        version = None
        # Re-read after subscribing: a publication between the pipeline and SUBSCRIBE is not lost.
        version_raw, limit_raw = self._conn.hmget(self._policy_key, ["version", "envstep_limit"])
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
