"""What every task needs at run time: validation, its Redis connection, heartbeat and stop flag."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import uuid
from typing import Any, Callable, Iterator

import redis
from easydict import EasyDict

from common import events, keys, lease
from common.config import ConfigError, compile_config
from common.policy import algorithm_of
from common.connection import connect

_REQUIRED = {
    "collector": ("task_id", "exp_name", "run_id", "buffer_id", "policy_id", "eval_flag", "collect_setting", "config"),
    "learner": ("task_id", "exp_name", "run_id", "buffer_id", "policy_id", "config"),
}
_OPTIONAL = {
    "collector": ("task_type", "run_name", "envstep", "seed", "redis_url", "eval_policy_key", "eval_episodes"),
    "learner": ("task_type", "run_name", "resume", "seed", "redis_url", "group_id", "rank", "world_size"),
}
_MAX_ID_LEN = 200


class TaskError(ValueError):
    """A task that must not run: malformed, stale or a duplicate (names the task and the field).

    Raised before the task touches anything of its experiment, so it never reports events
    under its task id (that id may belong to a live task)."""


class StaleTask(TaskError):
    """The task's experiment is unknown, its run is not the current one, or its lease is gone."""


class DuplicateTask(TaskError):
    """Another job already runs this task id (its heartbeat key holds another owner)."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_fields(task: dict, kind: str, tid: str) -> None:
    """Type and value of every field (see :data:`_REQUIRED`, :data:`_OPTIONAL`); raises TaskError."""
    def bad(field: str, why: str) -> TaskError:
        return TaskError(f"task {tid}: field {field!r} = {task.get(field)!r:.80} {why}")

    unknown = sorted(map(str, set(task) - set(_REQUIRED[kind]) - set(_OPTIONAL[kind])))
    if unknown:
        raise TaskError(f"task {tid}: unknown fields {unknown} for a {kind} task")
    for field in ("task_id", "exp_name", "run_id", "buffer_id", "policy_id"):
        v = task[field]
        if not isinstance(v, str):
            raise bad(field, f"is {type(v).__name__}, must be a string")
        try:
            keys._check(field, v)
        except ValueError:
            raise bad(field, "is empty or contains ':', space or glob characters") from None
        if len(v) > _MAX_ID_LEN:
            raise bad(field, f"is longer than {_MAX_ID_LEN} characters")
    for field in ("eval_flag", "resume"):
        if field in task and not isinstance(task[field], bool):
            raise bad(field, f"is {type(task[field]).__name__}, must be true or false")
    for field in ("envstep", "seed"):
        if field in task and not (_is_int(task[field]) and 0 <= task[field] < 2**63):
            raise bad(field, "must be an integer in [0, 2**63)")
    if "redis_url" in task and not isinstance(task["redis_url"], str):
        raise bad("redis_url", "must be a string")
    if kind == "learner" and ("world_size" in task or "rank" in task or "group_id" in task):
        # A data-parallel learner group (workers/ddp.py): all three, rank in [0, world_size).
        size, rank, gid = task.get("world_size"), task.get("rank"), task.get("group_id")
        if not (_is_int(size) and 1 <= size <= 1024):
            raise bad("world_size", "must be an integer in [1, 1024]")
        if not (_is_int(rank) and 0 <= rank < size):
            raise bad("rank", f"must be an integer in [0, world_size={size})")
        if not isinstance(gid, str) or len(gid) > _MAX_ID_LEN:
            raise bad("group_id", f"must be a string of at most {_MAX_ID_LEN} characters")
        try:
            keys._check("group_id", gid)
        except ValueError:
            raise bad("group_id", "is empty or contains ':', space or glob characters") from None
    if "run_name" in task:
        try:
            keys.namespace(task["exp_name"], task["run_name"])
        except (ValueError, TypeError):
            raise bad("run_name", "must be a string without ':', '/', space or glob characters") from None
    if kind == "collector":
        cs = task["collect_setting"]
        if not isinstance(cs, dict):
            raise TaskError(f"task {tid}: field 'collect_setting' is {type(cs).__name__}, must be a dict of numbers")
        for k, v in cs.items():
            if not isinstance(k, str) or not (_is_real(v) or isinstance(v, bool)):
                raise TaskError(f"task {tid}: field 'collect_setting.{k}' = {v!r:.80} must be a finite number or a bool")
        # What each setting means is the algorithm's business (its policy reads them); here only their form.
        if "eval_policy_key" in task:
            key = task["eval_policy_key"]
            if not (isinstance(key, str) and key.startswith(keys.exp_prefix(task_namespace(task)) + ":task:")
                    and key.endswith(":evaluated")):
                raise bad("eval_policy_key", "must be the key of an evaluated policy of this experiment")
            if not task["eval_flag"]:
                raise bad("eval_policy_key", "is only for eval tasks (eval_flag true)")
        if "eval_episodes" in task and not (_is_int(task["eval_episodes"]) and 1 <= task["eval_episodes"] <= 10_000):
            raise bad("eval_episodes", "must be an integer in [1, 10000]")
    if not isinstance(task["config"], dict):
        raise bad("config", f"is {type(task['config']).__name__}, must be a dict")


def task_namespace(task: dict) -> str:
    """The Redis key namespace of the task's run (:func:`common.keys.namespace`), which is also
    where its logs go (``./{namespace}/log``)."""
    return keys.namespace(task["exp_name"], task.get("run_name", ""))


def validate_task(task: Any, kind: str) -> EasyDict:
    """Check every field of a task dict (type and value), then recompile its config (so defaults
    of this worker's version apply). Nothing is read from or written to Redis.

    Returns:
        The task's config as an EasyDict.

    Raises:
        TaskError: not a dict, a missing/unknown field, a field of the wrong type or value, a wrong
            ``task_type``, a config whose ``exp_name`` differs from the task's, or a bad config.
    """
    if not isinstance(task, dict):
        raise TaskError(f"{kind} task must be a dict, got {type(task).__name__}")
    tid = task.get("task_id", "<no task_id>")
    tid = tid if isinstance(tid, str) else repr(tid)
    if task.get("task_type", kind) != kind:
        raise TaskError(f"task {tid}: task_type {task.get('task_type')!r} sent to the {kind} job function")
    missing = [k for k in _REQUIRED[kind] if k not in task]
    if missing:
        raise TaskError(f"task {tid}: missing keys {missing}")
    _check_fields(task, kind, tid)
    cfg = task["config"]
    try:
        create = cfg.get("create")
        compiled = compile_config({k: v for k, v in cfg.items() if k != "create"}, create)
    except ConfigError as e:
        raise TaskError(f"task {tid}: bad config: {e}") from None
    if compiled.exp_name != task["exp_name"]:
        raise TaskError(f"task {tid}: field 'exp_name' = {task['exp_name']!r} differs from config.exp_name "
                        f"{compiled.exp_name!r}")
    if kind == "collector":
        try:  # what the settings mean is the algorithm's to check
            algorithm_of(compiled).check_setting(task["collect_setting"])
        except ValueError as e:
            raise TaskError(f"task {tid}: field 'collect_setting': {e}") from None
    return compiled


def task_connection(task: dict) -> redis.Redis:
    """The Redis the task came from (the RQ job's server, with rqrl's retries), else
    ``task["redis_url"]`` / $RQRL_REDIS_URL."""
    from rq import get_current_job

    from common.connection import with_retries

    job = get_current_job()
    if job is not None:
        return with_retries(job.connection)
    return connect(task.get("redis_url"))


def check_current(conn: redis.Redis, task: dict) -> None:
    """Refuse a task that may not run: unknown experiment, an earlier run, or no lease.

    Raises:
        StaleTask: naming the task and the reason (and the key that says so).
    """
    exp, tid = task_namespace(task), task["task_id"]
    current = conn.get(keys.run(exp))
    if current is None:
        raise StaleTask(f"task {tid}: unknown run {exp!r} (no {keys.run(exp)}: no coordinator runs it)")
    if current.decode() != task["run_id"]:
        raise StaleTask(f"task {tid}: belongs to run {task['run_id']!r} of {exp}; the current run is {current.decode()!r}")
    if not lease.held(conn, exp, tid):
        raise StaleTask(f"task {tid}: no lease ({keys.lease(exp, tid)}): it was never dispatched, or it was "
                        "declared dead and replaced")


@contextlib.contextmanager
def task_scope(conn: redis.Redis, task: dict, kind: str, cfg: EasyDict,
               failure_fields: Callable[[Exception], dict[str, Any]]) -> Iterator[None]:
    """The body of a job function: the task's heartbeat runs throughout (``commander.heartbeat_timeout``
    seconds of TTL), and an error is reported as a ``failed`` event of ``kind`` naming the task, with
    ``failure_fields(error)`` beside its text, then re-raised so RQ marks the job failed. A
    :class:`TaskError` is re-raised unreported: this process is not the task's runner."""
    exp, task_id = task_namespace(task), task["task_id"]
    try:
        with Heartbeat(conn, exp, task_id, cfg.commander.heartbeat_timeout):
            yield
    except TaskError:
        raise
    except Exception as e:
        events.emit(conn, exp, "failed", task_id, kind, error=f"{type(e).__name__}: {e}"[:2000], **failure_fields(e))
        raise


def stop_requested(conn: redis.Redis, exp: str) -> bool:
    """True once the experiment's stop flag is set."""
    return bool(conn.exists(keys.stop(exp)))


class Heartbeat:
    """Keeps ``rqrl:{exp}:task:{task_id}:heartbeat`` alive (TTL ``ttl_s`` seconds) from a daemon thread.

    The key expires within ``ttl_s`` seconds of the process dying, which is how the
    coordinator detects a dead task without waiting for RQ's maintenance pass.

    Raises:
        DuplicateTask: on enter, when another runner holds the key (a copy of a live task's id).
    """

    def __init__(self, conn: redis.Redis, exp: str, task_id: str, ttl_s: float, worker: str = "") -> None:
        self._conn = conn
        self._key = keys.heartbeat(exp, task_id)
        self._ttl_ms = max(1000, int(ttl_s * 1000))
        self._task_id = task_id
        # Unique per runner, so an owner can tell its own key from a duplicate's.
        self._value = f"{worker or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{task_id}", daemon=True)

    def __enter__(self) -> "Heartbeat":
        # Claiming the key (NX) is what makes this job the task's one runner: a copy of a live
        # task's id (hand-enqueued, or a job id reused) finds it taken and leaves the task alone.
        if not self._conn.set(self._key, self._value, px=self._ttl_ms, nx=True):
            owner = self._conn.get(self._key)
            raise DuplicateTask(f"task {self._task_id} already runs elsewhere ({self._key} = "
                                f"{(owner or b'?').decode(errors='replace')!r}); this copy does not run")
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
