"""The run's records and its end: best.pt as the run goes, then stop, final.pt, summary.json and
the closing lines.

:class:`WrapUp` owns what only the end needs: the learner's closing figures, the figures at
the stop, whether Redis is full (the wrap-up is then best effort) and the pipe to ``rqrl
train``. It writes the summary (``rqrl:{exp}:commander``, every second while the run goes, and
summary.json at its end) from the fields the coordinator hands it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional

import redis
from easydict import EasyDict

from common import blobstore, events, keys, lease, phases, serialization, streams
from common.finite import NonFiniteError, check_arrays
from common.redis_memory import oom_reason, redis_full
from coordinator import closing
from coordinator.bundles import EvalBundles
from coordinator.commander import BaseCommander
from coordinator.resume import write_atomic
from coordinator.task_table import TaskTable
from coordinator.timers import Timers

EXIT_CONVERGED, EXIT_ERROR, EXIT_LIMIT, EXIT_INTERRUPTED = 0, 1, 2, 130

# The learner's closing figures summary.json keeps (as learner_*).
_LEARNER_FIGURES = ("wait_share", "train_iter_per_sec", "train_s", "sched_wait_share", "cpu_s", "pushed", "chunks",
                    "expired", "corrupt", "malformed", "redelivered", "stale_chunks", "stale_rows", "policy_lag_p50",
                    "policy_lag_p95", "policy_lag_max")


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


class WrapUp:
    """Exports and the end of run ``exp``.

    Args:
        conn: Redis client.
        cfg: the compiled config.
        exp: the run's namespace.
        out: the run folder.
        commander: read for the figures at the stop.
        tasks: the running tasks (the stop cancels the queued ones and waits for the learner).
        fields: the summary's fields of the moment (commander summary, run identity, wall seconds).
        log: the coordinator's logger.
        done_fd: the write end of ``rqrl train``'s pipe, or None.
    """

    def __init__(self, conn: redis.Redis, cfg: EasyDict, exp: str, out: Path, commander: BaseCommander,
                 tasks: TaskTable, fields: Callable[[], dict[str, Any]], log: logging.Logger,
                 done_fd: Optional[int] = None) -> None:
        self.conn, self.cfg, self.exp, self.out, self.commander = conn, cfg, exp, out, commander
        self.tasks, self.fields, self.log, self._done_fd = tasks, fields, log, done_fd
        self.learner_final: dict[str, Any] = {}  # the learner's closing figures, for summary.json
        self.learner_last = {"train_iter": 0, "envstep": 0}  # its train_iter and env steps when it finished
        self.best_written: Optional[str] = None  # the eval whose weights best.pt holds
        self.bundles = EvalBundles()  # eval bundles in Redis: pruned to what can still be exported
        self._oom = False  # Redis answered OOM: the wrap-up is best effort
        # Redis lost the run, or cannot be reached: the wrap-up writes the run folder from memory only.
        self.hands_off = False
        self._at_stop: dict[str, Any] = {}

    def note_learner_finished(self, ev: dict[str, Any]) -> None:
        """Keep the figures of a learner's ``finished`` event (rank 0's) for summary.json."""
        self.learner_final = {k: ev[k] for k in _LEARNER_FIGURES if k in ev}
        self.learner_last = {"train_iter": int(ev.get("train_iter", 0)), "envstep": events.consumed_env_steps(ev)}

    def export_best(self) -> None:
        """Keep ``best.pt`` = the best-evaluated weights so far (copied from what that eval played)."""
        best = self.commander.best_eval
        if not best or best.get("task_id") == self.best_written:
            return
        got = blobstore.get_versioned(self.conn, keys.evaluated_policy(self.exp, best["task_id"]))
        if got is None:
            return  # the eval task's blob is not there (an older worker version): nothing to copy
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out / "best.pt", got[1])
        self.best_written = best["task_id"]
        self.log.info("best.pt: policy version %s, eval reward_mean %.2f", best["policy_version"], best["reward_mean"])

    def prune_bundles(self) -> None:
        """Delete the eval bundles in Redis that nothing can export or replay any more."""
        self.bundles.prune(self.conn, self.exp, self.commander.eval_bundles_in_use)

    def out_of_memory(self) -> str:
        """Redis refused a write (OOM, noeviction): the run stops. Step data is dropped first (the
        stopping learner will not read it), so the stop flag, the learner's final checkpoint and
        RQ's own bookkeeping find room again. Returns the reason."""
        reason = oom_reason(self.conn)
        self.log.error("%s: stopping the run; dropping its step data to make room", reason)
        self._oom = True
        batch: list[bytes] = []
        for k in self.conn.scan_iter(match=keys.data_pattern(self.exp), count=1000):
            batch.append(k)
            if len(batch) >= 1000:
                self.conn.delete(*batch)
                batch.clear()
        if batch:
            self.conn.delete(*batch)
        if not self._best_effort("set the stop flag", self.conn.set, keys.stop(self.exp), reason):
            # Still full: the buffer's metadata stream goes too (the learner then ends on its error).
            self.conn.delete(keys.buffer_meta(self.exp, self.commander.summary()["buffer_id"] or "none"))
        return reason

    def _best_effort(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> bool:
        """Run a Redis write of the wrap-up; an OOM reply is logged, not raised (the run is ending).
        Skipped (False) once Redis lost the run or cannot be reached."""
        if self.hands_off:
            return False
        try:
            fn(*args, **kwargs)
            return True
        except redis.ResponseError as e:
            if not redis_full(e):
                raise
            self.log.error("could not %s: %s", what, e)
            return False

    def write_summary(self, running: bool = False, **extra: Any) -> dict[str, Any]:
        """Write the commander summary for ``rqrl status``. While ``running``, an OOM reply is
        raised (it is the first write refused once Redis is full, and stopping at once beats
        waiting for heartbeats to expire); in the wrap-up it is logged."""
        summary = dict(self.fields(), **extra)
        mapping = streams.encode_fields(summary)
        if running:
            self.conn.hset(keys.commander(self.exp), mapping=mapping)
        else:
            self._best_effort("write the summary to Redis", self.conn.hset, keys.commander(self.exp), mapping=mapping)
        return summary

    def finish(self, code: int, reason: str, pump: Callable[[int], bool], check_liveness: Callable[[], None],
               persist: Callable[[], None], save_resume_point: Callable[[dict[str, Any]], None],
               events_lost: str = "") -> None:
        """Stop the run and write its records: the stop flag, queued tasks cancelled, at most
        ``commander.finish_timeout`` seconds (10 s when interrupted or Redis is full) for the
        learner's last report while ``pump`` (the coordinator's event pass: block milliseconds
        -> converged) routes events and ``check_liveness`` fails dead tasks, then the resume
        point, final.pt, summary.json, the closing lines on stdout, the exit ``code`` to ``rqrl
        train``, and curve.png. ``persist`` writes the coordinator's state; ``events_lost`` says how
        unread events were found trimmed, if they were."""
        self.log.info("stopping: %s", reason)
        # The learner's finish resets the commander's run state (as the seed); keep the figures.
        cm = self.commander
        resume_state = cm.state_dict()  # what --resume continues from (with the learner's last checkpoint)
        last = cm.last_eval or {}
        final_task = cm.final_eval_task
        best = cm.best_eval
        # No eval yet, or none with a finished episode: None (null in summary.json), never 0.
        self._at_stop = {"envstep": cm.total_envstep, "train_iter": cm.train_iter,
                         "final_eval_task": final_task or "", "best_eval_reward_mean": best.get("reward_mean"),
                         "best_policy_version": best.get("policy_version"),
                         "last_eval_reward_mean": last.get("reward_mean"),
                         "last_eval_policy_version": last.get("policy_version"),
                         "last_eval_envstep": last.get("envstep"),
                         "last_eval_policy_envstep": last.get("policy_envstep"),
                         "policy_id": cm.summary()["policy_id"], "buffer_id": cm.summary()["buffer_id"]}
        running = self.tasks.running
        if not self._best_effort("set the stop flag", self.conn.set, keys.stop(self.exp), reason) and running \
                and not self.hands_off:
            # DEL needs no memory: without their leases the tasks stop at their next write.
            lease.revoke(self.conn, self.exp, *running)

        def cancel_queued() -> None:
            self.tasks.cancel_queued()
            persist()

        self._best_effort("cancel queued tasks", cancel_queued)
        timeout = float(self.cfg.commander.finish_timeout)
        if code == EXIT_INTERRUPTED or self._oom:
            timeout = min(timeout, 10.0)
        if self.hands_off:
            timeout = 0.0  # no learner can report through a Redis that lost the run
        deadline = time.time() + timeout
        liveness = Timers(clock=time.time)
        # A full Redis refuses heartbeats too: missing ones then say nothing about the workers.
        if not self._oom:
            liveness.every(1.0, lambda: self._best_effort("check task liveness", check_liveness))
        while any(e["kind"] == "learner" for e in self.tasks.running.values()) and time.time() < deadline:
            if not self._best_effort("read events", pump, 250):
                time.sleep(0.25)  # Redis refuses writes: nothing to block on until it has room
            liveness.poll()
        # The learner reports its last figures after the stop: the summary takes them (the progress
        # line of `rqrl train` ends with the summary's numbers).
        self._at_stop["train_iter"] = max(int(self._at_stop["train_iter"]), self.learner_last["train_iter"])
        self._at_stop["envstep"] = max(int(self._at_stop["envstep"]), self.learner_last["envstep"])
        self._best_effort("copy the last checkpoint to the run folder", save_resume_point, resume_state)
        final = self._export_final()
        learner = {f"learner_{k}": v for k, v in self.learner_final.items()}
        if events_lost:
            learner["events_lost"] = events_lost
        curve = self._curve_to_draw()
        summary = self.write_summary(status=reason, exit_code=code, final_pt=str(final) if final else "",
                                     stop_value=self.cfg.env.stop_value, curve_png=str(curve) if curve else "",
                                     **self._at_stop, **learner)
        summary["phases"] = self._phases_at_end()
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        print(closing.render(summary), flush=True)
        self._signal_done(code)
        if curve is not None:  # after the summary: rqrl train does not wait for the plot
            self._plot_curve()
    def _phases_at_end(self) -> dict[str, float]:
        """Record phase ``final_pt`` (final.pt is written, summary.json is next) and return the
        run's phases for summary.json (common/phases.py); what Redis cannot give is left out."""
        if self.hands_off:
            return {}
        self._best_effort("record phase final_pt", phases.record, self.conn, self.exp, "final_pt")
        try:
            return phases.read(self.conn, self.exp)
        except redis.RedisError as e:
            self.log.warning("could not read the run's phases: %s", e)
            return {}

    def _signal_done(self, code: int) -> None:
        """Tell ``rqrl train`` (``done_fd``) that summary.json and final.pt are written: the exit code, then EOF."""
        if self._done_fd is None:
            return
        try:
            os.write(self._done_fd, f"{code}\n".encode())
        except OSError:  # rqrl train is gone: nobody to tell
            pass
        finally:
            os.close(self._done_fd)
            self._done_fd = None

    def _curve_to_draw(self) -> Optional[Path]:
        """Where :meth:`_plot_curve` will draw curve.png after the summary, or None when it has
        nothing to draw (no eval in ``evals.jsonl``, or none that finished an episode)."""
        from coordinator.curve import evals_from_folder, without_reward

        if not (self.out / "evals.jsonl").is_file():
            return None
        try:
            points, _, _ = evals_from_folder(self.out)
        except Exception:  # noqa: BLE001 - _plot_curve meets the same problem and logs it
            return None
        return self.out / "curve.png" if len(points) > without_reward(points) else None

    def _plot_curve(self) -> Optional[Path]:
        """The run folder's ``curve.png``: eval reward against env steps and the run's wall clock,
        with the stop_value line, drawn from the run's ``evals.jsonl`` as ``rqrl curve`` draws it."""
        from coordinator.curve import evals_from_folder, plot_curve, without_reward

        if not (self.out / "evals.jsonl").is_file():
            return None
        try:
            points, t0, _ = evals_from_folder(self.out)
            if len(points) == without_reward(points):
                return None  # no eval, or none that finished an episode: nothing to draw
            return plot_curve(points, float(self.cfg.env.stop_value), self.out / "curve.png", t0=t0,
                              title=f"{self.exp} ({self.cfg.env.env_id})")
        except Exception as e:  # a plotting problem must not turn a converged run into a failure
            self.log.warning("could not draw curve.png: %s", e)
            return None

    def _final_from_best(self, path: Path) -> Optional[Path]:
        """``final.pt`` without Redis: a copy of ``best.pt`` when the best eval reached stop_value
        (best.pt holds exactly the weights that eval played), else none."""
        best = self.commander.best_eval
        stop_value, reward = self.cfg.env.stop_value, best.get("reward_mean")
        best_pt = self.out / "best.pt"
        if (stop_value is None or reward is None or reward < float(stop_value) or not best_pt.is_file()
                or best.get("task_id") != self.best_written):
            self.log.warning("no final.pt: Redis no longer holds the run's weights and no eval reached stop_value "
                             "(ckpt/latest.pth and resume.json remain for --resume)")
            return None
        write_atomic(path, best_pt.read_bytes())
        self._at_stop["final_policy_version"] = best.get("policy_version")
        self.log.warning("final.pt is best.pt (eval reward_mean %.2f >= stop_value %s, not confirmed): Redis no "
                         "longer holds the run", reward, stop_value)
        return path

    def _export_final(self) -> Optional[Path]:
        """Write ``final.pt`` (common/policy/export.py: the acting weights, algorithm, config and spaces).

        A converged run exports exactly the weights its passing (and confirming) eval played.
        Otherwise the learner's ``final_model`` checkpoint is copied byte for byte (no torch
        import here), or, if the learner never finished, the last published policy version.
        Weights of policy version 0 (the learner never trained: a run that failed at its start)
        are untrained and never exported.
        """
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "final.pt"
        if self.hands_off:
            return self._final_from_best(path)
        final_task = self._at_stop.get("final_eval_task")
        got = blobstore.get_versioned(self.conn, keys.evaluated_policy(self.exp, final_task)) if final_task else None
        if got is not None:
            path.write_bytes(got[1])
            self._at_stop["final_policy_version"] = int(got[0]["version"])
            return path
        got = blobstore.get_versioned(self.conn, keys.ckpt(self.exp, "final_model"))
        if got is not None and int(got[0]["version"]) > 0:
            path.write_bytes(got[1])
            self._at_stop["final_policy_version"] = int(got[0]["version"])
            return path
        policy_id = self._at_stop.get("policy_id", "")
        got = blobstore.get_versioned(self.conn, keys.policy(self.exp, policy_id)) if policy_id else None
        if got is None or int(got[0]["version"]) == 0:
            self.log.warning("no final.pt: %s", "the learner never trained (policy version 0): its weights are "
                             "untrained" if got is not None else "no evaluated policy, final checkpoint or published "
                             "policy to export")
            return None
        from common import spaces
        from common.policy import export

        weights = serialization.loads(got[1], what=keys.policy(self.exp, policy_id))
        try:
            check_arrays(weights, "final.pt")
        except NonFiniteError as e:
            self.log.error("not exporting: %s", e)
            return None
        bundle = export.from_weights(self.cfg, spaces.probe(self.cfg), weights, int(got[0]["version"]))
        self.log.warning("the learner left no final checkpoint; final.pt holds the last published policy version")
        path.write_bytes(export.to_bytes(bundle))
        self._at_stop["final_policy_version"] = int(got[0]["version"])
        return path
