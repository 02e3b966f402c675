"""RQ callbacks (``on_failure``) that turn job failures into rqrl events.

RQ calls :func:`report_job_failure` when a job raises or times out (not when its work-horse
is SIGKILLed; the coordinator's heartbeat check covers that). The task's own ``failed``
event usually arrives first; the coordinator ignores the second report of the same task. A job
refused by :func:`workers.task.validate_task` / ``check_current`` / the heartbeat claim is not
reported: its task id may be a live task's.
"""

from __future__ import annotations

from typing import Any

from common import events


def report_job_failure(job: Any, connection: Any, exc_type: Any, exc_value: Any, traceback: Any) -> None:
    """Emit a ``failed`` event for the job's task, naming the exception."""
    from workers.task import TaskError, task_namespace

    task = job.args[0] if job.args else {}
    if not isinstance(task, dict) or not isinstance(task.get("exp_name"), str) or not isinstance(task.get("task_id"), str):
        return
    # Only the coordinator's own job for the task (job id = task id) speaks for it, and a task
    # refused before it ran (malformed, stale, a duplicate of a live id) says nothing about it.
    if job.id != task["task_id"] or (isinstance(exc_type, type) and issubclass(exc_type, TaskError)):
        return
    kind = task.get("task_type", "collector")
    if kind not in events.TASK_TYPES:
        return
    try:
        exp = task_namespace(task)
    except (ValueError, TypeError):
        return
    events.emit(connection, exp, "failed", task["task_id"], kind,
                error=f"{getattr(exc_type, '__name__', exc_type)}: {exc_value}"[:2000], source="rq_on_failure")
