"""Event routing: each worker event goes to the part that owns what it changes.

A dict maps an event's ``type`` to its handler (``started``, ``learner_info``, ``scalars``,
``log``, ``finished``, ``failed``; a collector's ``scalars`` event may carry its finished training
episodes too, for the episode log); events of unknown tasks (of an earlier run, or already
declared dead) and of unknown types are ignored, so a duplicate report (a task's own ``failed``
and RQ's ``on_failure`` callback) is harmless.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import redis

from common import keys, server_limits
from common.messages import CollectorFinish, LearnerFinish
from coordinator.commander import BaseCommander
from coordinator.episode_log import EpisodeLog, parse_episodes
from coordinator.eval_log import EvalLog
from coordinator.exports import Exports
from coordinator.offload import write_shipped_log, write_shipped_scalars
from coordinator.records import Records
from coordinator.task_table import TaskTable

Handler = Callable[[dict[str, Any], dict[str, Any]], bool]


class EventRouter:
    """Routes the events of one run.

    Args:
        conn: Redis client; exp: the run's namespace (a task's heartbeat, the server's limits).
        tasks: the running tasks.
        commander: digests finished tasks and learner reports.
        eval_log: records finished evals.
        exports: told of each finished eval (its bundle can be exported).
        records: keep the learner's closing figures.
        tb: the run's TensorBoard writer (shipped scalars).
        out: the run folder (shipped log lines).
        clock: the run id and the run's wall seconds now.
        log: the coordinator's logger.
        episodes: the run's training episodes (``episodes.jsonl``).
    """

    def __init__(self, conn: redis.Redis, exp: str, tasks: TaskTable, commander: BaseCommander, eval_log: EvalLog,
                 exports: Exports, records: Records, tb: Any, out: Path, clock: Callable[[], tuple[str, float]],
                 log: logging.Logger, *, episodes: EpisodeLog) -> None:
        self.conn, self.exp, self.log = conn, exp, log
        self.tasks, self.commander, self.eval_log = tasks, commander, eval_log
        self.exports, self.records = exports, records
        self.tb, self.out, self.clock = tb, out, clock
        self.episodes = episodes
        self.fatal = ""  # why the run must end now (a task failed in a way a retry cannot fix)
        self._handlers: dict[str, Handler] = {
            "started": lambda ev, _: self.tasks.mark_started(ev["task_id"]) or False,
            "learner_info": self._on_learner_info,
            "scalars": self._on_scalars,
            "log": lambda ev, _: write_shipped_log(self.out, ev) or False,
            "finished": self._on_finished,
            "failed": self._on_failed,
        }

    def route(self, ev: dict[str, Any]) -> bool:
        """Hand one parsed event (common/events.py) to its handler; True when the run converged.

        Raises:
            KeyError, ValueError, TypeError: the event lacks a field its handler needs, or holds a bad one
                (a finish info: :class:`common.messages.MessageError`, naming the field).
        """
        entry = self.tasks.running.get(ev["task_id"])
        handler = self._handlers.get(ev["type"])
        return bool(handler(ev, entry)) if entry is not None and handler is not None else False

    def _on_scalars(self, ev: dict[str, Any], _entry: dict[str, Any]) -> bool:
        episodes = parse_episodes(ev)  # checked first: a bad event writes neither
        write_shipped_scalars(self.tb, ev)
        self.episodes.add(ev["task_id"], episodes)
        return False

    def _on_learner_info(self, ev: dict[str, Any], _entry: dict[str, Any]) -> bool:
        self.commander.update_learner_info(ev["task_id"], ev)
        self.tasks.failures_in_a_row["learner"] = 0  # it trains
        return False

    def _on_finished(self, ev: dict[str, Any], entry: dict[str, Any]) -> bool:
        tid, kind = ev["task_id"], ev["task_type"]
        # Checked before anything changes: a malformed report leaves the task running, so the
        # liveness pass declares it dead (its heartbeat stops) and its space is freed and refilled.
        fin = CollectorFinish.from_dict(ev) if kind == "collector" else LearnerFinish.from_dict(ev)
        info = fin.to_dict()  # old wire names read as today's
        self.tasks.finish(tid, kind)
        if isinstance(fin, CollectorFinish):
            converged = self.commander.finish_collector_task(tid, info)
            if fin.eval_flag:
                self.exports.eval_finished(tid)
                run_id, wall_seconds = self.clock()
                self.eval_log.add(info, run_id, self.commander.total_envstep, wall_seconds)
            return converged
        if int(entry["task"].get("rank", 0)) != 0:
            return False  # rank 0 of a learner group reports for the group
        self.records.note_learner_finished(info)
        self.commander.finish_learner_task(tid, info)
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
