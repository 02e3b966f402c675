"""What every task needs at run time: validation into a :class:`TaskContext`, its Redis connection,
heartbeat and stop flag."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Optional

import redis
from easydict import EasyDict

from common import events, keys, lease
from common.config import ConfigError, compile_config
from common.connection import connect
from common.messages import CollectorTask, LearnerTask, MessageError
from common.policy import Algorithm, algorithm_of

_MESSAGES = {"collector": CollectorTask, "learner": LearnerTask}
_log = logging.getLogger(__name__)


class TaskError(MessageError):
    """A task that must not run: malformed, stale or a duplicate (names the task and the field).

    Raised before the task touches anything of its experiment, so it never reports events
    under its task id (that id may belong to a live task)."""


class StaleTask(TaskError):
    """The task's experiment is unknown, its run is not the current one, or its lease is gone."""


class DuplicateTask(TaskError):
    """Another job already runs this task id (its heartbeat key holds another owner)."""


@dataclass(frozen=True)
class TaskContext:
    """What a task's code needs, worked out once when the task is validated: the typed task, its
    run's namespace ``ns``, its config as this worker compiles it, the algorithm that config names
    and (from :func:`open_task`; None from :func:`validate_task`) the Redis the task came from."""

    task: CollectorTask | LearnerTask
    ns: str
    cfg: EasyDict
    algorithm: Algorithm
    conn: Optional[redis.Redis] = None

    @property
    def task_id(self) -> str:
        return self.task.task_id


def task_namespace(task: dict) -> str:
    """The Redis key namespace of the task's run (:func:`common.keys.namespace`), which is also
    where its logs go (``./{namespace}/log``)."""
    return keys.namespace(task["exp_name"], task.get("run_name", ""))


def validate_task(task: Any, kind: str) -> TaskContext:
    """Check every field of a task dict (type and value: :mod:`common.messages`), then recompile
    its config (so defaults of this worker's version apply). Nothing is read from or written to Redis.

    Returns:
        The task's context, without a connection.

    Raises:
        TaskError: not a dict, a missing/unknown field, a field of the wrong type or value, a wrong
            ``task_type``, a config whose ``exp_name`` differs from the task's, or a bad config.
    """
    if isinstance(task, dict) and task.get("task_type", kind) != kind:
        tid = task.get("task_id", "<no task_id>")
        raise TaskError(f"task {tid if isinstance(tid, str) else repr(tid)}: task_type {task.get('task_type')!r} "
                        f"sent to the {kind} job function", "task_type")
    try:
        typed = _MESSAGES[kind].from_dict(task)
    except MessageError as e:
        raise TaskError(str(e), e.field) from None
    tid, cfg = typed.task_id, typed.config
    try:
        compiled = compile_config({k: v for k, v in cfg.items() if k != "create"}, cfg.get("create"))
    except ConfigError as e:
        raise TaskError(f"task {tid}: bad config: {e}", "config") from None
    if compiled.exp_name != typed.exp_name:
        raise TaskError(f"task {tid}: field 'exp_name' = {typed.exp_name!r} differs from config.exp_name "
                        f"{compiled.exp_name!r}", "exp_name")
    algorithm = algorithm_of(compiled)
    if isinstance(typed, CollectorTask):
        try:  # what the settings mean is the algorithm's to check
            algorithm.check_setting(typed.collect_setting)
        except ValueError as e:
            raise TaskError(f"task {tid}: field 'collect_setting': {e}", "collect_setting") from None
    return TaskContext(task=typed, ns=typed.ns, cfg=compiled, algorithm=algorithm)


def open_task(task: Any, kind: str) -> TaskContext:
    """:func:`validate_task`, then the task's connection (:func:`task_connection`) and
    :func:`check_current`: what a job function does first.

    Raises:
        TaskError: as :func:`validate_task`; StaleTask: as :func:`check_current`.
    """
    ctx = validate_task(task, kind)
    ctx = replace(ctx, conn=task_connection(ctx.task.redis_url))
    check_current(ctx)
    return ctx


def task_connection(redis_url: Optional[str] = None) -> redis.Redis:
    """The Redis the task came from (the RQ job's server, with rqrl's retries), else the task's
    ``redis_url`` / $RQRL_REDIS_URL."""
    from rq import get_current_job

    from common.connection import with_retries

    job = get_current_job()
    if job is not None:
        return with_retries(job.connection)
    return connect(redis_url)


def check_current(ctx: TaskContext) -> None:
    """Refuse a task that may not run: unknown experiment, an earlier run, or no lease.

    Raises:
        StaleTask: naming the task and the reason (and the key that says so).
    """
    conn, exp, tid = ctx.conn, ctx.ns, ctx.task_id
    current = conn.get(keys.run(exp))
    if current is None:
        raise StaleTask(f"task {tid}: unknown run {exp!r} (no {keys.run(exp)}: no coordinator runs it)")
    if current.decode() != ctx.task.run_id:
        raise StaleTask(f"task {tid}: belongs to run {ctx.task.run_id!r} of {exp}; the current run is {current.decode()!r}")
    if not lease.held(conn, exp, tid):
        raise StaleTask(f"task {tid}: no lease ({keys.lease(exp, tid)}): it was never dispatched, or it was "
                        "declared dead and replaced")


@contextlib.contextmanager
def task_scope(ctx: TaskContext, failure_fields: Callable[[Exception], dict[str, Any]]) -> Iterator[None]:
    """The body of a job function: the task's heartbeat runs throughout (``commander.heartbeat_timeout``
    seconds of TTL), and an error is reported as a ``failed`` event of the task's kind naming it, with
    ``failure_fields(error)`` beside its text, then re-raised so RQ marks the job failed. A
    :class:`TaskError` is re-raised unreported: this process is not the task's runner. A write
    refused by a revoked lease (:class:`common.lease.LeaseRevoked`, or an error it caused) drops
    the task with one line on this worker's stderr first: the coordinator declared it dead while
    this process was frozen (SIGSTOP, swap, a long pause) and a replacement runs it."""
    conn, exp, task_id = ctx.conn, ctx.ns, ctx.task_id
    try:
        with Heartbeat(conn, exp, task_id, ctx.cfg.commander.heartbeat_timeout):
            yield
    except TaskError:
        raise
    except Exception as e:
        if revoked := _lease_revoked(e):
            _log.warning("task %s dropped: %s (it was declared dead while this process was stopped, and a "
                         "replacement runs it; nothing more of this one is written)", task_id, revoked)
        events.emit(conn, exp, "failed", task_id, ctx.task.KIND, error=f"{type(e).__name__}: {e}"[:2000],
                    **failure_fields(e))
        raise


def _lease_revoked(e: BaseException) -> Optional[lease.LeaseRevoked]:
    """The :class:`common.lease.LeaseRevoked` behind ``e`` (``e`` itself or a cause), else None."""
    seen: Optional[BaseException] = e
    while seen is not None and not isinstance(seen, lease.LeaseRevoked):
        seen = seen.__cause__
    return seen


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
