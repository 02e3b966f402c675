"""The eval judge: the one stop rule, when an eval is due, and what a finished eval means.

:func:`reached_stop_value` is the only place ``env.stop_value`` is compared; the commander, the
eval log's phases and the wrap-up's final.pt fallback all call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from common import events
from coordinator.wire_state import NOT_STATE, WireState


def reached_stop_value(reward: Optional[float], stop_value: Optional[float]) -> bool:
    """Whether an eval's ``reward`` (a mean episode return; None: it finished no episode) reached
    the env's ``stop_value`` (None: the run has no target, nothing ever reaches it)."""
    return stop_value is not None and reward is not None and reward >= float(stop_value)


# The closing eval of an interrupted run (Ctrl-C, SIGTERM) waits at most this long, whatever
# commander.closing_eval_timeout says: whoever interrupts wants the run to end soon.
INTERRUPTED_CLOSING_EVAL_S = 10.0


def closing_eval_seconds(cfg: Any, interrupted: bool) -> float:
    """Seconds a run that stops on a budget waits for its closing eval (``cfg``: a compiled
    config): ``commander.closing_eval_timeout`` (0: no closing eval), at most
    :data:`INTERRUPTED_CLOSING_EVAL_S` when the budget is an ``interrupted`` run."""
    timeout = max(0.0, float(cfg.commander.closing_eval_timeout))
    return min(timeout, INTERRUPTED_CLOSING_EVAL_S) if interrupted else timeout


def final_eval(last: dict[str, Any]) -> Optional[dict[str, Any]]:
    """summary.json's ``final_eval``: which eval is the run's last record (``last``, a finished
    eval as :meth:`EvalJudge.judge` records it; empty before one): ``task_id``,
    ``policy_version``, ``envstep`` (env steps when it finished), ``reward_mean`` (None: it
    finished no episode) and ``closing`` (it was the closing eval at a budget); None without one."""
    if not last:
        return None
    return {"task_id": last.get("task_id"), "policy_version": last.get("policy_version"),
            "envstep": last.get("envstep"), "reward_mean": last.get("reward_mean"),
            "closing": bool(last.get("closing"))}


def eval_mark(now: float, train_iter: int, envstep: int) -> dict[str, Any]:
    """When an eval was last started: unix ``time`` (s), ``train_iter`` and ``envstep`` then."""
    return {"time": now, "train_iter": train_iter, "envstep": envstep}


@dataclass(frozen=True)
class EvalRules:
    """The eval settings of ``cfg.commander`` and ``cfg.env.stop_value`` (see common/config.py)."""

    interval: float  # seconds between evals (0: no time trigger)
    every_train_iter: int  # train iterations between evals (0: no such trigger)
    every_env_step: int  # env steps between evals (0: no such trigger)
    max_share: float  # the largest share of the time evals may take, in (0, 1]
    confirm_episodes: int  # fresh episodes of a confirmation eval (0: the first passing eval converges)
    confirm_margin_se: float  # standard errors a confirmation's reward_mean must clear stop_value by
    stop_value: Optional[float]

    @classmethod
    def of(cls, cfg: Any) -> "EvalRules":
        """The rules of a compiled config ``cfg``."""
        c = cfg.commander
        return cls(float(c.eval_interval), int(c.eval_every_train_iter), int(c.eval_every_env_step),
                   float(c.eval_max_share), int(c.confirm_eval_episodes), float(c.confirm_margin_se),
                   cfg.env.stop_value)


@dataclass
class ClosingEval:
    """The one eval a run that stops on a budget ends with (:meth:`EvalJudge.begin_closing`).

    Attributes:
        task_id: its eval task once handed out, else None.
        over: it finished (recorded) or failed.
    """

    task_id: Optional[str] = None
    over: bool = False

    @property
    def pending(self) -> bool:
        """Promised and neither finished nor failed: the coordinator waits for it."""
        return not self.over

    def ends(self, task_id: str) -> bool:
        """Eval task ``task_id`` finished or failed; True (and now over) when it is this one."""
        if task_id != self.task_id:
            return False
        self.over = True
        return True


@dataclass
class EvalJudge(WireState):
    """The eval history of the current learner, the best eval, and convergence.

    An eval that reaches stop_value converges the run, or, when ``confirm_eval_episodes`` > 0,
    is confirmed first: a second eval replays exactly its weights on that many fresh episodes
    and must clear stop_value by ``confirm_margin_se`` standard errors. An eval that finished no
    episode is recorded without a reward: never the best, never passing, and as a confirmation
    it fails. Once the run stops on a budget (:meth:`begin_closing`) the one eval due is the
    closing eval. Fields but ``rules`` / ``logger`` / ``closing`` are state, under their wire keys
    (an adopting coordinator reaches the budget again and closes anew).
    """

    rules: EvalRules = field(metadata=NOT_STATE)
    logger: Any = field(default=None, metadata=NOT_STATE)
    evaluator_info: list = field(default_factory=list)  # finished evals of the current learner, oldest first
    last_eval: dict = field(default_factory=lambda: eval_mark(0.0, 0, 0))  # when the last eval started
    # When the last eval ended and how long it ran (seconds): evals keep to eval_max_share.
    eval_spent: dict = field(default_factory=lambda: {"end": 0.0, "duration": 0.0})
    confirm: Optional[dict] = None  # the eval that passed, waiting for its confirmation: task_id, dispatched
    best: dict = field(default_factory=dict)  # task_id, reward_mean, policy_version, envstep
    final_task: Optional[str] = None  # the eval task whose weights the run converged with
    closing: Optional[ClosingEval] = field(default=None, metadata=NOT_STATE)

    def begin_closing(self) -> ClosingEval:
        """The run stops on a budget: from now on the one eval due is the closing eval (once)."""
        if self.closing is None:
            self.closing = ClosingEval()
        return self.closing

    def due(self, now: float, train_iter: int, envstep: int, eval_running: bool) -> bool:
        """Whether an eval task should start now: none is running, the learner trained, and the
        closing eval is not handed out yet, or (before a closing) a confirmation waits or a
        trigger (time, train iterations, env steps) fired within the eval time share."""
        r = self.rules
        if eval_running or train_iter == 0:
            return False
        if self.closing is not None:
            return self.closing.task_id is None
        if self.confirm is not None:
            return True
        spent = self.eval_spent
        if 0 < r.max_share < 1 and now < spent["end"] + spent["duration"] * (1 / r.max_share - 1):
            return False  # evals may take at most eval_max_share of the time (and so of a busy CPU)
        last = self.last_eval
        return bool((r.interval > 0 and now - last["time"] >= r.interval)
                    or (r.every_train_iter > 0 and train_iter - last["train_iter"] >= r.every_train_iter)
                    or (r.every_env_step > 0 and envstep - last["envstep"] >= r.every_env_step))

    def dispatch(self, task_id: str, mark: dict[str, Any]) -> Optional[str]:
        """Eval task ``task_id`` starts (``mark``: :func:`eval_mark` of now). Returns the eval task
        whose weights it must replay when it is a confirmation, else None (it plays the newest:
        the closing eval too)."""
        if self.closing is not None:
            self.closing.task_id = task_id
            return None
        if self.confirm is not None:
            self.confirm["dispatched"] = task_id
            return self.confirm["task_id"]
        self.last_eval = mark
        return None

    def drop(self, task_id: str) -> None:
        """Eval task ``task_id`` failed: a failed confirmation is dropped (the next passing eval asks
        again), a failed closing eval is over (the run stops without it)."""
        if self.closing is not None:
            self.closing.ends(task_id)
        if self.confirm is not None and self.confirm.get("dispatched") == task_id:
            self.confirm = None

    def judge(self, task_id: str, finished_task: dict, train_iter: int, envstep: int, now: float) -> bool:
        """Record finished eval ``task_id`` (finish info ``finished_task``, policy version
        ``train_iter``, ``envstep`` env steps so far, unix time ``now``); True when the run converged.

        The closing eval (:meth:`begin_closing`) is recorded, marked ``closing``, and may be the
        best, but never converges the run nor asks for a confirmation: the budget was spent
        first, and one unconfirmed eval is what ``confirm_eval_episodes`` exists to distrust; the
        run exits as a budget stop. An eval running when the budget came is judged as ever."""
        closing = self.closing is not None and self.closing.ends(task_id)
        if not finished_task.get("confirmation"):
            self.eval_spent = {"end": now, "duration": float(finished_task.get("duration") or 0.0)}
        reward = events.episode_figure(finished_task, "reward_mean")
        record = {k: v for k, v in finished_task.items() if k not in events.EPISODE_FIELDS}
        if reward is not None:
            record.update(reward_mean=reward, reward_std=events.episode_figure(finished_task, "reward_std") or 0.0)
        record.update(envstep=envstep, time=now, train_iter=train_iter, task_id=task_id)
        if closing:
            record["closing"] = True
        self.evaluator_info.append(record)
        if reward is not None and (not self.best or reward > self.best["reward_mean"]):
            self.best = {"task_id": task_id, "reward_mean": reward, "policy_version": train_iter,
                         "envstep": finished_task.get("policy_envstep", envstep)}
        if closing:
            self._log("closing eval of policy version %d: reward_mean %s at %d env steps", train_iter,
                      "-" if reward is None else f"{reward:.2f}", envstep)
            return False
        stop_value = self.rules.stop_value
        if self.confirm is not None and self.confirm.get("dispatched") == task_id:
            self.confirm = None
            if reward is None:
                self._log("confirmation eval of policy version %d finished no episode; training goes on", train_iter)
                return False
            n = max(1, int(finished_task.get("real_episode_count") or 1))
            bound = reward - self.rules.confirm_margin_se * float(record["reward_std"]) / math.sqrt(n)
            if not reached_stop_value(bound, stop_value):
                self._log("confirmation eval of policy version %d: reward_mean %.2f (%.2f after the margin) < "
                          "stop_value %s; training goes on", train_iter, reward, bound, stop_value)
                return False
        elif not reached_stop_value(reward, stop_value):
            return False
        elif self.rules.confirm_episodes > 0:
            self.confirm = {"task_id": task_id}
            self._log("eval of policy version %d: reward_mean %.2f >= stop_value %s; confirming on %d fresh episodes",
                      train_iter, reward, stop_value, self.rules.confirm_episodes)
            return False
        self._log("eval reward_mean %.2f >= stop_value %s: the experiment has converged", reward, stop_value)
        self.final_task = task_id
        return True

    def restart(self, now: float) -> None:
        """A new learner (the last one finished): its eval history starts empty, the triggers count from ``now``."""
        self.evaluator_info = []
        self.last_eval = eval_mark(now, 0, 0)

    def after_pause(self, clock_shift_s: float) -> None:
        """A resume ``clock_shift_s`` seconds later: eval times move with the clock (eval_interval
        counts run time); no eval of the old run is confirmed or final any more."""
        for ev in self.evaluator_info:
            ev["time"] = float(ev.get("time", 0.0)) + clock_shift_s
        self.last_eval["time"] = float(self.last_eval["time"]) + clock_shift_s
        self.confirm, self.final_task = None, None

    @property
    def bundles_in_use(self) -> set[str]:
        """Eval task ids whose stored bundles can still be exported or replayed: the best eval's
        (best.pt), the eval under confirmation's (the confirming task replays it) and the
        converged one's (final.pt)."""
        return {t for t in (self.best.get("task_id"), (self.confirm or {}).get("task_id"), self.final_task) if t}

    def _log(self, msg: str, *args: Any) -> None:
        if self.logger is not None:
            self.logger.info(msg, *args)
