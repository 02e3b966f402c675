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
  its player's checkpoint (``ckpt_name``) instead of stranding the collectors; failed tasks are replaced simply
  because their space is released (the daemon asks for new tasks every loop);
* the learner-info history is bounded instead of growing for the whole run;
* env steps for the collect setting (an exploration schedule, say) also count the learner's
  live ``consumed_env_steps``, so long collector tasks do not freeze the schedule until they finish.

The commander is keyed by player (:meth:`BaseCommander.players`): resume and wrap-up find each
learner's policy, buffer and checkpoint there. SoloCommander is split by the state it owns:
:class:`coordinator.task_spaces.TaskSpaces`, :class:`coordinator.eval_judge.EvalJudge` (the one
stop rule) and :class:`SoloState`, whose ``state_dict`` is derived from its fields
(:mod:`coordinator.wire_state`).
"""

from __future__ import annotations

import logging
import time
import uuid
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from easydict import EasyDict

from common import events, keys
from common.config import is_deterministic, to_plain
from common.messages import CollectorTask, LearnerTask
from common.policy import algorithm_of
from common.seeding import task_seed
from common.registry import COMMANDER_REGISTRY
from common.task_space import TaskSpace
from coordinator.eval_judge import ClosingEval, EvalJudge, EvalRules, eval_mark
from coordinator.task_spaces import TaskSpaces
from coordinator.wire_state import WireState

_LEARNER_INFO_HISTORY = 100
_LEARNER_INFO_KEPT = 3  # learner reports in the state: the newest is what counts


def new_task_id(kind: str) -> str:
    """``{kind}_task_{16 hex chars}``: unique, and a valid RQ job id."""
    return f"{kind}_task_{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class Player:
    """A policy being trained, and where its learner keeps what it makes.

    Attributes:
        player_id: the player's name in the commander ("main" for the solo commander's one player).
        policy_id: the policy its learner publishes (``rqrl:{exp}:policy:{policy_id}``); "" while
            it has no learner task.
        buffer_id: the buffer its collectors fill (``rqrl:{exp}:buffer:{buffer_id}:*``); "" as policy_id.
        ckpt_name: its learner's resumable checkpoint (``rqrl:{exp}:ckpt:{ckpt_name}``); learner tasks carry it.
        role: "main" for the player a run is about (its checkpoint is the run's resume point).
    """

    player_id: str
    policy_id: str
    buffer_id: str
    ckpt_name: str
    role: str = "main"


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

    @classmethod
    def check_config(cls, cfg: EasyDict) -> None:
        """Refuse a config this commander cannot run, before anything is launched (``rqrl train``,
        ``--dry-run``): nothing to check here; the league commander names its keys.

        Raises:
            ValueError: naming the config key at fault.
        """

    def redis_writes(self, pipe: Any) -> None:
        """Queue the commander's own Redis writes on ``pipe``, the MULTI pipeline that persists
        :meth:`state_dict` and acks the events behind it (both land or neither): none by default;
        the league commander's snapshot copies and payoff and Elo hashes."""

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
    def players(self, state: Optional[dict[str, Any]] = None) -> list[Player]:
        """The players now, or those of ``state`` (:meth:`state_dict` output: the wrap-up saves the
        state it took at the stop, after the learner's finish has reset the live one). The first
        has role "main". The coordinator finds each learner's policy, buffer and checkpoint here.

        Raises:
            ValueError: ``state`` is not a state of this commander (the message names the key).
        """

    @abstractmethod
    def summary(self) -> dict[str, Any]:
        """Flat scalars (int, float, bool, str or None) for ``rqrl:{exp}:commander``, ``rqrl status``
        and summary.json. The coordinator reads ``collector_task_space`` from it; ``policy_id`` and
        ``buffer_id`` (the main player's, "" when none) are for ``rqrl status``."""

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

    def begin_closing(self) -> Optional[ClosingEval]:
        """The run stops on a budget: hand out no more training collector or learner tasks. Returns
        the closing eval of the learner's newest policy version that follows (a free eval slot
        gets it from :meth:`get_collector_task`; the coordinator waits while it is ``pending``),
        or None when none does: the default, for a commander without closing evals."""
        return None

    def follow_collector_workers(self, workers: int) -> None:
        """``workers`` collector workers are live (the coordinator calls this whenever the count
        changes). A commander with a fixed collector task space does not override it."""

    def collect_setting(self) -> dict[str, Any]:
        """The collect setting training collectors should act with now (plain JSON values). The
        coordinator writes it to ``rqrl:{exp}:collect_setting`` whenever it changes and collectors
        read it with every chunk, so a long task never acts on a stale one."""
        return {}


SOLO_CKPT = "latest"  # the solo player's checkpoint name: the one older runs and resume.json used


class LearnerReports:
    """The learner's newest progress reports (bounded: the run is long), oldest first."""

    def __init__(self) -> None:
        self._reports: deque[dict] = deque(maxlen=_LEARNER_INFO_HISTORY)
        self.reset()

    @property
    def latest(self) -> dict:
        """The newest report: ``train_iter``, ``consumed_env_steps``, ... (``train_iter`` 0 before one)."""
        return self._reports[-1]

    def __len__(self) -> int:
        return len(self._reports)

    def append(self, info: dict) -> None:
        self._reports.append(dict(info))

    def reset(self) -> None:
        """No report yet (a new learner)."""
        self._reports.clear()
        self._reports.append({"train_iter": 0})

    def state_dict(self) -> list[dict]:
        """The newest reports (a list of dicts): only the latest counts after a restart."""
        return [dict(r) for r in list(self._reports)[-_LEARNER_INFO_KEPT:]]

    def load_state_dict(self, state: list[dict]) -> None:
        """Adopt :meth:`state_dict` output (an empty list: no report yet).

        Raises:
            ValueError: ``state`` is not a list of dicts.
        """
        if not isinstance(state, list) or not all(isinstance(r, dict) for r in state):
            raise ValueError(f"learner reports must be a list of dicts, got {state!r}")
        self.reset()
        if state:
            self._reports.clear()
            self._reports.extend(dict(r) for r in state)


def report_task(logger: Any, tb_logger: Any, kind: str, task_id: str, finished_task: dict, train_iter: int,
                env_steps: int, envstep: int) -> None:
    """Log a finished task's figures; write them to TensorBoard as ``{kind}_iter/*`` (against
    ``train_iter``) and ``{kind}_step/*`` (against the run's ``envstep``), as the seed's commander."""
    figures = {name: events.episode_figure(finished_task, name) for name in events.EPISODE_FIELDS}
    figures["avg_time_per_step"] = events.figure(finished_task, "avg_time_per_step")
    info = {"train_iter": train_iter, "episode_count": int(finished_task.get("real_episode_count") or 0),
            "env_steps": env_steps, **{k: v for k, v in figures.items() if v is not None}}
    # Evals at INFO; a line per training task (thousands a minute with many collectors) at DEBUG.
    level = logging.INFO if kind == "evaluator" else logging.DEBUG
    if logger is not None and logger.isEnabledFor(level):
        logger.log(level, "[%s] %s ends: %s", kind.upper(), task_id, ", ".join(f"{k}={v}" for k, v in info.items()))
    if tb_logger is not None:
        for k, v in info.items():
            if k != "train_iter":
                tb_logger.add_scalar(f"{kind}_iter/{k}", v, train_iter)
                tb_logger.add_scalar(f"{kind}_step/{k}", v, envstep)


@dataclass
class SoloState(WireState):
    """The solo commander's state: its parts' fields and its own, each one key of ``state_dict()``
    (the keys, and so resume.json and the coordinator's Redis state, read as they always have)."""

    spaces: TaskSpaces
    judge: EvalJudge
    learner_info: LearnerReports = field(default_factory=LearnerReports)
    total_collector_env_step: int = 0  # env steps of finished training collector tasks
    current_buffer_id: Optional[str] = None  # the main player's, None while it has no learner task
    current_policy_id: Optional[str] = None
    resume_learner: bool = False  # the learner failed: its replacement resumes from the checkpoint
    end_flag: bool = False  # converged
    seed_counter: int = 0  # tasks handed out (each gets its own seed)
    run_id: str = ""
    lost_group: Optional[str] = None  # the learner group whose failure was counted (once)


@COMMANDER_REGISTRY.register("solo")
class SoloCommander(BaseCommander):
    """DI-engine's solo parallel commander (one learner, N collectors), faults fixed (module docstring).

    Its one player (:meth:`players`) is "main" with checkpoint "latest"; its ids are "" while it
    has no learner task (before the first, and after one finished), so the list is never empty.

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
        self._clock = clock
        self._logger = logger
        self._state = self._new_state(run_id)
        # Parts of self._state, which loads them in place: these names stay valid.
        self._spaces, self._judge = self._state.spaces, self._state.judge
        self._algorithm = algorithm_of(cfg)  # torch-free: defaults and the collect setting
        self._tb_logger = tb_logger
        # policy.learn.learner_num > 1: one learner task space holds a group of that many ranks
        # (workers/ddp.py), handed out one per call (not state: the calls follow one another).
        self._learner_num = int(cfg.policy.learn.get("learner_num", 1))
        self._pending_ranks: list[dict] = []
        self._task_config = to_plain(cfg)  # every task carries it; built once, never mutated
        self._deterministic = is_deterministic(cfg)

    def _new_state(self, run_id: str) -> SoloState:
        # Until the coordinator reports the live collector workers (follow_collector_workers):
        # the cap when one is set, else one task.
        c = self._commander_cfg
        spaces = TaskSpaces(TaskSpace(0, c.collector_task_space or 1), TaskSpace(0, c.learner_task_space))
        judge = EvalJudge(EvalRules.of(self._cfg), self._logger, last_eval=eval_mark(self._clock(), 0, 0))
        return SoloState(spaces, judge, run_id=run_id)

    # ------------------------------------------------------------------ task creation
    @property
    def total_envstep(self) -> int:
        """Env steps collected so far: finished collector tasks, or the learner's live count if larger
        (deterministic mode: finished tasks only, so evals and the budget fall between tasks)."""
        if self._deterministic:
            return self._state.total_collector_env_step
        return max(self._state.total_collector_env_step, events.consumed_env_steps(self._state.learner_info.latest))

    @property
    def train_iter(self) -> int:
        return int(self._state.learner_info.latest.get("train_iter", 0))

    def _next_seed(self) -> int:
        self._state.seed_counter += 1
        return task_seed(int(self._cfg.seed), self._state.seed_counter)

    def _task_fields(self, task_id: str) -> dict[str, Any]:
        """The fields every task of this run carries (a :mod:`common.messages` task's)."""
        st = self._state
        return {"task_id": task_id, "run_id": st.run_id, "exp_name": self._exp_name, "run_name": self._run_name,
                "policy_id": st.current_policy_id, "buffer_id": st.current_buffer_id, "seed": self._next_seed(),
                "config": self._task_config}

    def get_collector_task(self) -> Optional[dict]:
        """A collector or eval task when space is free and a learner exists, else None.

        An eval task takes the separate eval slot (``commander.eval_task_space`` > 0) instead of
        collector space, so evaluation never waits for a training task to finish.
        """
        st = self._state
        if st.end_flag or st.current_buffer_id is None or st.current_policy_id is None:
            return None
        now = self._clock()
        eval_flag = self._judge.due(now, self.train_iter, self.total_envstep, self._spaces.eval_in_flight is not None)
        if not eval_flag and self._judge.closing is not None:
            return None  # the run is closing: its closing eval, no more training tasks
        if not eval_flag and self._deterministic and 0 < self._commander_cfg.max_env_step <= self.total_envstep:
            return None  # deterministic: the task that reached the budget was the last
        task_id = new_task_id("collector")
        if not self._spaces.take_collector(task_id, eval_flag, eval_flag and self._commander_cfg.eval_task_space > 0):
            return None
        replay: dict[str, Any] = {}
        if eval_flag:
            passed = self._judge.dispatch(task_id, eval_mark(now, self.train_iter, self.total_envstep))
            if passed is not None:  # a confirmation: exactly the weights that passed, on fresh episodes
                replay = {"eval_policy_key": keys.evaluated_policy(self._ns, passed),
                          "eval_episodes": int(self._commander_cfg.confirm_eval_episodes)}
        return CollectorTask(**self._task_fields(task_id), eval_flag=eval_flag, collect_setting=self.collect_setting(),
                             envstep=self.total_envstep, **replay).to_dict()

    def get_learner_task(self) -> Optional[dict]:
        """A learner task when learner space is free, else None.

        A fresh run gets new ``policy_id`` / ``buffer_id``; the replacement of a failed learner
        reuses them and sets ``resume`` so it loads its player's checkpoint (``ckpt_name``). With
        ``policy.learn.learner_num`` = N > 1 one space holds a group: N tasks with one new
        ``group_id``, ``rank`` 0..N-1 and ``world_size`` N, returned by N calls in a row.
        """
        st = self._state
        if st.end_flag or self._judge.closing is not None:
            return None
        if self._pending_ranks:
            return self._pending_ranks.pop(0)
        if not self._spaces.learner_task_space.acquire_space():
            return None
        resume = st.resume_learner and st.current_policy_id is not None
        if not resume:
            st.current_policy_id = f"policy_{uuid.uuid4().hex[:12]}"
            st.current_buffer_id = f"buffer_{uuid.uuid4().hex[:12]}"
        st.resume_learner = False
        task = LearnerTask(**self._task_fields(new_task_id("learner")), ckpt_name=SOLO_CKPT, resume=resume)
        if self._learner_num == 1:
            return task.to_dict()
        group = {"group_id": f"group_{uuid.uuid4().hex[:12]}", "world_size": self._learner_num}
        ranks = [replace(task, **group, rank=0)] + [
            replace(task, **group, rank=r, task_id=new_task_id("learner"), seed=self._next_seed())
            for r in range(1, self._learner_num)]
        self._pending_ranks = [r.to_dict() for r in ranks[1:]]
        return ranks[0].to_dict()

    # ------------------------------------------------------------------ results
    def finish_collector_task(self, task_id: str, finished_task: dict) -> bool:
        """Release the task's space, log its info; for an eval task, judge convergence.

        A task that finished no episode (``real_episode_count`` 0) has no per-episode figures
        (``reward_mean``, ``reward_std``, ``avg_step_per_episode``, ``avg_time_per_episode``:
        :data:`common.events.EPISODE_FIELDS`): they are absent from its info and from
        TensorBoard, never recorded as 0.

        Returns:
            True when the eval converged the run (:class:`coordinator.eval_judge.EvalJudge`).
        """
        self._spaces.release_collector(task_id)
        is_eval = bool(finished_task["eval_flag"])
        train_iter = int(finished_task["policy_version"])  # the version the task acted with
        # The task's env steps; collectors before the glossary's names called them step_count.
        env_steps = int(finished_task["env_steps"] if "env_steps" in finished_task else finished_task["step_count"])
        if not is_eval:
            self._state.total_collector_env_step += env_steps
        report_task(self._logger, self._tb_logger, "evaluator" if is_eval else "collector", task_id, finished_task,
                    train_iter, env_steps, self.total_envstep)
        if not is_eval:
            return False
        converged = self._judge.judge(task_id, finished_task, train_iter, self.total_envstep, self._clock())
        self._state.end_flag = self._state.end_flag or converged
        return converged

    def finish_learner_task(self, task_id: str, finished_task: dict) -> str:
        """Release learner space and reset the run's ids and history (as the seed); returns buffer_id."""
        self._spaces.learner_task_space.release_space()
        st = self._state
        st.current_buffer_id = st.current_policy_id = None
        st.resume_learner = False
        st.learner_info.reset()
        self._judge.restart(self._clock())
        return finished_task["buffer_id"]

    def begin_closing(self) -> Optional[ClosingEval]:
        """No more training tasks; the closing eval (:meth:`EvalJudge.begin_closing`), or None when
        the run converged or its learner has not trained and published (nothing to evaluate)."""
        st = self._state
        if st.end_flag or st.current_policy_id is None or self.train_iter == 0:
            return None
        return self._judge.begin_closing()

    def notify_fail_collector_task(self, task: dict) -> None:
        """Release the failed collector task's space; the daemon's next loop issues a replacement.
        A failed confirmation eval is dropped: the next passing eval asks for another."""
        self._judge.drop(task.get("task_id", ""))
        self._spaces.release_collector(task.get("task_id", ""))

    def notify_fail_learner_task(self, task: dict) -> None:
        """Release learner space; the replacement resumes on the same policy_id / buffer_id.

        A rank of a learner group fails the group once: the first report releases its space
        (a new group with a new ``group_id`` follows), reports of its other ranks change nothing.
        """
        group = task.get("group_id")
        if group is not None:
            if group == self._state.lost_group:
                return
            self._state.lost_group = group
        self._spaces.learner_task_space.release_space()
        self._state.resume_learner = True

    def update_learner_info(self, task_id: str, info: dict) -> None:
        """Append a learner report (``train_iter``, ``consumed_env_steps``, ...) to the bounded history."""
        self._state.learner_info.append(info)

    def follow_collector_workers(self, workers: int) -> None:
        """Size the collector task space to ``workers`` live ``rq worker collector`` processes, capped
        by ``commander.collector_task_space`` (:meth:`coordinator.task_spaces.TaskSpaces.follow_collector_workers`)."""
        c = self._commander_cfg
        self._spaces.follow_collector_workers(workers, c.collector_task_space, c.eval_task_space > 0)

    def collect_setting(self) -> dict[str, Any]:
        """The algorithm's collect setting for the env steps, train iterations and collector task
        space now (``Algorithm.collect_setting``; e.g. DQN's epsilon, PPO's rollout share)."""
        info = {"envstep": self.total_envstep, "train_iter": self.train_iter,
                "collectors": self._spaces.collector_task_space.max_val}
        return self._algorithm.collect_setting(self._cfg.policy, info)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state (:class:`SoloState`), persisted by the coordinator so a restart resumes the run."""
        return self._state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (on coordinator restart); older forms load too (:class:`SoloState`)."""
        self._state.load_state_dict(state)

    def restore(self, state: dict[str, Any], clock_shift_s: float, train_iter: int, consumed_env_steps: int) -> None:
        self.load_state_dict(state)
        self._spaces.clear_running()
        self._judge.after_pause(clock_shift_s)
        st = self._state
        st.end_flag, st.resume_learner = False, True
        st.learner_info.load_state_dict([{"train_iter": train_iter, "consumed_env_steps": consumed_env_steps}])

    # ------------------------------------------------------------------ inspection
    def players(self, state: Optional[dict[str, Any]] = None) -> list[Player]:
        """The one player, "main", with checkpoint ``latest``: ids "" while it has no learner task."""
        st = self._state
        if state is not None:
            st = self._new_state("")
            st.load_state_dict(state)
        return [Player("main", st.current_policy_id or "", st.current_buffer_id or "", SOLO_CKPT)]

    @property
    def evaluations(self) -> list[dict]:
        """Finished eval tasks of the current run (finish info plus ``envstep`` and ``time``), oldest first."""
        return list(self._judge.evaluator_info)

    @property
    def last_eval(self) -> Optional[dict]:
        return self._judge.evaluator_info[-1] if self._judge.evaluator_info else None

    @property
    def end_flag(self) -> bool:
        return self._state.end_flag

    @property
    def best_eval(self) -> dict:
        """The best eval so far: ``task_id``, ``reward_mean``, ``policy_version``, ``envstep`` (empty before one)."""
        return dict(self._judge.best)

    @property
    def eval_bundles_in_use(self) -> set[str]:
        """Eval task ids whose stored bundles (``rqrl:{exp}:task:{id}:evaluated``) can still be
        exported or replayed (:attr:`coordinator.eval_judge.EvalJudge.bundles_in_use`)."""
        return self._judge.bundles_in_use

    @property
    def final_eval_task(self) -> Optional[str]:
        """The eval task whose weights passed (and were confirmed): what final.pt exports."""
        return self._judge.final_task

    def summary(self) -> dict[str, Any]:
        """Flat scalars for the ``rqrl:{exp}:commander`` hash and ``rqrl status``."""
        last = self.last_eval or {}
        main = self.players()[0]
        return {
            "envstep": self.total_envstep,
            "train_iter": self.train_iter,
            "collector_tasks_running": self._spaces.collector_task_space.in_use,
            "learner_tasks_running": self._spaces.learner_task_space.in_use,
            "collector_task_space": self._spaces.collector_task_space.max_val,
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
            "converged": self._state.end_flag,
            "policy_id": main.policy_id,
            "buffer_id": main.buffer_id,
        }


def commander_class(cfg: EasyDict) -> type:
    """The class named by ``cfg.create.commander.type`` (default ``solo``), its modules imported.

    Raises:
        KeyError: an unknown type (the known ones listed).
    """
    from common.registry import import_names

    create = cfg.get("create") or {}
    import_names(create.get("commander", {}).get("import_names", []))
    return COMMANDER_REGISTRY.get(create.get("commander", {}).get("type", "solo"))


def create_commander(cfg: EasyDict, **kwargs: Any) -> BaseCommander:
    """Build the commander named by ``cfg.create.commander.type`` (default ``solo``)."""
    ctype = (cfg.get("create") or {}).get("commander", {}).get("type", "solo")
    commander = commander_class(cfg)(cfg, **kwargs)
    if not isinstance(commander, BaseCommander):
        raise TypeError(f"commander {ctype!r} ({type(commander).__name__}) does not subclass "
                        "coordinator.commander.BaseCommander, the contract the coordinator relies on")
    return commander
