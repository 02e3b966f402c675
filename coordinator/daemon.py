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
* exports.py writes best.pt as the run goes and final.pt at its end; records.py the summary
  (``rqrl status``'s while the run goes, summary.json at its end) and curve.png.
* :meth:`Coordinator._close` is the closing eval: a run that stops on a budget (``max_env_step``
  / ``max_train_iter`` / ``max_wall_seconds``, or SIGINT / SIGTERM) without having converged
  hands out no more training tasks and waits for one eval of the learner's newest policy
  version (:func:`wait_for_closing_eval`, at most ``commander.closing_eval_timeout`` seconds,
  10 when interrupted; 0 = none; none when ``rqrl train`` died, coordinator/lifeline.py; a
  further SIGINT / SIGTERM skips it), so its last eval record is at the budget. It does not
  turn the exit into a convergence (eval_judge.EvalJudge.judge); an eval already running when
  the budget came finishes first and may.
* :meth:`Coordinator._finish` is the stop sequence: stop flag, the learner's last report
  (``commander.finish_timeout``), final.pt, summary.json, the closing lines, curve.png, teardown.
  Exit 0 on convergence, 2 when ``max_env_step`` / ``max_train_iter`` / ``max_wall_seconds``
  pass first, 1 on an error, 130 on SIGINT / SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import redis
from easydict import EasyDict

from common import events, keys, lease, server_limits, streams
from common.logs import build_logger, build_tb_writer
from common.redis_memory import oom_reason, redis_full
from common.data_shards import SHARDS_EVERY_S, DataShards, ShardWatch, StoreGroup, run_stores
from coordinator import closing, lifeline
from coordinator.collect_setting import SettingPublisher
from coordinator.commander import BaseCommander, create_commander
from coordinator.commander_view import CommanderView
from coordinator.clocks import WorkerClocks
from coordinator.episode_log import EpisodeLog
from coordinator.errors import CoordinatorError, RunLost
from coordinator.eval_judge import ClosingEval, closing_eval_seconds
from coordinator.eval_log import EvalLog
from coordinator.exports import Exports, FinalPt
from coordinator.failover import FailoverWatch
from coordinator.event_reader import Entries, EventReader
from coordinator.liveness import Liveness, WorkerCount, live_workers
from coordinator.offload import DeferredScalars, offload_logging
from coordinator.ownership import Ownership, pick_run_name
from coordinator.records import BestEffort, Records
from coordinator.resume import ResumePoint
from coordinator.router import EventRouter
from coordinator.runs import link_latest, link_tensorboard
from coordinator.task_table import TaskTable
from coordinator.timers import Timers

__all__ = ["Coordinator", "CoordinatorError", "live_workers"]

_TRIM_EVERY_S = 5.0
# How often the collector workers are counted (two round trips), so a worker that joins gets a
# task within about a second without the registry being read on every pass of the loop.
_WORKERS_EVERY_S = 0.5
# How often the collect setting is recomputed (and written when it changed): the bound on how
# stale a collector's setting can be, beside one loop pass (at most 0.5 s of blocking read).
_SETTING_EVERY_S = 0.2

EXIT_CONVERGED, EXIT_ERROR, EXIT_LIMIT, EXIT_INTERRUPTED = 0, 1, 2, 130

# Redis when the run stops: "up", "full" (it answered OOM: the wrap-up is best effort and does
# not wait long), or "lost" (it lost the run or cannot be reached: the wrap-up writes the run
# folder from memory only).
RedisAtStop = Literal["up", "full", "lost"]


def stop_reason(cfg: EasyDict, commander: BaseCommander, tasks: TaskTable, converged: bool,
                wall_seconds: float) -> Optional[tuple[int, str]]:
    """The exit code and reason when the run must stop now, else None: it ``converged``, tasks
    failed ``commander.max_task_failures`` times in a row, or a budget (``max_env_step``,
    ``max_train_iter``, ``max_wall_seconds`` against the run's ``wall_seconds``) is spent."""
    c = cfg.commander
    if converged:
        last = commander.last_eval or {}
        return EXIT_CONVERGED, (f"converged: eval reward_mean {last.get('reward_mean', 0):.2f} "
                                f">= stop_value {cfg.env.stop_value}")
    worst = max(tasks.failures_in_a_row.values())
    if c.max_task_failures and worst >= c.max_task_failures:
        return EXIT_ERROR, (f"{worst} tasks failed in a row (commander.max_task_failures); "
                            f"last error: {tasks.last_failure}")
    if c.max_env_step and commander.total_envstep >= c.max_env_step:
        return EXIT_LIMIT, f"max_env_step {c.max_env_step} reached without convergence"
    if c.max_train_iter and commander.train_iter >= c.max_train_iter:
        return EXIT_LIMIT, f"max_train_iter {c.max_train_iter} reached without convergence"
    if c.max_wall_seconds and wall_seconds >= c.max_wall_seconds:
        return EXIT_LIMIT, f"max_wall_seconds {c.max_wall_seconds} passed without convergence"
    return None


def raise_stop_flag(conn: redis.Redis, exp: str, running: list[str], reason: str, writes: BestEffort) -> None:
    """Set run ``exp``'s stop flag to ``reason``; when Redis refuses it, revoke the leases of the
    ``running`` task ids instead (DEL needs no memory: without their leases the tasks stop at
    their next write)."""
    if not writes("set the stop flag", conn.set, keys.stop(exp), reason) and running and not writes.redis_lost:
        lease.revoke(conn, exp, *running)


def finish_timeout(cfg: EasyDict, code: int, redis_at_stop: RedisAtStop) -> float:
    """Seconds the stop waits for the learner's last report: ``commander.finish_timeout``, at
    most 10 when interrupted or Redis is full, none when Redis lost the run (no learner can
    report through it)."""
    if redis_at_stop == "lost":
        return 0.0
    timeout = float(cfg.commander.finish_timeout)
    return min(timeout, 10.0) if code == EXIT_INTERRUPTED or redis_at_stop == "full" else timeout


def wait_for_closing_eval(closing: ClosingEval, step: Callable[[], bool], timeout: float,
                          skipped: Callable[[], bool], clock: Callable[[], float] = time.monotonic) -> str:
    """Run ``step`` (one pass of dispatching and routing events; True when the run converged)
    while the ``closing`` eval is pending, for at most ``timeout`` seconds of ``clock``.

    Returns:
        How it ended: "over" (it finished, and was recorded, or failed: the log says which),
        "converged" (an eval that was running when the budget came converged the run),
        "skipped" (``skipped()`` turned true: a further signal, or a fatal event) or "timed out".
    """
    deadline = clock() + timeout
    while closing.pending:
        if skipped():
            return "skipped"
        if clock() >= deadline:
            return "timed out"
        if step():
            return "converged"
    return "over"


class RunParts:
    """The parts of one run (see module docstring), wired, and what is written of them all at
    once: the coordinator's state (:meth:`_persist`) and the summary for ``rqrl status``.
    :class:`Coordinator` drives them.

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
        data: the run's data shards (common/data_shards.py); None: step data on ``conn``.

    Raises:
        CoordinatorError: ``resume`` without ``run_name``, or with ``fresh``.
    """

    def __init__(self, cfg: EasyDict, conn: redis.Redis, out_dir: Path | str = ".", fresh: bool = False,
                 run_name: Optional[str] = None, resume: bool = False, started_at: Optional[float] = None,
                 done_fd: Optional[int] = None, data: Optional[DataShards] = None) -> None:
        if resume and (fresh or not run_name):
            raise CoordinatorError("resuming needs the run's name and excludes --fresh")
        self.cfg = cfg
        self.fresh = fresh
        self.resume_from_disk = resume
        self.conn = conn
        self.data = data
        self._buffer_ids: set[str] = set()  # every buffer the run had (summary.json's data_shards)
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
        self.tasks = TaskTable(conn, self.exp, cfg, self.commander, self.log, data_shards=len(data) if data else 0)
        self.ownership = Ownership(conn, self.exp, self.name, self.log, data)
        self.resume_point = ResumePoint(conn, self.exp, self.out, int(cfg.seed), self.commander, data)
        self.liveness = Liveness(conn, self.exp, cfg.commander.heartbeat_timeout, self.tasks.snapshot, self.log)
        self.event_reader = EventReader(conn, self.exp, self.name, self.log)
        self.eval_log = EvalLog(conn, self.exp, self.out, cfg.env.stop_value)
        self.episode_log = EpisodeLog(self.out)
        self.view = CommanderView(self.commander)  # what the exports and the stop sequence read of it
        self.exports = Exports(conn, cfg, self.exp, self.out, self.view, self.log)
        self.records = Records(conn, cfg, self.exp, self.out, self.log, done_fd)
        self.failover = FailoverWatch(conn, self.log)
        self.router = EventRouter(conn, self.exp, self.tasks, self.commander, self.eval_log, self.exports,
                                  self.records, self.tb, self.out, lambda: (self.run_id, time.time() - self.t0),
                                  self.log, episodes=self.episode_log)
        self.clocks = WorkerClocks()  # workers whose clocks are off Redis's
        self.workers = WorkerCount(conn, self.tasks.queues["collector"], self.commander, self.log)
        self.setting = SettingPublisher(conn, self.exp, self.commander)
        self.rejections: Optional[server_limits.RejectionWatch] = None  # from run()
        self._signal: Optional[int] = None
        self._signals = 0  # SIGINT / SIGTERM received: one more during the closing eval skips it
        self.shard_watch = ShardWatch(data, self.log) if data else None
        self.resumed = False

    def _persist(self, pipe: redis.client.Pipeline) -> redis.client.Pipeline:
        """Queue the coordinator's state (commander state, run id and clock, failures in a row, the
        last event read, the exports' state), new eval results and the changed task records on
        ``pipe`` (a MULTI pipeline)."""
        state = {"commander": self.commander.state_dict(), "run_id": self.run_id, "t0": self.t0,
                 "failures_in_a_row": self.tasks.failures_in_a_row, "last_event_id": self.event_reader.last_id,
                 **self.exports.state_dict()}
        pipe.hset(keys.commander(self.exp), "state", json.dumps(state))
        self.commander.redis_writes(pipe)
        self.eval_log.persist(pipe)
        return self.tasks.persist(pipe)

    def _summary_fields(self) -> dict[str, Any]:
        """The summary's fields of the moment: the commander's, the run's identity and wall seconds."""
        return dict(self.commander.summary(), exp_name=self.exp_name, run_name=self.run_name, run_id=self.run_id,
                    coordinator=self.name, collector_workers=self.workers.count,
                    wall_seconds=round(time.time() - self.t0, 2), **self.failover.summary_fields(),
                    **self.episode_log.summary_fields(),
                    **({"worker_clock_skew": self.clocks.summary()} if self.clocks.skewed else {}),
                    **self._shard_fields())

    def _shard_fields(self) -> dict[str, Any]:
        """``data_shards``: per data shard, its redacted URL, chunks and bytes (none without shards)."""
        if not self.data:
            return {}
        self._buffer_ids |= {p.buffer_id for p in self.commander.players() if p.buffer_id}
        return {"data_shards": self.data.totals(self.exp, sorted(self._buffer_ids))}

    def _cancel_queued(self) -> None:
        """Cancel the queued tasks and write the table (their spaces are free again)."""
        self.tasks.cancel_queued()
        self._persist(self.conn.pipeline(transaction=True)).execute()

    def watch_shards(self, timers: Timers, reasons: list[str]) -> None:
        """Poll the data shards' watch on ``timers``: a dead shard adds the reason to stop to ``reasons``."""
        if self.shard_watch is not None:
            watch = self.shard_watch
            timers.every(SHARDS_EVERY_S, lambda: reasons.extend(watch.poll()))

    def step_data(self, buffer_id: str = "") -> StoreGroup:
        """The run's step data (buffer ``buffer_id``'s) on the control Redis or on every data shard."""
        return StoreGroup(run_stores(self.conn, self.data, self.exp, buffer_id))

    def _write_summary(self) -> dict[str, Any]:
        """The summary of the moment for ``rqrl status`` (an OOM reply is raised: the run stops)."""
        return self.records.write_summary(self._summary_fields())


class Coordinator(RunParts):
    """One experiment's control loop over its :class:`RunParts`: claim the run, loop until it
    must stop, then the stop sequence (:meth:`_finish`). Built as :class:`RunParts`."""

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
        self.exports.load_state_dict(state)
        self.resumed = True
        self.log.info("resuming run %s of %s: %d running tasks adopted, %d env steps, train iter %d", self.run_id,
                      self.exp, len(self.tasks.running), self.commander.total_envstep, self.commander.train_iter)
        for claimed in self.event_reader.reclaim():  # events the dead coordinator read but never acked
            self._handle_entries(claimed)
        self.event_reader.check_trimmed()

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
        self._write_summary()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signal = signum
        self._signals += 1

    def run(self) -> int:
        """Run the experiment to its end; returns the process exit code (see module docstring)."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        restore_logging = offload_logging(self.log)  # log lines are written by a thread
        try:
            code, reason, redis_at_stop = self._run_to_stop()
            # The wrap-up logs on this thread again, so its lines and the closing summary it
            # prints come out in order.
            restore_logging()
            self._finish(code, reason, redis_at_stop)
            return code
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            restore_logging()
            self._teardown()  # after an error no stop sequence followed (after one, a no-op)

    def _run_to_stop(self) -> tuple[int, str, RedisAtStop]:
        """Claim the run and loop until it must stop; returns (exit code, reason, Redis at the stop).

        Raises:
            redis.ResponseError: an error reply other than Redis being full.
        """
        try:
            # maxclients: named when it is hit; counted from before the claim, so that a
            # refusal while the run starts counts too.
            self.rejections = server_limits.RejectionWatch(self.conn)
            self._claim()
            if not self.resumed:
                self.log.info("experiment %s run %s started (stop_value %s)", self.exp, self.run_id,
                              self.cfg.env.stop_value)
            code, reason = self._close(*self._loop())
            return code, reason, "up"
        except redis.ResponseError as e:
            if not redis_full(e):
                raise
            return EXIT_ERROR, self._out_of_memory(), "full"
        except RunLost as e:
            return EXIT_ERROR, str(e), "lost"
        except (redis.ConnectionError, redis.TimeoutError) as e:  # still, after the client's retries (~15 s)
            return EXIT_ERROR, f"Redis unreachable: {type(e).__name__}: {e}", "lost"

    def _loop(self) -> tuple[int, str]:
        """Dispatch, route events and apply deaths until the run must stop; returns (exit code, reason)."""
        workers = Timers()
        workers.every(_WORKERS_EVERY_S, self.workers.poll)
        timers = Timers(clock=time.time)
        timers.every(_SETTING_EVERY_S, self.setting.publish)
        timers.every(1.0, self.ownership.keep_alive)
        timers.every(1.0, self._write_summary)  # for rqrl status
        timers.every(1.0, lambda: self.resume_point.save(self.run_id, self.t0))
        timers.every(_TRIM_EVERY_S, lambda: self.event_reader.trim(time.time()))
        rejected: list[str] = []

        def check_limits() -> None:
            if self.rejections is not None and (reason := self.rejections.reason()):
                rejected.append(reason)

        timers.every(_TRIM_EVERY_S, check_limits)
        self.watch_shards(timers, rejected)
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

    def _close(self, code: int, reason: str) -> tuple[int, str]:
        """The closing eval (module docstring; none once rqrl train is gone: its workers stop too)
        when the run stops with ``code`` on a budget; returns the stop sequence's code and reason."""
        timeout = 0.0 if lifeline.broken() else closing_eval_seconds(self.cfg, code == EXIT_INTERRUPTED)
        closing = self.commander.begin_closing() if code in (EXIT_LIMIT, EXIT_INTERRUPTED) and timeout > 0 else None
        if closing is None:
            return code, reason
        self._cancel_queued()  # training tasks that did not start: the closing eval goes next
        self.log.info("%s: closing eval (at most %g s; a further SIGINT / SIGTERM skips it)", reason, timeout)
        signals, timers = self._signals, Timers(clock=time.time)
        for every_second in (self.ownership.keep_alive, self._write_summary, self._check_liveness):
            timers.every(1.0, every_second)

        def step() -> bool:
            timers.poll()
            self._dispatch()
            return self._process_events(block_ms=250)

        outcome = wait_for_closing_eval(closing, step, timeout,
                                        lambda: self._signals > signals or bool(self.router.fatal))
        self.log.info("closing eval: %s", outcome)
        if self.router.fatal:
            return EXIT_ERROR, self.router.fatal
        if outcome == "converged":
            return stop_reason(self.cfg, self.commander, self.tasks, True, 0.0) or (code, reason)
        return code, reason

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
        self.exports.export_best()
        self.exports.prune_bundles()
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
    def _out_of_memory(self) -> str:
        """Redis refused a write (OOM, noeviction): the run stops. Step data is dropped first (the
        stopping learner will not read it), so the stop flag, the learner's final checkpoint and
        RQ's own bookkeeping find room again. Returns the reason."""
        reason = oom_reason(self.conn)
        self.log.error("%s: stopping the run; dropping its step data to make room", reason)
        self.step_data().drop_blobs()
        if not BestEffort(self.log)("set the stop flag", self.conn.set, keys.stop(self.exp), reason):
            # Still full: the buffer's metadata stream goes too (the learner then ends on its error).
            self.step_data(self.commander.players()[0].buffer_id or "none").drop_stream()
        return reason

    def _finish(self, code: int, reason: str, redis_at_stop: RedisAtStop = "up") -> None:
        """The stop sequence: the stop flag, the learner's last report, the resume point,
        final.pt, summary.json, the closing lines on stdout, the exit ``code`` to ``rqrl train``,
        curve.png, then the teardown (whatever failed before it). Redis writes are best effort
        (:class:`coordinator.records.BestEffort`); none is tried once Redis lost the run."""
        try:
            self.log.info("stopping: %s", reason)
            writes = BestEffort(self.log, redis_lost=redis_at_stop == "lost")
            # The learner's finish resets the commander's run state (as the seed); keep the figures.
            at_stop = self.view.at_stop()
            resume_state = self.commander.state_dict()  # what --resume continues from (with the last checkpoint)
            raise_stop_flag(self.conn, self.exp, list(self.tasks.running), reason, writes)
            writes("cancel queued tasks", self._cancel_queued)
            # A full Redis refuses heartbeats too: missing ones then say nothing about the workers.
            self._wait_for_learner(finish_timeout(self.cfg, code, redis_at_stop), redis_at_stop != "full", writes)
            writes("copy the last checkpoint to the run folder", self.resume_point.save, self.run_id, self.t0,
                   resume_state)
            try:
                final = self.exports.export_final(at_stop, redis_lost=writes.redis_lost)
            except Exception as e:  # noqa: BLE001 - summary.json and the closing lines matter more
                self.log.error("could not export final.pt: %s: %s", type(e).__name__, e)
                final = FinalPt()
            summary = self.records.write_end(self._summary_fields(), code, reason, at_stop, final,
                                             self.event_reader.lost, writes)
            print(closing.render(summary), flush=True)
            self.records.signal_done(code)
            if summary["curve_png"]:  # after the summary: rqrl train does not wait for the plot
                self.records.draw_curve()
        finally:
            self._teardown()

    def _wait_for_learner(self, timeout: float, check_liveness: bool, writes: BestEffort) -> None:
        """Route events (and, with ``check_liveness``, fail dead tasks) until no learner task
        runs, for at most ``timeout`` seconds."""
        deadline = time.time() + timeout
        liveness = Timers(clock=time.time)
        if check_liveness:
            liveness.every(1.0, lambda: writes("check task liveness", self._check_liveness))
        while any(e["kind"] == "learner" for e in self.tasks.running.values()) and time.time() < deadline:
            if not writes("read events", self._process_events, 250):
                time.sleep(0.25)  # Redis refuses writes: nothing to block on until it has room
            liveness.poll()

    def _teardown(self) -> None:
        """Close the TensorBoard writer and give the run up (its ownership lock); idempotent."""
        self.tb.close()
        self.ownership.release()
