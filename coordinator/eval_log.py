"""The run's eval history: ``rqrl:{exp}:evals`` in Redis and ``evals.jsonl`` in the run folder.

Every finished eval task becomes one :class:`common.messages.EvalRecord` (:func:`eval_record`);
:class:`EvalLog` holds the
new ones until the coordinator's next state write, which stores them in Redis and appends them
to the run folder's file in the same step, and records the eval phases (common/phases.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import redis

from common import events, keys, phases
from common.messages import EvalRecord
from coordinator.eval_judge import reached_stop_value

# Eval records kept in rqrl:{exp}:evals (newest; ~300 B each): the run folder's evals.jsonl has all.
_EVALS_KEPT = 2000


def eval_record(ev: dict[str, Any], run_id: str, envstep: int, wall_seconds: float) -> EvalRecord:
    """The record of one finished eval task (``rqrl:{exp}:evals``, ``evals.jsonl``) from its event.

    ``envstep`` (env steps collected so far) and ``wall_seconds`` (the run's wall clock: seconds
    since it started, pauses before a ``--resume`` not counted) are the coordinator's when it
    read the event; ``time`` is the coordinator's unix time at its receipt (one clock for the whole
    run, whatever the workers' clocks say). An eval that finished no episode has
    ``episodes`` 0 and no ``reward_mean`` / ``reward_std`` (never 0.0: there is no number).
    """
    reward = events.episode_figure(ev, "reward_mean")
    return EvalRecord(
        task_id=ev["task_id"], run_id=run_id, envstep=envstep, policy_version=ev.get("policy_version", 0),
        policy_envstep=ev.get("policy_envstep", 0), episodes=int(ev.get("real_episode_count") or 0),
        confirmation=ev.get("confirmation") is True, time=round(time.time(), 3), wall_seconds=round(wall_seconds, 3),
        reward_mean=reward, reward_std=None if reward is None else events.episode_figure(ev, "reward_std") or 0.0)


def read_lines(out: Path) -> list[str]:
    """The run folder ``out``'s ``evals.jsonl``, one JSON record a line (none when there is no file)."""
    evals = out / "evals.jsonl"
    return [ln for ln in evals.read_text().splitlines() if ln.strip()] if evals.is_file() else []


class EvalLog:
    """The eval history of run ``exp`` (folder ``out``), against the env's ``stop_value`` (None: no target)."""

    def __init__(self, conn: redis.Redis, exp: str, out: Path, stop_value: Optional[float]) -> None:
        self.conn, self.exp, self.out, self.stop_value = conn, exp, out, stop_value
        self._new: list[EvalRecord] = []  # eval results to store with the next persist

    def add(self, ev: dict[str, Any], run_id: str, envstep: int, wall_seconds: float) -> None:
        """Record a finished eval task's event (stored by the next :meth:`persist`) and its phases."""
        self._new.append(eval_record(ev, run_id, envstep, wall_seconds))
        self._note_phase(ev)

    def _note_phase(self, ev: dict[str, Any]) -> None:
        """Phases ``first_eval``, ``passing_eval`` (an eval reaching stop_value: the last one before
        the run converges is the one confirmed) and ``confirmation``, at this eval's receipt."""
        now, stop_value = time.time(), self.stop_value
        reward = events.episode_figure(ev, "reward_mean")  # None: the eval finished no episode
        pipe = self.conn.pipeline(transaction=False)
        phases.record(pipe, self.exp, "first_eval", now)
        if ev.get("confirmation") is True:
            phases.record(pipe, self.exp, "confirmation", now, first_only=False)
        elif reached_stop_value(reward, stop_value):
            phases.record(pipe, self.exp, "passing_eval", now, first_only=False)
        pipe.execute()

    def persist(self, pipe: redis.client.Pipeline) -> None:
        """Queue the new records on ``pipe`` and append them to ``evals.jsonl``."""
        if not self._new:
            return
        lines = [json.dumps(e.to_dict()) for e in self._new]
        pipe.rpush(keys.evals(self.exp), *lines)
        pipe.ltrim(keys.evals(self.exp), -_EVALS_KEPT, -1)  # evals.jsonl in the run folder keeps them all
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "evals.jsonl", "a") as f:
            f.writelines(line + "\n" for line in lines)
        self._new = []

    def rewrite(self, pipe: redis.client.Pipeline) -> None:
        """Queue ``rqrl:{exp}:evals`` rewritten from ``evals.jsonl`` on ``pipe`` (after a Redis failover)."""
        lines = read_lines(self.out)
        pipe.delete(keys.evals(self.exp))
        if lines:
            pipe.rpush(keys.evals(self.exp), *lines)
