"""The coordinator daemon: runs a commander, dispatches its tasks on RQ, digests worker events.

``python -m coordinator CONFIG --redis-url URL`` (coordinator/__main__.py) runs
:meth:`Coordinator.run`: a loop over parts that each own their state, wired here.

* ownership.py names the run (given, the newest unfinished one of this experiment and seed, or
  new) and owns it (``rqrl:{exp}:coordinator``, a lock with a TTL; ``{exp}`` =
  ``{exp_name}/{run_name}``). An unfinished run in Redis is adopted (commander state, running
  tasks, un-acked events); else what an earlier run left is cleared and a new run id stamped,
  or, with ``resume``, the run is restored from its folder (resume.py).
* task_table.py holds the tasks enqueued on RQ with their write leases; router.py routes the
  events read from ``rqrl:{exp}:events`` (event_reader.py). Coordinator state, task records and
  the events' acks go in one MULTI/EXEC: a crash neither loses nor double-counts an event.
* liveness.py finds dead tasks (heartbeat expired, RQ job gone before it started; on a thread)
  and counts the live collector workers that size the collector task space.
* resume.py copies each new learner checkpoint to the run folder with ``resume.json``.
* wrapup.py ends the run: stop flag, the learner's last report (``commander.finish_timeout``),
  final.pt, summary.json. Exit 0 on convergence, 2 when ``max_env_step`` / ``max_train_iter`` /
  ``max_wall_seconds`` pass first, 1 on an error, 130 on SIGINT / SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import redis
from easydict import EasyDict

from common import events, keys, server_limits, streams
from common.logs import build_logger, build_tb_writer
from common.redis_memory import redis_full
from coordinator.collect_setting import SettingPublisher
from coordinator.commander import BaseCommander, create_commander
from coordinator.clocks import WorkerClocks
from coordinator.errors import CoordinatorError, RunLost
from coordinator.bundles import EvalBundles
from coordinator.eval_log import EvalLog
from coordinator.failover import FailoverWatch
from coordinator.event_reader import Entries, EventReader
from coordinator.liveness import Liveness, WorkerCount, live_workers
from coordinator.offload import DeferredScalars, offload_logging
from coordinator.ownership import Ownership, pick_run_name
from coordinator.resume import ResumePoint
from coordinator.router import EventRouter
from coordinator.runs import link_latest, link_tensorboard
from coordinator.task_table import TaskTable
from coordinator.timers import Timers
from coordinator.wrapup import EXIT_ERROR, EXIT_INTERRUPTED, WrapUp, stop_reason

__all__ = ["Coordinator", "CoordinatorError", "live_workers"]

_TRIM_EVERY_S = 5.0
# How often the collector workers are counted (two round trips), so a worker that joins gets a
# task within about a second without the registry being read on every pass of the loop.
_WORKERS_EVERY_S = 0.5
# How often the collect setting is recomputed (and written when it changed): the bound on how
# stale a collector's setting can be, beside one loop pass (at most 0.5 s of blocking read).
_SETTING_EVERY_S = 0.2


class Coordinator:
    """One experiment's control loop (see module docstring).

    Args:
        cfg: the compiled config.
        conn: Redis client (bytes replies, as RQ needs).
        out_dir: where the run folder ``{exp_name}/{run_name}/`` (logs, final.pt, summary.json) is written.
        fresh: start a new run even if an unfinished one of this name is in Redis.
        run_name: the run's name; None picks one (module docstring).
        resume: continue run ``run_name``: from Redis when it is unfinished there, else from its
            run folder (:meth:`coordinator.resume.ResumePoint.restore`).
        started_at: unix seconds where the run's clock starts (``rqrl train`` passes its launch,
            so its progress line and summary.json count the same seconds); default now. A run
            resumed from its folder counts on from its earlier wall seconds.
        done_fd: the write end of a pipe (``rqrl train``): the exit code is written there and it is
            closed once summary.json and final.pt are written, before curve.png is drawn.

    Raises:
        CoordinatorError: ``resume`` without ``run_name``, or with ``fresh``.
    """

    def __init__(self, cfg: EasyDict, conn: redis.Redis, out_dir: Path | str = ".", fresh: bool = False,
                 run_name: Optional[str] = None, resume: bool = False, started_at: Optional[float] = None,
                 done_fd: Optional[int] = None) -> None:
        if resume and (fresh or not run_name):
            raise CoordinatorError("resuming needs the run's name and excludes --fresh")
        self.cfg = cfg
        self.fresh = fresh
        self.resume_from_disk = resume
        self.conn = conn
        self.exp_name = cfg.exp_name
        self.run_name = run_name or pick_run_name(conn, self.exp_name, int(cfg.seed), fresh)
        self.exp = keys.namespace(self.exp_name, self.run_name)  # every key of the run is under it
        self.out = Path(out_dir) / self.exp
        self.name = f"coordinator-{socket.gethostname()}-{os.getpid()}"
        self.run_id = uuid.uuid4().hex[:12]
        self.t0 = time.time() if started_at is None else float(started_at)
        self.log = build_logger(self.out / "log" / "commander", "coordinator", console=True)
        # The run's one TensorBoard event file: the commander's scalars and those the tasks ship
        # (common/logs.py), queued by the loop and written by a thread (coordinator/offload.py).
        self.tb = DeferredScalars(build_tb_writer(self.out / "tensorboard"))
        self.commander: BaseCommander = create_commander(cfg, tb_logger=self.tb, logger=self.log, run_id=self.run_id,
                                                         run_name=self.run_name)
        self.tasks = TaskTable(conn, self.exp, cfg, self.commander, self.log)
        self.ownership = Ownership(conn, self.exp, self.name, self.log)
        self.resume_point = ResumePoint(conn, self.exp, self.out, int(cfg.seed), self.commander)
        self.liveness = Liveness(conn, self.exp, cfg.commander.heartbeat_timeout, self.tasks.snapshot, self.log)
        self.event_reader = EventReader(conn, self.exp, self.name, self.log)
        self.eval_log = EvalLog(conn, self.exp, self.out, cfg.env.stop_value)
        self.wrapup = WrapUp(conn, cfg, self.exp, self.out, self.commander, self.tasks, self._summary_fields,
                             self.log, done_fd)
        self.failover = FailoverWatch(conn, self.log)
        self.router = EventRouter(conn, self.exp, self.tasks, self.commander, self.eval_log, self.wrapup, self.tb,
                                  self.out, lambda: (self.run_id, time.time() - self.t0), self.log)
        self.clocks = WorkerClocks()  # workers whose clocks are off Redis's
        self.workers = WorkerCount(conn, self.tasks.queues["collector"], self.commander, self.log)
        self.setting = SettingPublisher(conn, self.exp, self.commander)
        self.rejections: Optional[server_limits.RejectionWatch] = None  # from run()
        self._signal: Optional[int] = None
        self.resumed = False

    # ------------------------------------------------------------------ lifecycle
    def _claim(self) -> None:
        """Own the run and adopt it, restore it from its folder, or start it fresh."""
        start = self.ownership.claim(self.fresh, self.resume_from_disk)
        self.out.mkdir(parents=True, exist_ok=True)
        link_latest(self.out.parent, self.run_name)
        link_tensorboard(self.out.parent, self.run_name)
        if start == "adopt":
            self._adopt(self.ownership.saved_state or {})
            return
        if start == "from_folder":
            self.resume_point.files()  # refuse before clearing anything
        self.ownership.clear_run_keys()
        if start == "from_folder":
            self.run_id, self.t0, n_evals = self.resume_point.restore(self.t0)
            self.resumed = True
            self.log.info("resuming run %s of %s from %s: train iter %d, %d env steps, %d evals", self.run_id,
                          self.exp, self.out, self.resume_point.ckpt_on_disk, self.commander.total_envstep, n_evals)
        else:  # what an earlier run of this name left (as summary.json, which is rewritten)
            self.resume_point.forget()
        self.conn.set(keys.run(self.exp), self.run_id)
        self.conn.sadd(keys.runs(), self.exp)
        self.event_reader.ensure_group()
        self._persist(self.conn.pipeline(transaction=True)).execute()

    def _adopt(self, state: dict[str, Any]) -> None:
        """Adopt the unfinished run in Redis: commander state, running tasks, un-acked events."""
        self.commander.load_state_dict(state["commander"])
        self.run_id = state["run_id"]
        self.t0 = float(state["t0"])
        self.tasks.adopt(state.get("failures_in_a_row", {}))
        self.event_reader.last_id = str(state.get("last_event_id", ""))
        self.wrapup.best_written = state.get("best_written")  # the eval whose weights best.pt holds
        self.wrapup.bundles = EvalBundles(state.get("eval_bundles", ()))
        self.resumed = True
        self.log.info("resuming run %s of %s: %d running tasks adopted, %d env steps, train iter %d", self.run_id,
                      self.exp, len(self.tasks.running), self.commander.total_envstep, self.commander.train_iter)
        for claimed in self.event_reader.reclaim():  # events the dead coordinator read but never acked
            self._handle_entries(claimed)
        self.event_reader.check_trimmed()

    def _persist(self, pipe: redis.client.Pipeline) -> redis.client.Pipeline:
        """Queue the coordinator's state (commander state, run id and clock, failures in a row, the
        last event read), new eval results and the changed task records on ``pipe`` (a MULTI pipeline)."""
        state = {"commander": self.commander.state_dict(), "run_id": self.run_id, "t0": self.t0,
                 "failures_in_a_row": self.tasks.failures_in_a_row, "last_event_id": self.event_reader.last_id,
                 "best_written": self.wrapup.best_written, "eval_bundles": sorted(self.wrapup.bundles.stored)}
        pipe.hset(keys.commander(self.exp), "state", json.dumps(state))
        self.eval_log.persist(pipe)
        return self.tasks.persist(pipe)

    def _follow_failover(self) -> None:
        """After a Sentinel failover, write again what the promoted replica may lack.

        Replication is asynchronous: the old primary's last writes (~ms of them) may not have
        reached the replica. What this coordinator wrote it still holds and writes again: the
        ownership key, the run id, every running task's record and write lease, the commander
        state and the eval results (from the run folder's ``evals.jsonl``). Lost task events
        heal through liveness: a task whose ``finished`` was lost is declared dead when its
        heartbeat stops, and replaced.
        """
        if not self.failover.changed():
            return
        self.liveness.grace()  # heartbeats written during the failover were refused
        self.event_reader.after_failover()
        pipe = self.conn.pipeline(transaction=True)
        pipe.set(keys.run(self.exp), self.run_id)
        pipe.sadd(keys.runs(), self.exp)
        self.tasks.regrant(pipe)
        self.eval_log.rewrite(pipe)
        self._persist(pipe).execute()
        self.ownership.keep_alive()  # the ownership key: re-set, or taken back if it is gone
        self.wrapup.write_summary(running=True)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signal = signum

    def run(self) -> int:
        """Run the experiment to its end; returns the process exit code (see module docstring)."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        restore_logging = offload_logging(self.log)  # log lines are written by a thread
        try:
            try:
                # maxclients: named when it is hit; counted from before the claim, so that a
                # refusal while the run starts counts too.
                self.rejections = server_limits.RejectionWatch(self.conn)
                self._claim()
                if not self.resumed:
                    self.log.info("experiment %s run %s started (stop_value %s)", self.exp, self.run_id,
                                  self.cfg.env.stop_value)
                code, reason = self._loop()
            except redis.ResponseError as e:
                if not redis_full(e):
                    raise
                code, reason = EXIT_ERROR, self.wrapup.out_of_memory()
            except RunLost as e:
                code, reason, self.wrapup.hands_off = EXIT_ERROR, str(e), True
            except (redis.ConnectionError, redis.TimeoutError) as e:  # still, after the client's retries (~15 s)
                code, reason, self.wrapup.hands_off = EXIT_ERROR, f"Redis unreachable: {type(e).__name__}: {e}", True
            # The wrap-up logs on this thread again, so its lines and the closing summary it
            # prints come out in order.
            restore_logging()
            self._finish(code, reason)
            return code
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self.tb.close()
            restore_logging()
            self.ownership.release()

    def _loop(self) -> tuple[int, str]:
        """Dispatch, route events and apply deaths until the run must stop; returns (exit code, reason)."""
        workers = Timers()
        workers.every(_WORKERS_EVERY_S, self.workers.poll)
        timers = Timers(clock=time.time)
        timers.every(_SETTING_EVERY_S, self.setting.publish)
        timers.every(1.0, self.ownership.keep_alive)
        timers.every(1.0, lambda: self.wrapup.write_summary(running=True))  # for rqrl status
        timers.every(1.0, lambda: self.resume_point.save(self.run_id, self.t0))
        timers.every(_TRIM_EVERY_S, lambda: self.event_reader.trim(time.time()))
        rejected: list[str] = []

        def check_limits() -> None:
            if self.rejections is not None and (reason := self.rejections.reason()):
                rejected.append(reason)

        timers.every(_TRIM_EVERY_S, check_limits)
        self.liveness.start()
        try:
            while True:
                if self._signal is not None:
                    return EXIT_INTERRUPTED, f"interrupted by {signal.Signals(self._signal).name}"
                workers.poll()
                self._dispatch()
                converged = self._process_events(block_ms=500)
                if self.router.fatal:
                    return EXIT_ERROR, self.router.fatal
                self._apply_dead()
                self._follow_failover()
                self._dispatch()  # refill freed slots before the periodic work below
                timers.poll()
                if rejected:
                    return EXIT_ERROR, rejected[0]
                stop = stop_reason(self.cfg, self.commander, self.tasks, converged, time.time() - self.t0)
                if stop is not None:
                    return stop
        finally:
            self.liveness.stop()

    # ------------------------------------------------------------------ dispatch
    def _dispatch(self) -> None:
        """Enqueue every task the commander hands out, all in one MULTI/EXEC with their leases and
        the coordinator's state (so a burst of freed slots costs one round trip)."""
        pipe = None
        with self.tasks.enqueue_lock:
            for kind, getter in (("learner", self.commander.get_learner_task),
                                 ("collector", self.commander.get_collector_task)):
                while (task := getter()) is not None:
                    pipe = pipe or self.conn.pipeline(transaction=True)
                    self.tasks.enqueue(kind, task, pipe)
            if pipe is not None:
                self._persist(pipe).execute()

    # ------------------------------------------------------------------ events
    def _process_events(self, block_ms: int) -> bool:
        """Route the events that arrive within ``block_ms`` milliseconds; True when the run converged."""
        return self._handle_entries(self.event_reader.read(block_ms))

    def _handle_entries(self, entries: Entries) -> bool:
        if not entries:
            return False
        converged = False
        for entry_id, raw in entries:
            try:
                ev = events.parse(self.event_reader.stream, entry_id, raw)
                if skew := self.clocks.note(ev, entry_id):
                    self.log.warning("%s", skew)
                converged |= self.router.route(ev)
            except (streams.MalformedEntry, KeyError, ValueError, TypeError) as e:
                self.log.error("dropping bad event %s: %s", entry_id.decode(), e)
        # The state the events produced and their acks land together (exactly-once routing).
        pipe = self.conn.pipeline(transaction=True)
        self.event_reader.ack(pipe, entries)
        self._persist(pipe).execute()
        self.wrapup.export_best()
        self.wrapup.prune_bundles()
        return converged

    # ------------------------------------------------------------------ liveness
    def _apply_dead(self) -> None:
        """Fail the tasks the liveness pass found dead that still run (a task may have finished
        since), and persist the change in one transaction."""
        failed = False
        for tid, reason in self.liveness.drain():
            if tid in self.tasks.running:
                self.tasks.fail(tid, reason)
                failed = True
        if failed:
            self._persist(self.conn.pipeline(transaction=True)).execute()

    def _check_liveness(self) -> None:
        """The liveness pass on this thread, applied at once (the wrap-up, after the loop's thread stopped)."""
        self.liveness.check_now()
        self._apply_dead()

    # ------------------------------------------------------------------ ending
    def _summary_fields(self) -> dict[str, Any]:
        """The summary's fields of the moment: the commander's, the run's identity and wall seconds."""
        return dict(self.commander.summary(), exp_name=self.exp_name, run_name=self.run_name, run_id=self.run_id,
                    coordinator=self.name, collector_workers=self.workers.count,
                    wall_seconds=round(time.time() - self.t0, 2), **self.failover.summary_fields(),
                    **({"worker_clock_skew": self.clocks.summary()} if self.clocks.skewed else {}))

    def _finish(self, code: int, reason: str) -> None:
        self.wrapup.finish(code, reason, pump=self._process_events, check_liveness=self._check_liveness,
                           persist=lambda: self._persist(self.conn.pipeline(transaction=True)).execute(),
                           save_resume_point=lambda state: self.resume_point.save(self.run_id, self.t0, state),
                           events_lost=self.event_reader.lost)
