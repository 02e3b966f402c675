"""Event routing: each worker event goes to the part that owns what it changes.

A dict maps an event's ``type`` to its handler (``started``, ``learner_info``, ``scalars``,
``log``, ``finished``, ``failed``); events of unknown tasks (of an earlier run, or already
declared dead) and of unknown types are ignored, so a duplicate report (a task's own ``failed``
and RQ's ``on_failure`` callback) is harmless.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import redis

from common import keys, server_limits
from coordinator.commander import BaseCommander
from coordinator.eval_log import EvalLog
from coordinator.offload import write_shipped_log, write_shipped_scalars
from coordinator.task_table import TaskTable
from coordinator.wrapup import WrapUp

Handler = Callable[[dict[str, Any], dict[str, Any]], bool]


class EventRouter:
    """Routes the events of one run.

    Args:
        conn: Redis client; exp: the run's namespace (a task's heartbeat, the server's limits).
        tasks: the running tasks.
        commander: digests finished tasks and learner reports.
        eval_log: records finished evals.
        wrapup: keeps the learner's closing figures.
        tb: the run's TensorBoard writer (shipped scalars).
        out: the run folder (shipped log lines).
        clock: the run id and the run's wall seconds now.
        log: the coordinator's logger.
    """

    def __init__(self, conn: redis.Redis, exp: str, tasks: TaskTable, commander: BaseCommander, eval_log: EvalLog,
                 wrapup: WrapUp, tb: Any, out: Path, clock: Callable[[], tuple[str, float]],
                 log: logging.Logger) -> None:
        self.conn, self.exp, self.log = conn, exp, log
        self.tasks, self.commander, self.eval_log, self.wrapup = tasks, commander, eval_log, wrapup
        self.tb, self.out, self.clock = tb, out, clock
        self.fatal = ""  # why the run must end now (a task failed in a way a retry cannot fix)
        self._handlers: dict[str, Handler] = {
            "started": lambda ev, _: self.tasks.mark_started(ev["task_id"]) or False,
            "learner_info": self._on_learner_info,
            "scalars": lambda ev, _: write_shipped_scalars(self.tb, ev) or False,
            "log": lambda ev, _: write_shipped_log(self.out, ev) or False,
            "finished": self._on_finished,
            "failed": self._on_failed,
        }

    def route(self, ev: dict[str, Any]) -> bool:
        """Hand one parsed event (common/events.py) to its handler; True when the run converged.

        Raises:
            KeyError, ValueError, TypeError: the event lacks a field its handler needs, or holds a bad one.
        """
        entry = self.tasks.running.get(ev["task_id"])
        handler = self._handlers.get(ev["type"])
        return bool(handler(ev, entry)) if entry is not None and handler is not None else False

    def _on_learner_info(self, ev: dict[str, Any], _entry: dict[str, Any]) -> bool:
        self.commander.update_learner_info(ev["task_id"], ev)
        self.tasks.failures_in_a_row["learner"] = 0  # it trains
        return False

    def _on_finished(self, ev: dict[str, Any], entry: dict[str, Any]) -> bool:
        tid, kind = ev["task_id"], ev["task_type"]
        self.tasks.finish(tid, kind)
        if kind == "collector":
            converged = self.commander.finish_collector_task(tid, ev)
            if ev.get("eval_flag") is True:
                self.wrapup.bundles.add(tid)
                run_id, wall_seconds = self.clock()
                self.eval_log.add(ev, run_id, self.commander.total_envstep, wall_seconds)
            return converged
        if int(entry["task"].get("rank", 0)) != 0:
            return False  # rank 0 of a learner group reports for the group
        self.wrapup.note_learner_finished(ev)
        self.commander.finish_learner_task(tid, ev)
        return False

    def _on_failed(self, ev: dict[str, Any], _entry: dict[str, Any]) -> bool:
        tid, kind = ev["task_id"], ev["task_type"]
        if ev.get("source") == "rq_on_failure" and self.conn.exists(keys.heartbeat(self.exp, tid)):
            # RQ's verdict (e.g. its abandoned-job cleanup on a worker whose clock runs ahead)
            # never overrides a live task's fresh heartbeat; a real death stops the heartbeat.
            self.log.warning("RQ reported task %s failed (%s), but its heartbeat is fresh: ignored", tid,
                             ev.get("error", "?"))
            return False
        self.tasks.fail(tid, ev.get("error", "unknown error"))
        if ev.get("fatal") is True:  # a replacement would fail the same way (e.g. NaN weights)
            self.fatal = f"{kind} task {tid} failed: {ev.get('error', 'unknown error')}"
        elif limit := server_limits.explain(self.conn, str(ev.get("error", ""))):
            self.fatal = f"{kind} task {tid} failed: {limit}"
        return False
