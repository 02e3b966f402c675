"""The run's records: the summary (``rqrl:{ns}:commander`` while the run goes, summary.json at its
end), curve.png drawn from evals.jsonl (coordinator/eval_log.py writes that), and the learner's
closing figures they take.

The run's last Redis writes go through :class:`BestEffort`: once Redis is full or lost the run,
the records are still written to the run folder.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, Optional

import redis
from easydict import EasyDict

from common import events, keys, phases, streams
from common.redis_memory import redis_full
from coordinator.commander_view import AtStop
from coordinator.eval_judge import final_eval
from coordinator.exports import FinalPt
from coordinator.resume import write_atomic

# The learner's closing figures summary.json keeps (as learner_*).
_LEARNER_FIGURES = ("wait_share", "train_iter_per_sec", "train_s", "sched_wait_share", "cpu_s", "pushed", "chunks",
                    "expired", "corrupt", "malformed", "redelivered", "trimmed", "stale_chunks", "stale_rows",
                    "policy_lag_mean", "policy_lag_p50", "policy_lag_p95", "policy_lag_max", "taken", "buffer_size",
                    "data_lag_mean", "data_lag_max")
# summary.json's ``stale_chunks_dropped``: chunks never trained on because they came too late, by
# cause -> the learner's figure that counts them (policy lag past max_policy_lag: the consume_once
# source; the step-data TTL ran out; trimmed from the buffer stream by its MAXLEN).
_DROPPED = {"policy_lag": "stale_chunks", "expired": "expired", "trimmed": "trimmed"}


def _hash_fields(fields: dict[str, Any]) -> dict[str, str]:
    """``fields`` as the summary hash's fields: scalars as :func:`common.streams.encode_fields`
    writes them, a list or dict (``data_shards``) as its JSON."""
    return streams.encode_fields({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in fields.items()})


class BestEffort:
    """Runs the Redis writes of the run's end: an OOM reply is logged, not raised (the run is
    ending). When ``redis_lost`` (Redis lost the run, or cannot be reached) every write is skipped.

    Args:
        log: the coordinator's logger.
        redis_lost: skip every write.
    """

    def __init__(self, log: logging.Logger, redis_lost: bool = False) -> None:
        self.log, self.redis_lost = log, redis_lost

    def __call__(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Call ``fn(*args, **kwargs)``; False when it was skipped or Redis was full (logged, naming ``what``).

        Raises:
            redis.ResponseError: any error reply other than Redis being full.
        """
        if self.redis_lost:
            return False
        try:
            fn(*args, **kwargs)
            return True
        except redis.ResponseError as e:
            if not redis_full(e):
                raise
            self.log.error("could not %s: %s", what, e)
            return False


class Records:
    """The summary and the curve of run ``ns``.

    Args:
        conn: Redis client.
        cfg: the compiled config (env.stop_value, env.env_id).
        ns: the run's namespace.
        out: the run folder.
        log: the coordinator's logger.
        done_fd: the write end of ``rqrl train``'s pipe, or None.
    """

    def __init__(self, conn: redis.Redis, cfg: EasyDict, ns: str, out: Path, log: logging.Logger,
                 done_fd: Optional[int] = None) -> None:
        self.conn, self.cfg, self.ns, self.out, self.log = conn, cfg, ns, out, log
        self._done_fd = done_fd
        self.learner_final: dict[str, Any] = {}  # the learner's closing figures, for summary.json
        self.learner_last = {"train_iter": 0, "envstep": 0}  # its train_iter and env steps when it finished

    def note_learner_finished(self, ev: dict[str, Any]) -> None:
        """Keep the figures of a learner's ``finished`` event (rank 0's) for summary.json."""
        self.learner_final = {k: ev[k] for k in _LEARNER_FIGURES if k in ev}
        self.learner_last = {"train_iter": int(ev.get("train_iter", 0)), "envstep": events.consumed_env_steps(ev)}

    def write_summary(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Write the summary of the moment (``fields``: flat scalars) for ``rqrl status``; returns it.

        Raises:
            redis.ResponseError: an OOM reply too (it is the first write refused once Redis is
                full, and stopping at once beats waiting for heartbeats to expire).
        """
        self.conn.hset(keys.commander(self.ns), mapping=_hash_fields(fields))
        return fields

    def write_end(self, fields: dict[str, Any], code: int, reason: str, at_stop: AtStop, final: FinalPt,
                  events_lost: str, writes: BestEffort) -> dict[str, Any]:
        """Write the run's last summary to Redis (through ``writes``) and to summary.json; returns it.

        ``fields`` are the summary's of the moment; the exit ``code`` and ``reason``, the figures
        ``at_stop`` (raised to the learner's last report), what ``final`` wrote, ``events_lost``
        (how unread events were found trimmed, "" if they were not), the learner's closing
        figures, the run's phases and which eval is final (``final_eval``, summary.json only:
        :func:`coordinator.eval_judge.final_eval`) are added.
        """
        curve = self._curve_to_draw()
        extra = dict(status=reason, exit_code=code, final_pt=str(final.path) if final.path else "",
                     stop_value=self.cfg.env.stop_value, curve_png=str(curve) if curve else "",
                     **self._stop_fields(at_stop))
        if final.path:
            extra["final_policy_version"] = final.policy_version
        extra.update({f"learner_{k}": v for k, v in self.learner_final.items()})
        if events_lost:
            extra["events_lost"] = events_lost
        summary = dict(fields, **extra)
        writes("write the summary to Redis", self.conn.hset, keys.commander(self.ns), mapping=_hash_fields(summary))
        summary["phases"] = self._phases_at_end(writes)
        summary["final_eval"] = final_eval(at_stop.last)  # a dict: not in the Redis hash
        summary["stale_chunks_dropped"] = {cause: int(self.learner_final.get(k) or 0) for cause, k in _DROPPED.items()}
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        return summary

    def _stop_fields(self, at_stop: AtStop) -> dict[str, Any]:
        """summary.json's figures at the stop; the learner reports its last ones after the stop,
        and the summary takes them (the progress line of ``rqrl train`` ends with its numbers).
        No eval yet, or none with a finished episode: None (null in summary.json), never 0."""
        best, last = at_stop.best, at_stop.last
        return {"envstep": max(at_stop.envstep, self.learner_last["envstep"]),
                "train_iter": max(at_stop.train_iter, self.learner_last["train_iter"]),
                "final_eval_task": at_stop.final_eval_task, "best_eval_reward_mean": best.get("reward_mean"),
                "best_policy_version": best.get("policy_version"), "last_eval_reward_mean": last.get("reward_mean"),
                "last_eval_policy_version": last.get("policy_version"), "last_eval_envstep": last.get("envstep"),
                "last_eval_policy_envstep": last.get("policy_envstep"), "policy_id": at_stop.policy_id,
                "buffer_id": at_stop.buffer_id}

    def _phases_at_end(self, writes: BestEffort) -> dict[str, float]:
        """Record phase ``final_pt`` (final.pt is written, summary.json is next) and return the
        run's phases for summary.json (common/phases.py); what Redis cannot give is left out."""
        if writes.redis_lost:
            return {}
        writes("record phase final_pt", phases.record, self.conn, self.ns, "final_pt")
        try:
            return phases.read(self.conn, self.ns)
        except redis.RedisError as e:
            self.log.warning("could not read the run's phases: %s", e)
            return {}

    def signal_done(self, code: int) -> None:
        """Tell ``rqrl train`` (``done_fd``) that summary.json and final.pt are written: the exit
        ``code``, then EOF. Once only; nothing to do without a pipe."""
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
        """Where :meth:`draw_curve` will draw curve.png after the summary, or None when it has
        nothing to draw (no eval in ``evals.jsonl``, or none that finished an episode)."""
        from coordinator.curve import evals_from_folder, without_reward

        if not (self.out / "evals.jsonl").is_file():
            return None
        try:
            points, _, _ = evals_from_folder(self.out)
        except Exception:  # noqa: BLE001 - draw_curve meets the same problem and logs it
            return None
        return self.out / "curve.png" if len(points) > without_reward(points) else None

    def draw_curve(self) -> Optional[Path]:
        """The run folder's ``curve.png``: eval reward against env steps and the run's wall clock,
        with the stop_value line, drawn from the run's ``evals.jsonl`` as ``rqrl curve`` draws it;
        None when there is nothing to draw or drawing failed (logged)."""
        from coordinator.curve import evals_from_folder, plot_curve, without_reward

        if not (self.out / "evals.jsonl").is_file():
            return None
        try:
            points, t0, _ = evals_from_folder(self.out)
            if len(points) == without_reward(points):
                return None  # no eval, or none that finished an episode: nothing to draw
            return plot_curve(points, float(self.cfg.env.stop_value), self.out / "curve.png", t0=t0,
                              title=f"{self.ns} ({self.cfg.env.env_id})")
        except Exception as e:  # a plotting problem must not turn a converged run into a failure
            self.log.warning("could not draw curve.png: %s", e)
            return None
