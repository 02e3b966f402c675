"""Learner hooks: code run at ``before_run`` / ``before_iter`` / ``after_iter`` / ``after_run``.

As the seed's learner_hook module: each hook has a name and a position; the hooks at one
position run in the order they were registered, nothing else orders them. :func:`build_hooks`
makes the standard ones from ``learner.hook`` config, for a learner built on its own. A learner
task's whole list, in the order it runs, is built in one place: ``workers.learner.task_hooks``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any, Callable, Optional, Protocol

import redis

from common import events, keys, phases


class BaseLearner(Protocol):
    """What a hook reads of and calls on the learner (workers/learner.py's BaseLearner, as the
    seed's): its counters, loggers, policy and checkpoints."""

    train_iter: int
    consumed_env_steps: int  # env steps of the chunks the learner took in
    ckpt_name: Optional[str]  # save_checkpoint's name for the after-run save (None: its player's final)
    resume_ckpt: str  # its own resumable checkpoint: saved every N iterations and after the run
    tb_logger: Any  # a TensorBoard SummaryWriter, or None
    log_buffer: dict[str, Any]  # "scalar": {name: [values since the last show]}
    learn_info: dict[str, Any]
    priority_info: dict[str, Any]
    policy: Any  # common.policy.Policy

    def info(self, s: str) -> None: ...
    def load_checkpoint(self, name: str) -> bool: ...
    def save_checkpoint_now(self, name: str) -> None: ...


class PolicyPublisher(Protocol):
    """workers/publication.py's publisher of collector weights."""

    def publish(self, weights: dict[str, Any], train_iter: int, envstep_limit: int, envstep: int) -> None: ...
    def flush(self, timeout: float = 60.0) -> None: ...


class LearnerGroup(Protocol):
    """workers/ddp.py's data-parallel learner group."""

    def broadcast_state(self, policy: Any) -> None: ...


POSITIONS = ("before_run", "before_iter", "after_iter", "after_run")


class LearnerHook:
    """A callable run at ``position``; ``freq`` > 0 limits after_iter hooks to every N iterations.

    Raises:
        ValueError: ``position`` is none of :data:`POSITIONS` (names the hook).
    """

    def __init__(self, name: str, position: str, freq: int = 1) -> None:
        if position not in POSITIONS:
            raise ValueError(f"hook {name!r}: position must be one of {POSITIONS}, got {position!r}")
        self.name, self.position, self.freq = name, position, max(1, int(freq))

    def due(self, learner: BaseLearner) -> bool:
        return self.position != "after_iter" or learner.train_iter % self.freq == 0

    def __call__(self, learner: BaseLearner) -> None:
        raise NotImplementedError


class LoadCkptHook(LearnerHook):
    """Load checkpoint ``ckpt_name`` (from the learner's checkpoint store) before the run."""

    def __init__(self, ckpt_name: str) -> None:
        super().__init__("load_ckpt_before_run", "before_run")
        self.ckpt_name = ckpt_name

    def __call__(self, learner: BaseLearner) -> None:
        learner.load_checkpoint(self.ckpt_name)


class SaveCkptHook(LearnerHook):
    """Save the learner's resumable checkpoint (``resume_ckpt``) every ``freq`` iterations (0: not
    by count) or once ``every_s`` seconds passed since the last save (0: not by time), whichever
    comes first; or its player's final checkpoint (:func:`common.keys.final_ckpt_name`) and then
    it after the run. The time bound keeps what a replacement learner loses small where iterations
    are long (a PPO iteration of 2,048 rows and 4 epochs: 500 of them are ~1 M env steps)."""

    def __init__(self, position: str, freq: int = 1, every_s: float = 0.0) -> None:
        name = "save_ckpt_after_run" if position == "after_run" else "save_ckpt_after_iter"
        super().__init__(name, position, freq=freq)
        self._by_count, self._every_s = int(freq) > 0, float(every_s)
        self._last = time.monotonic()

    def due(self, learner: BaseLearner) -> bool:
        if self.position != "after_iter":
            return True
        return ((self._by_count and learner.train_iter % self.freq == 0)
                or (self._every_s > 0 and time.monotonic() - self._last >= self._every_s))

    def __call__(self, learner: BaseLearner) -> None:
        if self.position == "after_run":
            learner.save_checkpoint_now(learner.ckpt_name or keys.final_ckpt_name(learner.resume_ckpt))
        learner.save_checkpoint_now(learner.resume_ckpt)
        self._last = time.monotonic()


class LogShowHook(LearnerHook):
    """Every ``freq`` iterations: mean of each logged scalar to the text log and TensorBoard."""

    def __init__(self, freq: int) -> None:
        super().__init__("log_show_after_iter", "after_iter", freq=freq)
        self._last = time.time()

    def __call__(self, learner: BaseLearner) -> None:
        buf: dict[str, list[float]] = learner.log_buffer["scalar"]
        if not buf:
            return
        means = {k: sum(v) / len(v) for k, v in buf.items() if v}
        now = time.time()
        means["iter_per_sec"] = self.freq / max(1e-9, now - self._last)
        self._last = now
        learner.info(f"iter {learner.train_iter}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(means.items())))
        if learner.tb_logger is not None:
            for k, v in means.items():
                learner.tb_logger.add_scalar(f"learner_iter/{k}", v, learner.train_iter)
                learner.tb_logger.add_scalar(f"learner_step/{k}", v, learner.consumed_env_steps)
        learner.log_buffer["scalar"] = defaultdict(list)


class PublishPolicyHook(LearnerHook):
    """Publish collector weights before the run and every ``send_policy_freq`` iterations; with
    ``wait`` (before the run: the phase ``first_policy`` that follows means written) it waits for
    the write, else the train loop goes on while the publisher writes."""

    def __init__(self, publisher: PolicyPublisher, position: str, freq: int,
                 envstep_limit: Callable[[int], int], wait: bool = False) -> None:
        super().__init__(f"publish_policy_{position}", position, freq=freq)
        self._publisher, self._limit, self._wait = publisher, envstep_limit, wait

    def __call__(self, learner: BaseLearner) -> None:
        self._publisher.publish(learner.policy.get_weights(), learner.train_iter, self._limit(learner.train_iter),
                                learner.consumed_env_steps)
        if self._wait:
            self._publisher.flush()


class PhaseHook(LearnerHook):
    """Note when the hook first runs (:attr:`at`, unix seconds), e.g. ``first_train_step`` after
    the first train iteration, and with ``record`` write it as run phase ``phase``
    (common/phases.py); a no-op after that."""

    def __init__(self, conn: redis.Redis, exp: str, phase: str, position: str, record: bool = True) -> None:
        super().__init__(f"phase_{phase}_{position}", position)
        self._conn, self._exp, self._phase, self._record = conn, exp, phase, record
        self.at: Optional[float] = None

    def __call__(self, learner: BaseLearner) -> None:
        if self.at is None:
            self.at = time.time()
            if self._record:
                phases.record(self._conn, self._exp, self._phase, self.at)


class FeedbackHook(LearnerHook):
    """Hand the last iteration's ``priority_info`` to the data source (prioritized replay)."""

    def __init__(self, source: Any) -> None:
        super().__init__("source_feedback_after_iter", "after_iter")
        self._source = source

    def __call__(self, learner: BaseLearner) -> None:
        self._source.feedback(learner.priority_info)


class BroadcastStateHook(LearnerHook):
    """Learner groups: every rank takes rank 0's policy state (after rank 0 loaded its checkpoint,
    before the first publication), so all ranks start identical."""

    def __init__(self, group: LearnerGroup) -> None:
        super().__init__("broadcast_state_before_run", "before_run")
        self._group = group

    def __call__(self, learner: BaseLearner) -> None:
        self._group.broadcast_state(learner.policy)


class SendInfoHook(LearnerHook):
    """Send ``learner_info`` events (train iter, env steps, buffer and throughput figures), and
    their figures to TensorBoard (``learner_info/*``) at most every ``tb_every_s`` seconds: a DQN
    learner reports 20 times a second, and writing each report's ~19 scalars made 151,000 of a
    MountainCar run's 181,000 TensorBoard records, most of its coordinator's CPU (tensorboard's
    TF-less writer checksums every record in Python)."""

    def __init__(self, conn: redis.Redis, exp: str, task_id: str, freq: int, stats: Callable[[], dict[str, Any]],
                 tb_every_s: float = 1.0) -> None:
        super().__init__("send_info_after_iter", "after_iter", freq=freq)
        self._conn, self._exp, self._task_id, self._stats = conn, exp, task_id, stats
        self._tb_every_s, self._tb_at = float(tb_every_s), -math.inf
        self._unwritten: Optional[tuple[dict[str, Any], int]] = None  # the last figures kept from TensorBoard

    def __call__(self, learner: BaseLearner) -> None:
        info = {k: v for k, v in learner.learn_info.items() if isinstance(v, (int, float, bool, str))}
        stats = self._stats()
        info.update(stats)
        events.emit(self._conn, self._exp, "learner_info", self._task_id, "learner", **info)
        self._unwritten = (stats, learner.train_iter)
        now = time.monotonic()
        if now - self._tb_at >= self._tb_every_s:
            self._tb_at = now
            self.write_unwritten(learner)

    def write_unwritten(self, learner: BaseLearner) -> None:
        """Write the last report's figures to TensorBoard (policy lag, stale data, buffer figures
        against train_iter) unless they were; also after the run (:class:`SendInfoAfterRunHook`)."""
        if self._unwritten is not None and learner.tb_logger is not None:
            stats, train_iter = self._unwritten
            for k, v in stats.items():
                learner.tb_logger.add_scalar(f"learner_info/{k}", v, train_iter)
        self._unwritten = None


class SendInfoAfterRunHook(LearnerHook):
    """After the run: the last learner_info figures :class:`SendInfoHook` kept from TensorBoard
    (its once-per-interval limit), so a run's curves end at its end."""

    def __init__(self, send_info: SendInfoHook) -> None:
        super().__init__("send_info_after_run", "after_run")
        self._send_info = send_info

    def __call__(self, learner: BaseLearner) -> None:
        self._send_info.write_unwritten(learner)


def periodic_ckpt_hooks(hook_cfg: Any) -> list[LearnerHook]:
    """The after-iteration checkpoint hook of ``learner.hook`` (``save_ckpt_after_iter`` iterations,
    ``save_ckpt_every_s`` seconds), or none when both are 0."""
    every_s = float(hook_cfg.get("save_ckpt_every_s", 0.0))
    if hook_cfg.save_ckpt_after_iter > 0 or every_s > 0:
        return [SaveCkptHook("after_iter", hook_cfg.save_ckpt_after_iter, every_s)]
    return []


def build_hooks(hook_cfg: Any) -> list[LearnerHook]:
    """The standard hooks from ``learner.hook`` config (as the seed's build_learner_hook_by_cfg),
    in the order they run: a checkpoint saved before the log line that shows its iteration."""
    hooks: list[LearnerHook] = []
    if hook_cfg.load_ckpt_before_run:
        hooks.append(LoadCkptHook(hook_cfg.load_ckpt_before_run))
    hooks += periodic_ckpt_hooks(hook_cfg)
    if hook_cfg.log_show_after_iter > 0:
        hooks.append(LogShowHook(hook_cfg.log_show_after_iter))
    if hook_cfg.save_ckpt_after_run:
        hooks.append(SaveCkptHook("after_run"))
    return hooks
