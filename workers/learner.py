"""Learner tasks: train the policy from the replay buffer, publish weights, report progress.

``rq worker learner`` runs :func:`run_learner_task`. Inside, :class:`BaseLearner` keeps the
seed's contract (hooks at ``before_run`` / ``before_iter`` / ``after_iter`` / ``after_run``;
``train``, ``start``, ``save_checkpoint``, ``learn_info``, ``priority_info``,
``register_hook``, :func:`create_learner`)::

    learner.start():
        call_hook("before_run")            # load checkpoint, publish the initial policy
        while (batch := learner.get_data()) is not None:   # None at the stop flag
            learner.train(batch)           # before_iter hooks, policy.learn(batch), after_iter hooks
        call_hook("after_run")             # save the final checkpoint

Data arrives through a background :class:`~workers.comm_learner.BufferReader`; ``get_data`` is
the data source the algorithm chose (workers/sources/): a replay buffer under the replay-ratio
limiter, or on-policy rollouts of the current policy version only. Nothing here knows which
algorithm trains: the policy's ``learn`` / ``get_weights`` / ``state_dict`` are all it calls.

A learner task's learner is built in one place, :func:`assemble`: its :class:`LearnerRole`
(lead or not, its checkpoint name, what it resumes from) is decided once from the task, its
hooks are :func:`task_hooks`' list in the order they run, publication is
workers/publication.py's and checkpoints are workers/checkpoints.py's. The config is only read.

A task with ``rank`` / ``world_size`` / ``group_id`` (``policy.learn.learner_num`` > 1) is one
rank of a data-parallel learner group (workers/ddp.py): it joins the group first, averages
gradients in its optimizers' step pre-hooks, takes rank 0's state before the run and agrees
with the other ranks on every batch; rank 0 alone publishes, checkpoints and sends
``learner_info``.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import redis
import torch
from easydict import EasyDict

from common import events, keys, spaces
from common.config import is_deterministic
from common.data_shards import task_stores
from common.device import pick_device
from common.finite import StepCheck
from common.logs import ShippedScalars, build_logger, build_tb_writer, close_logger, shipped_logger
from common.messages import LearnerTask
from common.policy import Policy, create_policy, export
from common.registry import LEARNER_REGISTRY, import_names
from workers.checkpoints import CheckpointStore
from workers.comm_learner import BufferReader, ShardReaders
from workers.ddp import LearnerGroup, join
from workers.learner_hooks import (BroadcastStateHook, FeedbackHook, LearnerHook, LoadCkptHook, LogShowHook,
                                   PhaseHook, PublishPolicyHook, SaveCkptHook, SendInfoAfterRunHook, SendInfoHook,
                                   build_hooks, periodic_ckpt_hooks)
from workers.publication import PolicyPublisher
from workers.sources import DataSource, create_source
from workers.task import TaskContext, open_task, task_scope


@LEARNER_REGISTRY.register("base")
class BaseLearner:
    """Base class for policy learning (the seed's BaseLearner; see module docstring for the loop).

    Args:
        cfg: the ``policy.learn.learner`` config section.
        policy: a policy with learn mode enabled (may be set later via ``learner.policy = ...``).
        tb_logger: a SummaryWriter, or None to create one under ``{log_dir}``.
        exp_name: experiment name (output under ``./{exp_name}/``).
        instance_name: log file / TensorBoard name.
        checkpoint_store: where checkpoints go (files under ``./{exp_name}/ckpt`` by default).
        hooks: the hooks in the order they run (each at its position); None: the standard ones
            of ``cfg.hook`` (:func:`~workers.learner_hooks.build_hooks`), as the seed.
        resume_ckpt: the name of this learner's own resumable checkpoint, saved every
            ``save_ckpt_after_iter`` iterations, after the run and when an iteration fails.
        logger: where log lines go, or None for a file under ``{log_dir}``. A learner task passes
            a shipped logger and shipped scalars (common/logs.py): its lines and scalars reach the
            coordinator's run folder, whatever machine and folder the worker runs in.
    """

    def __init__(self, cfg: EasyDict, policy: Optional[Policy] = None, tb_logger: Any = None,
                 exp_name: str = "default_experiment", instance_name: str = "learner",
                 checkpoint_store: Optional[CheckpointStore] = None, log_dir: Optional[str] = None,
                 logger: Optional[logging.Logger] = None, hooks: Optional[Sequence[LearnerHook]] = None,
                 resume_ckpt: str = "latest") -> None:
        self._cfg = cfg
        self._exp_name = exp_name
        self._instance_name = instance_name
        log_dir = log_dir or f"./{exp_name}/log/{instance_name}"
        self._logger = logger if logger is not None else build_logger(log_dir, instance_name)
        self._tb_logger = tb_logger if tb_logger is not None else build_tb_writer(log_dir)
        self._ckpt_store = checkpoint_store or CheckpointStore(None, exp_name, Path(f"./{exp_name}/ckpt"))
        self._ckpt_name: Optional[str] = None
        self._resume_ckpt = resume_ckpt
        self._hooks: dict[str, list[LearnerHook]] = {p: [] for p in ("before_run", "before_iter", "after_iter", "after_run")}
        for hook in build_hooks(cfg.hook) if hooks is None else hooks:
            self.register_hook(hook)
        self._log_buffer: dict[str, Any] = {"scalar": defaultdict(list)}
        self._train_iter = 0
        self._consumed_env_steps = 0
        self._end_flag = False
        self._learner_done = False
        self._priority_info: dict[str, Any] = {}
        self.get_data: Callable[[], Optional[dict[str, np.ndarray]]] = lambda: None
        self._step_check: Optional[StepCheck] = None
        if policy is not None:
            self.policy = policy

    # -- hooks -----------------------------------------------------------------------------
    def register_hook(self, hook: LearnerHook) -> None:
        """Add ``hook`` at its position, after the hooks registered there before it."""
        self._hooks[hook.position].append(hook)

    def call_hook(self, name: str) -> None:
        """Run the hooks registered at ``name`` (after_iter ones only when their ``freq`` is due)."""
        for hook in self._hooks[name]:
            if hook.due(self):
                hook(self)

    # -- training ----------------------------------------------------------------------------
    def train(self, data: dict[str, np.ndarray], envstep: int = -1) -> dict[str, Any]:
        """One train iteration on ``data`` (arrays per ``policy.schema()``).

        Returns:
            The policy's log vars (``priority``, if any, moved to :attr:`priority_info`).
        """
        if envstep >= 0:
            self._consumed_env_steps = envstep
        self.call_hook("before_iter")
        t0 = time.perf_counter()
        log_vars = self._policy.learn(data)
        priority = log_vars.pop("priority", None)
        self._priority_info = {"priority": priority} if priority is not None else {}
        if self._step_check is None:  # built at the first iteration: after a learner group's attach
            self._step_check = StepCheck(self._policy)
        self._step_check(log_vars, self._train_iter + 1)
        self._log_buffer["scalar"]["train_time"].append(time.perf_counter() - t0)
        for k, v in log_vars.items():
            self._log_buffer["scalar"][k].append(float(v))
        self._train_iter += 1
        self.call_hook("after_iter")
        return log_vars

    def start(self) -> None:
        """Parallel-mode entry: before_run hooks, train until ``get_data`` returns None, after_run hooks.

        If an iteration raises, the resumable checkpoint (``resume_ckpt``) is saved before the
        error propagates (the seed's ``auto_checkpoint``), so a replacement learner loses nothing.
        """
        self._end_flag = False
        self._learner_done = False
        self.call_hook("before_run")
        try:
            limit = int(self._cfg.train_iterations)
            for _ in (range(limit) if limit > 0 else itertools.count()):
                t0 = time.perf_counter()
                data = self.get_data()
                self._log_buffer["scalar"]["data_time"].append(time.perf_counter() - t0)
                if data is None or self._end_flag:
                    break
                self.train(data)
        except Exception:
            self.info(f"iteration failed; saving checkpoint {self._resume_ckpt!r} before re-raising")
            try:
                self.save_checkpoint_now(self._resume_ckpt)
            except Exception as e:  # the original error matters more
                self.info(f"emergency checkpoint failed: {e}")
            raise
        self._learner_done = True
        self.call_hook("after_run")

    def close(self) -> None:
        """Flush and close the TensorBoard writer, and flush the log (shipped lines are sent now,
        before the task reports its end)."""
        if self._end_flag:
            return
        self._end_flag = True
        if self._tb_logger is not None:
            self._tb_logger.flush()
            self._tb_logger.close()
        for handler in self._logger.handlers:
            handler.flush()

    # -- checkpoints ---------------------------------------------------------------------------
    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a replacement learner needs: policy state, train_iter, collector env steps."""
        return {"policy": self._policy.state_dict(), "train_iter": self._train_iter,
                "consumed_env_steps": self._consumed_env_steps}

    def save_checkpoint_now(self, name: str) -> None:
        """Save checkpoint ``name``; the player's final checkpoint (``final`` for the solo commander's,
        :func:`common.keys.final_ckpt_name`) also saves its ``final_model`` (the acting weights with
        what ``rqrl eval`` needs to rebuild the policy, which the coordinator copies to ``final.pt``
        without importing torch; see common/policy/export.py)."""
        self._ckpt_store.save(name, self.checkpoint_state(), self._train_iter)
        if name == keys.final_ckpt_name(self._resume_ckpt):
            self._ckpt_store.save(keys.final_ckpt_name(self._resume_ckpt, model=True),
                                  export.bundle(self._policy, self._train_iter), self._train_iter)

    def save_checkpoint(self, ckpt_name: Optional[str] = None) -> None:
        """Run the ``save_ckpt_after_run`` hook now (as the seed); ``ckpt_name`` overrides ``final``.

        Raises:
            RuntimeError: no ``save_ckpt_after_run`` hook is registered.
        """
        hooks = [h for h in self._hooks["after_run"] if h.name == "save_ckpt_after_run"]
        if not hooks:
            raise RuntimeError("save_checkpoint needs the 'save_ckpt_after_run' hook (learner.hook.save_ckpt_after_run)")
        self._ckpt_name = ckpt_name
        try:
            hooks[0](self)
        finally:
            self._ckpt_name = None

    def load_checkpoint(self, name: str) -> bool:
        """Restore policy, train_iter and consumed_env_steps from checkpoint ``name``; False if absent."""
        state = self._ckpt_store.load(name, self._policy.device)
        if state is None:
            self.info(f"no checkpoint {name!r} to load; starting fresh")
            return False
        self._policy.load_state_dict(state["policy"])
        self._train_iter = int(state["train_iter"])
        self._consumed_env_steps = events.consumed_env_steps(state)
        self.info(f"loaded checkpoint {name!r}: train_iter {self._train_iter}, envstep {self._consumed_env_steps}")
        return True

    # -- properties ----------------------------------------------------------------------------
    @property
    def learn_info(self) -> dict[str, Any]:
        """Info for the commander: ``train_iter``, ``consumed_env_steps``, ``learner_done``."""
        return {"train_iter": self._train_iter, "consumed_env_steps": self._consumed_env_steps,
                "learner_done": self._learner_done}

    @property
    def priority_info(self) -> dict[str, Any]:
        """The last iteration's ``priority`` (float32 (B,), |TD error|) for prioritised replay."""
        return self._priority_info

    @priority_info.setter
    def priority_info(self, value: dict[str, Any]) -> None:
        self._priority_info = value

    @property
    def consumed_env_steps(self) -> int:
        return self._consumed_env_steps

    @consumed_env_steps.setter
    def consumed_env_steps(self, value: int) -> None:
        self._consumed_env_steps = int(value)

    @property
    def train_iter(self) -> int:
        """Train iterations done (the seed's ``last_iter``); also the next policy version."""
        return self._train_iter

    @property
    def policy(self) -> Policy:
        return self._policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self._policy = policy
        self._step_check = None
        if self._cfg.log_policy:
            self.info(f"policy: {type(policy).__name__} on {policy.device}")

    @property
    def ckpt_name(self) -> Optional[str]:
        """:meth:`save_checkpoint`'s name for the after-run save while it runs (None: the player's final)."""
        return self._ckpt_name

    @property
    def resume_ckpt(self) -> str:
        """The name of this learner's own resumable checkpoint (a learner task's ``ckpt_name``)."""
        return self._resume_ckpt

    @property
    def log_buffer(self) -> dict[str, Any]:
        return self._log_buffer

    @log_buffer.setter
    def log_buffer(self, value: dict[str, Any]) -> None:
        self._log_buffer = value

    @property
    def logger(self) -> logging.Logger:
        return self._logger

    @property
    def tb_logger(self) -> Any:
        return self._tb_logger

    @property
    def exp_name(self) -> str:
        return self._exp_name

    @property
    def instance_name(self) -> str:
        return self._instance_name

    def info(self, s: str) -> None:
        self._logger.info(s)


def create_learner(cfg: EasyDict, **kwargs: Any) -> BaseLearner:
    """Build the learner named by ``cfg.create.learner.type`` (default ``base``) from the full config.

    Raises:
        KeyError: unknown learner type (names it and lists the known ones).
    """
    create = cfg.get("create") or {}
    import_names(create.get("learner", {}).get("import_names", []))
    ltype = create.get("learner", {}).get("type", "base")
    return LEARNER_REGISTRY.build(ltype, cfg.policy.learn.learner, **kwargs)


def _sched_s() -> tuple[float, float]:
    """Seconds the calling thread has run on a CPU and waited, runnable, for one (Linux
    ``/proc/thread-self/schedstat``: the scheduler's run and run-queue times); zeros elsewhere."""
    try:  # os-level: a text-mode open() cost ~100 µs here, per learner_info event
        fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        try:
            run_ns, wait_ns, _ = os.read(fd, 256).split()
        finally:
            os.close(fd)
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def run_learner_task(task: dict) -> dict[str, Any]:
    """RQ job function for queue ``learner``: train until the experiment's stop flag.

    Args:
        task: the wire form of a :class:`common.messages.LearnerTask`
            (:meth:`coordinator.commander.SoloCommander.get_learner_task`); ``resume`` true loads
            its checkpoint ``ckpt_name`` (a replacement after a failure).

    Returns:
        The learner's ``learn_info`` plus ``buffer_id`` (also sent as a ``finished`` event).

    Raises:
        workers.task.TaskError: a malformed task. Any error is also reported as a ``failed``
        event naming the task, then re-raised so RQ marks the job failed.
    """
    ctx = open_task(task, "learner")
    buffer_id = ctx.task.buffer_id
    # A fatal error (non-finite weights, say) would fail a replacement the same way: the run stops.
    with task_scope(ctx, lambda e: {"buffer_id": buffer_id, "fatal": bool(getattr(e, "fatal", False))}):
        return _run_learner(ctx)


@dataclass(frozen=True)
class LearnerRole:
    """What a learner task's learner does, decided once from its task: config is input only,
    never written to tell other code.

    Attributes:
        lead: publishes weights, saves checkpoints and sends ``learner_info``: the only learner,
            or rank 0 of a data-parallel group (the other ranks train and report their end).
        ckpt_name: the learner's own resumable checkpoint, ``keys.ckpt(ns, ckpt_name)``: the
            task's ``ckpt_name``, "latest" when absent (the tasks of an older coordinator).
        resume_from: the checkpoint loaded before the run: ``ckpt_name`` for a replacement
            learner (the task's ``resume``), else ``learner.hook.load_ckpt_before_run``; None: none.
    """

    lead: bool
    ckpt_name: str = "latest"
    resume_from: Optional[str] = None

    @classmethod
    def of(cls, task: LearnerTask, hook_cfg: EasyDict) -> "LearnerRole":
        """The role of a learner task's learner (``hook_cfg``: ``policy.learn.learner.hook``)."""
        name = task.ckpt_name
        return cls(lead=not task.rank, ckpt_name=name,
                   resume_from=name if task.resume else (hook_cfg.load_ckpt_before_run or None))


class TrainStats:
    """The learner task's figures for its ``learner_info`` and ``finished`` events (call it):
    the data source's and buffer reader's counters, policy lag, rates and CPU shares since start."""

    def __init__(self, learner: BaseLearner, source: DataSource, group: Optional[LearnerGroup],
                 first_step: PhaseHook) -> None:
        self._learner, self._source, self._group, self._first_step = learner, source, group, first_step
        self._t0, self._cpu0, self._sched0 = time.time(), time.process_time(), _sched_s()

    def __call__(self) -> dict[str, Any]:
        r, source = self._source.reader, self._source
        elapsed = max(1e-9, time.time() - self._t0)
        out = {**source.stats(), "chunks": r.chunks if r else 0, "expired": r.expired if r else 0,
               "corrupt": r.corrupt if r else 0, "malformed": r.malformed if r else 0,
               "redelivered": r.redelivered if r else 0, "trimmed": r.trimmed if r else 0,
               **(r.policy_lag() if r else {}), "wait_share": round(source.wait_seconds / elapsed, 4),
               "train_iter_per_sec": round(self._learner.train_iter / elapsed, 2),
               # Seconds since the first train iteration (train_iter / train_s: the training speed).
               "train_s": round(time.time() - self._first_step.at, 3) if self._first_step.at else 0.0,
               # Share of the time the training thread was ready to run but waited for a CPU:
               # what the other processes on the machine (collectors, evals) cost it.
               "sched_wait_share": round((_sched_s()[1] - self._sched0[1]) / elapsed, 4),
               "cpu_s": round(time.process_time() - self._cpu0, 2)}  # the learner process's CPU seconds
        if self._group is not None:  # rank 0's own share of the data, and the cost of averaging gradients
            out.update(learner_num=self._group.world_size,
                       allreduce_share=round(self._group.allreduce_seconds / elapsed, 4))
        return out


def task_hooks(lcfg: EasyDict, role: LearnerRole, conn: redis.Redis, ns: str, task_id: str,
               publisher: PolicyPublisher, source: DataSource, group: Optional[LearnerGroup],
               first_step: PhaseHook, stats: Callable[[], dict[str, Any]]) -> list[LearnerHook]:
    """A learner task's hooks, in the order they run (``lcfg``: ``policy.learn.learner``)::

        before_run  load_ckpt (role.resume_from) · broadcast_state (a group) ·
                    publish_policy (lead) · phase first_policy (lead)
        after_iter  phase first_train_step · source_feedback · save_ckpt (lead, every save_ckpt_after_iter
                    iterations or save_ckpt_every_s seconds) ·
                    publish_policy (lead, every send_policy_freq) · log_show (every log_show_after_iter) ·
                    send_info (lead, every send_info_freq)
        after_run   save_ckpt (lead): final, then role.ckpt_name · send_info (lead: the last
                    learner_info figures TensorBoard did not get)

    The group takes rank 0's weights after it loaded its checkpoint and before they are first
    published, so collectors start from the resumed weights, the same on every rank; the run
    phase ``first_policy`` follows that publication. A source whose every iteration is a whole
    rollout (``publish_every_iter``) publishes and reports every iteration.
    """
    hook_cfg = lcfg.hook
    send_freq, info_freq = (1, 1) if source.publish_every_iter else (lcfg.send_policy_freq, lcfg.send_info_freq)
    before_run: list[LearnerHook] = [LoadCkptHook(role.resume_from)] if role.resume_from else []
    if group is not None:
        before_run.append(BroadcastStateHook(group))
    after_iter: list[LearnerHook] = [first_step, FeedbackHook(source)]
    after_run: list[LearnerHook] = []
    if role.lead:
        before_run += [PublishPolicyHook(publisher, "before_run", 1, source.envstep_limit, wait=True),
                       PhaseHook(conn, ns, "first_policy", "before_run")]
        after_iter += periodic_ckpt_hooks(hook_cfg)
        after_iter.append(PublishPolicyHook(publisher, "after_iter", send_freq, source.envstep_limit))
        if hook_cfg.save_ckpt_after_run:
            after_run.append(SaveCkptHook("after_run"))
    if hook_cfg.log_show_after_iter > 0:
        after_iter.append(LogShowHook(hook_cfg.log_show_after_iter))
    if role.lead:
        send_info = SendInfoHook(conn, ns, task_id, info_freq, stats)
        after_iter.append(send_info)
        after_run.append(SendInfoAfterRunHook(send_info))
    return before_run + after_iter + after_run


@dataclass
class TaskLearner:
    """A learner task's learner with the parts its hooks and buffer reader share."""

    learner: BaseLearner
    source: DataSource
    publisher: PolicyPublisher
    store: CheckpointStore
    stats: TrainStats


def _instance_name(task: LearnerTask, role: LearnerRole) -> str:
    """The learner's log name: ``learner`` for the lead, ``learner_rank{r}`` for another rank."""
    return "learner" if role.lead else f"learner_rank{task.rank}"


def assemble(ctx: TaskContext, spec: Any, role: LearnerRole, logger: logging.Logger,
             group: Optional[LearnerGroup] = None, device: Optional[str] = None) -> TaskLearner:
    """Build a learner task's learner from its context (:func:`workers.task.open_task`): policy,
    checkpoint store, data source, publisher and :func:`task_hooks`; ``learner.get_data`` is the
    source (agreed on by a ``group``'s ranks). Reads ``ctx.cfg``, writes nothing to it; starts no thread."""
    conn, cfg, task, ns, task_id = ctx.conn, ctx.cfg, ctx.task, ctx.ns, ctx.task_id
    lease_key = keys.lease(ns, task_id)
    policy = create_policy(cfg, spec, modes=("learn",), device=device)
    name = _instance_name(task, role)
    store = CheckpointStore(conn, ns, Path(), lease_key=lease_key, writable=role.lead)
    learner = create_learner(cfg, policy=policy, exp_name=ns, instance_name=name, checkpoint_store=store,
                             logger=logger, tb_logger=ShippedScalars(conn, ns, task_id, "learner"), hooks=(),
                             resume_ckpt=role.ckpt_name)
    store.logger = learner.logger  # the learner's log, for what a failover costs a checkpoint
    source = create_source(ctx.algorithm.data_source, conn, ns, learner, cfg, policy.schema(),
                           task.seed or 0, spec, group_size=1 if group is None else group.world_size)
    publisher = PolicyPublisher(conn, ns, task.policy_id, lease_key)
    first_step = PhaseHook(conn, ns, "first_train_step", "after_iter", record=role.lead)
    stats = TrainStats(learner, source, group, first_step)
    for hook in task_hooks(cfg.policy.learn.learner, role, conn, ns, task_id, publisher, source, group,
                           first_step, stats):
        learner.register_hook(hook)
    learner.get_data = source
    if group is not None:
        group.attach(policy)
        learner.get_data = group.agree(source)
    return TaskLearner(learner, source, publisher, store, stats)


def _run_learner(ctx: TaskContext) -> dict[str, Any]:
    conn, cfg, task, ns, task_id = ctx.conn, ctx.cfg, ctx.task, ctx.ns, ctx.task_id
    rank, world_size = task.rank or 0, task.world_size or 1
    deterministic = is_deterministic(cfg)
    # Deterministic mode: one thread (reduction order) and torch's deterministic kernels.
    threads = 1 if deterministic else int(os.environ.get("RQRL_TORCH_THREADS", "1"))
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)
    torch.manual_seed(task.seed or 0)
    events.emit(conn, ns, "started", task_id, "learner", host=socket.gethostname(), pid=os.getpid(), rank=rank)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    role = LearnerRole.of(task, cfg.policy.learn.learner.hook)
    device: Optional[str] = None
    group: Optional[LearnerGroup] = None
    if world_size > 1:
        dev = pick_device(cfg, None)
        if dev.type == "cuda":  # one GPU per rank of this host
            dev = torch.device("cuda", rank % torch.cuda.device_count())
        device = str(dev)
        group = join(conn, ns, task.group_id, rank, world_size, float(cfg.policy.learn.learner.group_timeout), dev)
    # Lines and scalars go to the coordinator's run folder through Redis: the worker's own folder
    # (any machine, any cwd) gets nothing.
    logger = shipped_logger(conn, ns, task_id, "learner", _instance_name(task, role))
    try:
        return _train(ctx, role, assemble(ctx, spec, role, logger, group, device))
    finally:
        close_logger(logger)
        if group is not None:
            group.close()


def _train(ctx: TaskContext, role: LearnerRole, parts: TaskLearner) -> dict[str, Any]:
    """Run the buffer reader and ``parts.learner`` until the stop, then report ``finished``."""
    conn, task, ns, task_id = ctx.conn, ctx.task, ctx.ns, ctx.task_id
    learner, source = parts.learner, parts.source

    def after_failover() -> None:
        """A new primary may lack the newest policy version and checkpoints (asynchronous
        replication): put them back, so collectors waiting for a version are released."""
        if role.lead:
            version = parts.publisher.republish()
            learner.logger.warning("after the failover: policy version %s published again", version)
            parts.store.resave()

    stores = task_stores(conn, task.to_dict(), ns)  # one per data shard, or the control Redis's
    reader_kwargs = dict(train_iter=lambda: learner.train_iter, claim_orphans=role.lead, on_failover=after_failover)
    reader: BufferReader | ShardReaders
    if task.data_shards is None:
        reader = BufferReader(conn, ns, task.buffer_id, task_id, source.store, learner.logger, source.notify,
                              keys.lease(ns, task_id), store=stores[0], **reader_kwargs)
    else:
        reader = ShardReaders(conn, ns, task.buffer_id, task_id, source.store, learner.logger, source.notify,
                              keys.lease(ns, task_id), stores, **reader_kwargs)
    source.reader = reader
    reader.start()
    try:
        learner.start()
        parts.publisher.flush()  # the last version is written before the task reports finished
    except BaseException:
        reader.stop()
        reader.join(timeout=5)
        learner.close()
        raise
    finally:
        parts.publisher.close()
    # The reader ends after its current blocking read (up to its block_ms): the run's wrap-up
    # waits for this report, not for that read, so it is joined after the report.
    reader.stop()
    learner.close()
    info = dict(learner.learn_info, buffer_id=task.buffer_id, **parts.stats())
    events.emit(conn, ns, "finished", task_id, "learner", **info)
    reader.join(timeout=5)
    return info
