"""What every task needs at run time: validation, its Redis connection, heartbeat and stop flag."""

from __future__ import annotations

import threading
from typing import Any

import redis
from easydict import EasyDict

from common import keys, lease
from common.config import ConfigError, compile_config
from common.connection import connect

_REQUIRED = {
    "collector": ("task_id", "exp_name", "run_id", "buffer_id", "policy_id", "eval_flag", "collect_setting", "config"),
    "learner": ("task_id", "exp_name", "run_id", "buffer_id", "policy_id", "config"),
}


class TaskError(ValueError):
    """A malformed task dict (names the task and the key)."""


def validate_task(task: Any, kind: str) -> EasyDict:
    """Check a task dict and recompile its config (so defaults of this worker's version apply).

    Returns:
        The task's config as an EasyDict.

    Raises:
        TaskError: not a dict, a missing key, a wrong ``task_type`` or a bad config.
    """
    if not isinstance(task, dict):
        raise TaskError(f"{kind} task must be a dict, got {type(task).__name__}")
    tid = task.get("task_id", "<no task_id>")
    if task.get("task_type", kind) != kind:
        raise TaskError(f"task {tid}: task_type {task.get('task_type')!r} sent to the {kind} job function")
    missing = [k for k in _REQUIRED[kind] if k not in task]
    if missing:
        raise TaskError(f"task {tid}: missing keys {missing}")
    cfg = task["config"]
    if not isinstance(cfg, dict):
        raise TaskError(f"task {tid}: 'config' must be a dict")
    try:
        create = cfg.get("create")
        return compile_config({k: v for k, v in cfg.items() if k != "create"}, create)
    except ConfigError as e:
        raise TaskError(f"task {tid}: bad config: {e}") from None


def task_connection(task: dict) -> redis.Redis:
    """The Redis the task came from (the RQ job's server, with rqrl's retries), else
    ``task["redis_url"]`` / $RQRL_REDIS_URL."""
    from rq import get_current_job

    from common.connection import with_retries

    job = get_current_job()
    if job is not None:
        return with_retries(job.connection)
    return connect(task.get("redis_url"))


def is_stale(conn: redis.Redis, task: dict) -> bool:
    """True when the task may not run: it belongs to an earlier run, or its lease was revoked."""
    current = conn.get(keys.run(task["exp_name"]))
    if current is None or current.decode() != task["run_id"]:
        return True
    return not lease.held(conn, task["exp_name"], task["task_id"])


def stop_requested(conn: redis.Redis, exp: str) -> bool:
    """True once the experiment's stop flag is set."""
    return bool(conn.exists(keys.stop(exp)))


class Heartbeat:
    """Keeps ``rqrl:{exp}:task:{task_id}:heartbeat`` alive (TTL ``ttl_s`` seconds) from a daemon thread.

    The key expires within ``ttl_s`` seconds of the process dying, which is how the
    coordinator detects a dead task without waiting for RQ's maintenance pass.
    """

    def __init__(self, conn: redis.Redis, exp: str, task_id: str, ttl_s: float, worker: str = "") -> None:
        self._conn = conn
        self._key = keys.heartbeat(exp, task_id)
        self._ttl_ms = max(1000, int(ttl_s * 1000))
        self._value = worker or "alive"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{task_id}", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._conn.set(self._key, self._value, px=self._ttl_ms)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._ttl_ms / 3000):
            try:
                self._conn.set(self._key, self._value, px=self._ttl_ms)
            except redis.RedisError:
                continue  # a blip: the next beat retries; the TTL tolerates a few misses

    def __exit__(self, *exc: Any) -> None:
        # The key is left to expire rather than deleted: the task's final event is already on the
        # events stream, and the coordinator must read that before it could see the key vanish.
        self._stop.set()
        self._thread.join(timeout=2)
