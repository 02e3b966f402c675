"""Commanders: decide which collector / learner tasks run, and when the experiment is done.

The loop a commander serves (driven by coordinator/daemon.py)::

    while not converged:
        while (task := commander.get_learner_task()):   enqueue on RQ queue "learner"
        while (task := commander.get_collector_task()): enqueue on RQ queue "collector"
        for event in worker events:
            finished collector -> converged = commander.finish_collector_task(task_id, info)
            finished learner   -> commander.finish_learner_task(task_id, info)
            failed             -> commander.notify_fail_collector_task(task) / notify_fail_learner_task(task)
            learner_info       -> commander.update_learner_info(task_id, info)

:class:`SoloCommander` reproduces DI-engine's solo parallel commander, with these faults fixed
(each has a test in tests/unit/test_commander.py):

* ``finish_collector_task`` no longer swaps ``avg_time_per_episode`` and ``avg_step_per_episode``;
* evaluation triggers on train iterations and env steps as well as wall time, at most one eval
  task runs at a time, no eval runs before the learner has trained once, and an eval takes its
  own slot (``eval_task_space``) instead of waiting for a training task to free collector space;
* a failed learner task keeps its ``buffer_id`` / ``policy_id`` so its replacement resumes from
  the latest checkpoint instead of stranding the collectors; failed tasks are replaced simply
  because their space is released (the daemon asks for new tasks every loop);
* the learner-info history is bounded instead of growing for the whole run;
* env steps for the collect setting (an exploration schedule, say) also count the learner's
  live ``consumed_env_steps``, so long collector tasks do not freeze the schedule until they finish.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from typing import Any, Optional

from easydict import EasyDict

from common import events, keys
from common.config import to_plain
from common.policy import algorithm_of
from common.seeding import task_seed
from common.registry import COMMANDER_REGISTRY
from common.task_space import TaskSpace

_LEARNER_INFO_HISTORY = 100


def new_task_id(kind: str) -> str:
    """``{kind}_task_{16 hex chars}``: unique, and a valid RQ job id."""
    return f"{kind}_task_{uuid.uuid4().hex[:16]}"


class BaseCommander(ABC):
    """The commander seam (as the seed's BaseCommander): hand out tasks, digest their results.

    The coordinator calls the methods below and reads the properties; a subclass that lacks one
    cannot be built (``TypeError`` naming the missing members), so a second commander never
    silently produces no best.pt or final.pt.
    """

    @abstractmethod
    def get_collector_task(self) -> Optional[dict]:
        """A new collector task dict, or None when no collector task space is free."""

    @abstractmethod
    def get_learner_task(self) -> Optional[dict]:
        """A new learner task dict, or None when no learner task space is free."""

    @abstractmethod
    def finish_collector_task(self, task_id: str, finished_task: dict) -> bool:
        """Digest a finished collector task; True when the experiment has converged."""

    @abstractmethod
    def finish_learner_task(self, task_id: str, finished_task: dict) -> str:
        """Digest a finished learner task; returns its buffer_id."""

    @abstractmethod
    def notify_fail_collector_task(self, task: dict) -> None:
        """A collector task failed or died."""

    @abstractmethod
    def notify_fail_learner_task(self, task: dict) -> None:
        """A learner task failed or died."""

    @abstractmethod
    def update_learner_info(self, task_id: str, info: dict) -> None:
        """Record a learner progress report."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The commander's state as plain JSON values; the coordinator writes it with every
        transaction, and a restarted coordinator adopts it (:meth:`load_state_dict`)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""

    @abstractmethod
    def restore(self, state: dict[str, Any], clock_shift_s: float, train_iter: int, consumed_env_steps: int) -> None:
        """Load ``state`` (from the run folder's ``resume.json``) into a fresh Redis: no task of the
        old run is running, its times are moved by ``clock_shift_s`` seconds (the pause is not
        counted), and the learner resumes from a checkpoint at ``train_iter`` that had consumed
        ``consumed_env_steps`` env steps."""

    @abstractmethod
    def summary(self) -> dict[str, Any]:
        """Flat scalars (int, float, bool, str or None) for ``rqrl:{exp}:commander``, ``rqrl status``
        and summary.json. The coordinator reads ``collector_task_space``, ``policy_id`` and
        ``buffer_id`` (ids of the current learner's policy and buffer, "" when none) from it."""

    @property
    @abstractmethod
    def total_envstep(self) -> int:
        """Env steps collected so far (a running total)."""

    @property
    @abstractmethod
    def train_iter(self) -> int:
        """The learner's train iterations so far (= the newest policy version)."""

    @property
    @abstractmethod
    def last_eval(self) -> Optional[dict]:
        """The newest finished eval, or None before one: ``reward_mean`` (absent when it finished no
        episode), ``policy_version``, ``envstep``, ``policy_envstep``."""

    @property
    @abstractmethod
    def best_eval(self) -> dict:
        """The best eval so far (empty before one): ``task_id``, ``reward_mean``, ``policy_version``;
        the coordinator copies the weights that eval played to ``best.pt``."""

    @property
    @abstractmethod
    def eval_bundles_in_use(self) -> set[str]:
        """Eval task ids whose stored bundles (``rqrl:{exp}:task:{id}:evaluated``) can still be
        exported or replayed; the coordinator deletes the others."""

    @property
    @abstractmethod
    def final_eval_task(self) -> Optional[str]:
        """The eval task whose weights passed (and were confirmed), which final.pt exports; None
        until the run converges."""

    def follow_collector_workers(self, workers: int) -> None:
        """``workers`` collector workers are live (the coordinator calls this whenever the count
        changes). A commander with a fixed collector task space does not override it."""

    def collect_setting(self) -> dict[str, Any]:
        """The collect setting training collectors should act with now (plain JSON values). The
        coordinator writes it to ``rqrl:{exp}:collect_setting`` whenever it changes and collectors
        read it with every chunk, so a long task never acts on a stale one."""
        return {}


@COMMANDER_REGISTRY.register("solo")
class SoloCommander(BaseCommander):
    """DI-engine's solo parallel commander (one learner, N collectors), faults fixed (module docstring).

    Args:
        cfg: the full compiled config (common/config.py); ``cfg.commander`` holds task spaces,
            eval triggers and limits.
        tb_logger: optional SummaryWriter for the seed's ``collector_iter/...``,
            ``collector_step/...``, ``evaluator_iter/...``, ``evaluator_step/...`` scalars.
        run_id: stamped on every task so workers can drop tasks of an earlier run.
        run_name: the run's name, stamped on every task: workers build the run's key namespace
            from ``exp_name`` and it (:func:`common.keys.namespace`); "" = the experiment's own.
        clock: time source in seconds (injectable for tests).
    """

    def __init__(self, cfg: EasyDict, tb_logger: Any = None, logger: Any = None, run_id: str = "",
                 clock: Any = time.time, run_name: str = "") -> None:
        self._cfg = cfg
        self._exp_name = cfg.exp_name
        self._run_name = run_name
        self._ns = keys.namespace(cfg.exp_name, run_name)
        self._commander_cfg = cfg.commander
        self._run_id = run_id
        self._clock = clock
        # Until the coordinator reports the live collector workers (follow_collector_workers):
        # the cap when one is set, else one task.
        self._collector_task_space = TaskSpace(0, self._commander_cfg.collector_task_space or 1)
        self._learner_task_space = TaskSpace(0, self._commander_cfg.learner_task_space)
        self._learner_info: deque[dict] = deque([{"train_iter": 0}], maxlen=_LEARNER_INFO_HISTORY)
        self._evaluator_info: list[dict] = []
        self._total_collector_env_step = 0
        self._current_buffer_id: Optional[str] = None
        self._current_policy_id: Optional[str] = None
        self._resume_learner = False
        self._eval_in_flight: Optional[str] = None
        self._eval_own_slot = False  # the eval in flight holds the eval slot, not collector space
        self._last_eval = {"time": self._clock(), "train_iter": 0, "envstep": 0}
        # When the last eval ended and how long it ran (seconds): evals keep to eval_max_share.
        self._eval_spent = {"end": 0.0, "duration": 0.0}
        # An eval that passed, waiting for its confirmation eval ({"task_id", "dispatched"}).
        self._confirm: Optional[dict] = None
        self._best: dict = {}  # best eval so far: task_id, reward_mean, policy_version, envstep
        self._final_task: Optional[str] = None  # the eval task whose weights the run converged with
        self._algorithm = algorithm_of(cfg)  # torch-free: defaults and the collect setting
        self._tb_logger = tb_logger
        self._logger = logger
        self._end_flag = False
        self._seed_counter = 0
        # policy.learn.learner_num > 1: one learner task space holds a group of that many ranks
        # (workers/ddp.py), handed out one per call; a lost rank loses the whole group.
        self._learner_num = int(cfg.policy.learn.get("learner_num", 1))
        self._pending_ranks: list[dict] = []
        self._lost_group: Optional[str] = None
        self._task_config = to_plain(cfg)  # every task carries it; built once, never mutated

    # ------------------------------------------------------------------ task creation
    @property
    def total_envstep(self) -> int:
        """Env steps collected so far: finished collector tasks, or the learner's live count if larger."""
        return max(self._total_collector_env_step, events.consumed_env_steps(self._learner_info[-1]))

    @property
    def train_iter(self) -> int:
        return int(self._learner_info[-1].get("train_iter", 0))

    def _eval_due(self) -> bool:
        c = self._commander_cfg
        if self._eval_in_flight is not None or self.train_iter == 0:
            return False
        if self._confirm is not None:
            return True
        share = float(c.eval_max_share)
        if 0 < share < 1 and self._clock() < self._eval_spent["end"] + self._eval_spent["duration"] * (1 / share - 1):
            return False  # evals may take at most eval_max_share of the time (and so of a busy CPU)
        due_time = c.eval_interval > 0 and self._clock() - self._last_eval["time"] >= c.eval_interval
        due_iter = c.eval_every_train_iter > 0 and self.train_iter - self._last_eval["train_iter"] >= c.eval_every_train_iter
        due_step = c.eval_every_env_step > 0 and self.total_envstep - self._last_eval["envstep"] >= c.eval_every_env_step
        return bool(due_time or due_iter or due_step)

    def _next_seed(self) -> int:
        self._seed_counter += 1
        return task_seed(int(self._cfg.seed), self._seed_counter)

    def get_collector_task(self) -> Optional[dict]:
        """A collector or eval task when space is free and a learner exists, else None.

        An eval task takes the separate eval slot (``commander.eval_task_space`` > 0) instead of
        collector space, so evaluation never waits for a training task to finish.
        """
        if self._end_flag or self._current_buffer_id is None or self._current_policy_id is None:
            return None
        eval_flag = self._eval_due()
        own_slot = eval_flag and self._commander_cfg.eval_task_space > 0
        if not own_slot and not self._collector_task_space.acquire_space():
            return None
        task_id = new_task_id("collector")
        extra: dict[str, Any] = {}
        if eval_flag:
            self._eval_in_flight = task_id
            self._eval_own_slot = own_slot
            if self._confirm is not None:  # replay exactly the weights that passed, on fresh episodes
                self._confirm["dispatched"] = task_id
                extra = {"eval_policy_key": keys.evaluated_policy(self._ns, self._confirm["task_id"]),
                         "eval_episodes": int(self._commander_cfg.confirm_eval_episodes)}
            else:
                self._last_eval = {"time": self._clock(), "train_iter": self.train_iter, "envstep": self.total_envstep}
        return {**extra,
            "task_id": task_id,
            "task_type": "collector",
            "run_id": self._run_id,
            "exp_name": self._exp_name,
            **({"run_name": self._run_name} if self._run_name else {}),
            "buffer_id": self._current_buffer_id,
            "policy_id": self._current_policy_id,
            "eval_flag": eval_flag,
            "collect_setting": self.collect_setting(),
            "envstep": self.total_envstep,
            "seed": self._next_seed(),
            "config": self._task_config,
        }

    def get_learner_task(self) -> Optional[dict]:
        """A learner task when learner space is free, else None.

        A fresh run gets new ``policy_id`` / ``buffer_id``; the replacement of a failed learner
        reuses them and sets ``resume`` so it loads the ``latest`` checkpoint. With
        ``policy.learn.learner_num`` = N > 1 one space holds a group: N tasks with one new
        ``group_id``, ``rank`` 0..N-1 and ``world_size`` N, returned by N calls in a row.
        """
        if self._end_flag:
            return None
        if self._pending_ranks:
            return self._pending_ranks.pop(0)
        if not self._learner_task_space.acquire_space():
            return None
        resume = self._resume_learner and self._current_policy_id is not None
        if not resume:
            self._current_policy_id = f"policy_{uuid.uuid4().hex[:12]}"
            self._current_buffer_id = f"buffer_{uuid.uuid4().hex[:12]}"
        self._resume_learner = False
        task = {
            "task_id": new_task_id("learner"),
            "task_type": "learner",
            "run_id": self._run_id,
            "exp_name": self._exp_name,
            **({"run_name": self._run_name} if self._run_name else {}),
            "policy_id": self._current_policy_id,
            "buffer_id": self._current_buffer_id,
            "resume": resume,
            "seed": self._next_seed(),
            "config": self._task_config,
        }
        if self._learner_num == 1:
            return task
        group = {"group_id": f"group_{uuid.uuid4().hex[:12]}", "world_size": self._learner_num}
        ranks = [dict(task, **group, rank=0)] + [
            dict(task, **group, rank=r, task_id=new_task_id("learner"), seed=self._next_seed())
            for r in range(1, self._learner_num)]
        self._pending_ranks = ranks[1:]
        return ranks[0]

    # ------------------------------------------------------------------ results
    def finish_collector_task(self, task_id: str, finished_task: dict) -> bool:
        """Release the task's space, log its info; for an eval task, judge convergence.

        A task that finished no episode (``real_episode_count`` 0) has no per-episode figures
        (``reward_mean``, ``reward_std``, ``avg_step_per_episode``, ``avg_time_per_episode``:
        :data:`common.events.EPISODE_FIELDS`): they are absent from its info and from
        TensorBoard, never recorded as 0.

        Returns:
            True when an eval's ``reward_mean >= env.stop_value``: the run is over.
        """
        self._release_collector_slot(task_id)
        is_eval = bool(finished_task["eval_flag"])
        kind = "evaluator" if is_eval else "collector"
        train_iter = int(finished_task["policy_version"])  # the version the task acted with
        # The task's env steps; collectors before the glossary's names called them step_count.
        env_steps = int(finished_task["env_steps"] if "env_steps" in finished_task else finished_task["step_count"])
        figures = {name: events.episode_figure(finished_task, name) for name in events.EPISODE_FIELDS}
        figures["avg_time_per_step"] = events.figure(finished_task, "avg_time_per_step")
        info = {
            "train_iter": train_iter,
            "episode_count": int(finished_task.get("real_episode_count") or 0),
            "env_steps": env_steps,
            **{k: v for k, v in figures.items() if v is not None},
        }
        if not is_eval:
            self._total_collector_env_step += env_steps
        # Evals at INFO; a line per training task (thousands a minute with many collectors) at DEBUG.
        level = logging.INFO if is_eval else logging.DEBUG
        if self._logger is not None and self._logger.isEnabledFor(level):
            self._logger.log(level, "[%s] %s ends: %s", kind.upper(), task_id,
                             ", ".join(f"{k}={v}" for k, v in info.items()))
        if self._tb_logger is not None:
            for k, v in info.items():
                if k == "train_iter":
                    continue
                self._tb_logger.add_scalar(f"{kind}_iter/{k}", v, train_iter)
                self._tb_logger.add_scalar(f"{kind}_step/{k}", v, self.total_envstep)
        if is_eval:
            if not finished_task.get("confirmation"):
                self._eval_spent = {"end": self._clock(), "duration": float(finished_task.get("duration") or 0.0)}
            return self._judge_eval(task_id, finished_task, train_iter)
        return False

    def _judge_eval(self, task_id: str, finished_task: dict, train_iter: int) -> bool:
        """Record an eval; True when the run converged: an eval reached stop_value and, when
        ``confirm_eval_episodes`` > 0, a second eval of the same weights on that many fresh
        episodes did so by ``confirm_margin_se`` standard errors.

        An eval that finished no episode is recorded without a reward: it is never the best,
        never passes, and as a confirmation it fails (training goes on)."""
        reward = events.episode_figure(finished_task, "reward_mean")
        record = {k: v for k, v in finished_task.items() if k not in events.EPISODE_FIELDS}
        if reward is not None:
            record.update(reward_mean=reward, reward_std=events.episode_figure(finished_task, "reward_std") or 0.0)
        record.update(envstep=self.total_envstep, time=self._clock(), train_iter=train_iter, task_id=task_id)
        self._evaluator_info.append(record)
        if reward is not None and (not self._best or reward > self._best["reward_mean"]):
            self._best = {"task_id": task_id, "reward_mean": reward, "policy_version": train_iter,
                          "envstep": finished_task.get("policy_envstep", self.total_envstep)}
        stop_value = self._cfg.env.stop_value
        passed = stop_value is not None and reward is not None and reward >= stop_value
        confirming = self._confirm is not None and self._confirm.get("dispatched") == task_id
        if confirming:
            self._confirm = None
            if reward is None:
                self._log("confirmation eval of policy version %d finished no episode; training goes on", train_iter)
                return False
            n = max(1, int(finished_task.get("real_episode_count") or 1))
            bound = reward - float(self._commander_cfg.confirm_margin_se) * float(record["reward_std"]) / math.sqrt(n)
            passed = stop_value is not None and bound >= stop_value
            if not passed:
                self._log("confirmation eval of policy version %d: reward_mean %.2f (%.2f after the margin) < "
                          "stop_value %s; training goes on", train_iter, reward, bound, stop_value)
                return False
        elif passed and self._commander_cfg.confirm_eval_episodes > 0:
            self._confirm = {"task_id": task_id}
            self._log("eval of policy version %d: reward_mean %.2f >= stop_value %s; confirming on %d fresh episodes",
                      train_iter, reward, stop_value, self._commander_cfg.confirm_eval_episodes)
            return False
        if not passed:
            return False
        self._log("eval reward_mean %.2f >= stop_value %s: the experiment has converged", reward, stop_value)
        self._final_task = task_id
        self._end_flag = True
        return True

    def _log(self, msg: str, *args: Any) -> None:
        if self._logger is not None:
            self._logger.info(msg, *args)

    def _release_collector_slot(self, task_id: str) -> None:
        if self._eval_in_flight == task_id:
            self._eval_in_flight = None
            if self._eval_own_slot:
                self._eval_own_slot = False
                return
        self._collector_task_space.release_space()

    def finish_learner_task(self, task_id: str, finished_task: dict) -> str:
        """Release learner space and reset the run's ids and history (as the seed); returns buffer_id."""
        self._learner_task_space.release_space()
        buffer_id = finished_task["buffer_id"]
        self._current_buffer_id = None
        self._current_policy_id = None
        self._resume_learner = False
        self._learner_info = deque([{"train_iter": 0}], maxlen=_LEARNER_INFO_HISTORY)
        self._evaluator_info = []
        self._last_eval = {"time": self._clock(), "train_iter": 0, "envstep": 0}
        return buffer_id

    def notify_fail_collector_task(self, task: dict) -> None:
        """Release the failed collector task's space; the daemon's next loop issues a replacement.
        A failed confirmation eval is dropped: the next passing eval asks for another."""
        if self._confirm is not None and self._confirm.get("dispatched") == task.get("task_id"):
            self._confirm = None
        self._release_collector_slot(task.get("task_id", ""))

    def notify_fail_learner_task(self, task: dict) -> None:
        """Release learner space; the replacement resumes on the same policy_id / buffer_id.

        A rank of a learner group fails the group once: the first report releases its space
        (a new group with a new ``group_id`` follows), reports of its other ranks change nothing.
        """
        group = task.get("group_id")
        if group is not None:
            if group == self._lost_group:
                return
            self._lost_group = group
        self._learner_task_space.release_space()
        self._resume_learner = True

    def update_learner_info(self, task_id: str, info: dict) -> None:
        """Append a learner report (``train_iter``, ``consumed_env_steps``, ...) to the bounded history."""
        self._learner_info.append(dict(info))

    def follow_collector_workers(self, workers: int) -> None:
        """Size the collector task space to ``workers`` live ``rq worker collector`` processes.

        The rule: one worker is kept free for evaluation when evals have their own slot
        (``commander.eval_task_space`` > 0), at least one collector task may run (it waits in the
        queue while no worker is up, and an eval waits at the queue's front behind at most the
        running tasks), and ``commander.collector_task_space``, when set, caps the result.
        Running tasks keep their slots when the space shrinks.
        """
        c = self._commander_cfg
        space = max(1, int(workers) - (1 if c.eval_task_space > 0 else 0))
        if c.collector_task_space:
            space = min(space, int(c.collector_task_space))
        self._collector_task_space.resize(space)

    def collect_setting(self) -> dict[str, Any]:
        """The algorithm's collect setting for the env steps, train iterations and collector task
        space now (``Algorithm.collect_setting``; e.g. DQN's epsilon, PPO's rollout share)."""
        info = {"envstep": self.total_envstep, "train_iter": self.train_iter,
                "collectors": self._collector_task_space.max_val}
        return self._algorithm.collect_setting(self._cfg.policy, info)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state, persisted by the coordinator so a restart resumes the run."""
        return {
            "collector_task_space": self._collector_task_space.state_dict(),
            "learner_task_space": self._learner_task_space.state_dict(),
            "learner_info": list(self._learner_info)[-3:],
            "total_collector_env_step": self._total_collector_env_step,
            "evaluator_info": self._evaluator_info,
            "current_buffer_id": self._current_buffer_id,
            "current_policy_id": self._current_policy_id,
            "resume_learner": self._resume_learner,
            "eval_in_flight": self._eval_in_flight,
            "eval_own_slot": self._eval_own_slot,
            "last_eval": self._last_eval,
            "eval_spent": self._eval_spent,
            "end_flag": self._end_flag,
            "seed_counter": self._seed_counter,
            "run_id": self._run_id,
            "confirm": self._confirm,
            "best": self._best,
            "final_task": self._final_task,
            "lost_group": self._lost_group,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (on coordinator restart)."""
        for name in ("collector_task_space", "learner_task_space"):
            space = getattr(self, f"_{name}")
            space.min_val, space.max_val, space.cur = (state[name][k] for k in ("min_val", "max_val", "cur"))
        self._learner_info = deque(state["learner_info"] or [{"train_iter": 0}], maxlen=_LEARNER_INFO_HISTORY)
        self._total_collector_env_step = int(state["total_collector_env_step"])
        self._evaluator_info = list(state["evaluator_info"])
        self._current_buffer_id = state["current_buffer_id"]
        self._current_policy_id = state["current_policy_id"]
        self._resume_learner = bool(state["resume_learner"])
        self._eval_in_flight = state["eval_in_flight"]
        self._eval_own_slot = bool(state.get("eval_own_slot", False))
        self._last_eval = dict(state["last_eval"])
        self._eval_spent = dict(state.get("eval_spent") or {"end": 0.0, "duration": 0.0})
        self._end_flag = bool(state["end_flag"])
        self._seed_counter = int(state["seed_counter"])
        self._run_id = state["run_id"]
        self._confirm = state.get("confirm")
        self._best = dict(state.get("best") or {})
        self._final_task = state.get("final_task")
        self._lost_group = state.get("lost_group")

    def restore(self, state: dict[str, Any], clock_shift_s: float, train_iter: int, consumed_env_steps: int) -> None:
        for ev in state["evaluator_info"]:
            ev["time"] = float(ev.get("time", 0.0)) + clock_shift_s
        state["last_eval"]["time"] = float(state["last_eval"]["time"]) + clock_shift_s
        for name in ("collector_task_space", "learner_task_space"):
            state[name]["cur"] = state[name]["min_val"]  # no task of the old run is running
        state.update(eval_in_flight=None, eval_own_slot=False, confirm=None, end_flag=False, final_task=None,
                     resume_learner=True,
                     learner_info=[{"train_iter": train_iter, "consumed_env_steps": consumed_env_steps}])
        self.load_state_dict(state)

    # ------------------------------------------------------------------ inspection
    @property
    def evaluations(self) -> list[dict]:
        """Finished eval tasks of the current run (finish info plus ``envstep`` and ``time``), oldest first."""
        return list(self._evaluator_info)

    @property
    def last_eval(self) -> Optional[dict]:
        return self._evaluator_info[-1] if self._evaluator_info else None

    @property
    def end_flag(self) -> bool:
        return self._end_flag

    @property
    def best_eval(self) -> dict:
        """The best eval so far: ``task_id``, ``reward_mean``, ``policy_version``, ``envstep`` (empty before one)."""
        return dict(self._best)

    @property
    def eval_bundles_in_use(self) -> set[str]:
        """Eval task ids whose stored bundles (``rqrl:{exp}:task:{id}:evaluated``) can still be
        exported or replayed: the best eval's (best.pt), the eval under confirmation's (the
        confirming task replays it) and the converged one's (final.pt)."""
        return {t for t in (self._best.get("task_id"), (self._confirm or {}).get("task_id"), self._final_task) if t}

    @property
    def final_eval_task(self) -> Optional[str]:
        """The eval task whose weights passed (and were confirmed): what final.pt exports."""
        return self._final_task

    def summary(self) -> dict[str, Any]:
        """Flat scalars for the ``rqrl:{exp}:commander`` hash and ``rqrl status``."""
        last = self.last_eval or {}
        return {
            "envstep": self.total_envstep,
            "train_iter": self.train_iter,
            "collector_tasks_running": self._collector_task_space.in_use,
            "learner_tasks_running": self._learner_task_space.in_use,
            "collector_task_space": self._collector_task_space.max_val,
            # None (JSON null, "" in the Redis hash) before the first eval; the reward also when
            # the last eval finished no episode.
            "last_eval_reward_mean": last.get("reward_mean"),
            "last_eval_policy_version": last.get("policy_version"),
            "last_eval_envstep": last.get("envstep"),
            # Env steps the learner had consumed when it made the evaluated policy version.
            "last_eval_policy_envstep": last.get("policy_envstep"),
            "stop_value": self._cfg.env.stop_value,
            # The give-up limits (0: none), for the time left `rqrl status` shows.
            "max_env_step": self._cfg.commander.max_env_step,
            "max_train_iter": self._cfg.commander.max_train_iter,
            "max_wall_seconds": self._cfg.commander.max_wall_seconds,
            "converged": self._end_flag,
            "policy_id": self._current_policy_id or "",
            "buffer_id": self._current_buffer_id or "",
        }


def create_commander(cfg: EasyDict, **kwargs: Any) -> BaseCommander:
    """Build the commander named by ``cfg.create.commander.type`` (default ``solo``)."""
    from common.registry import import_names

    create = cfg.get("create") or {}
    ctype = create.get("commander", {}).get("type", "solo")
    import_names(create.get("commander", {}).get("import_names", []))
    commander = COMMANDER_REGISTRY.build(ctype, cfg, **kwargs)
    if not isinstance(commander, BaseCommander):
        raise TypeError(f"commander {ctype!r} ({type(commander).__name__}) does not subclass "
                        "coordinator.commander.BaseCommander, the contract the coordinator relies on")
    return commander
