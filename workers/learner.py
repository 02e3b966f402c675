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
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import redis
import torch
from easydict import EasyDict

from common import events, keys, serialization, spaces
from common.device import pick_device
from common.finite import check_train_step
from common.logs import ShippedScalars, build_logger, build_tb_writer, close_logger, shipped_logger
from common.policy import Policy, algorithm_of, create_policy, export
from common.registry import LEARNER_REGISTRY, import_names
from common.connection import is_sentinel
from common.finite import check_arrays
from workers.comm_learner import BufferReader, checkpoint_bytes, load_checkpoint, put_checkpoint, put_policy
from workers.ddp import LearnerGroup, join
from workers.learner_hooks import (BroadcastStateHook, FeedbackHook, LearnerHook, PhaseHook, PublishPolicyHook,
                                   SendInfoHook, build_hooks)
from workers.sources import create_source
from workers.task import check_current, task_connection, task_namespace, task_scope, validate_task


class CheckpointStore:
    """Where a learner's checkpoints go: Redis (parallel mode) or files (when no Redis is given).

    ``writable`` False: loads only (ranks other than 0 of a learner group, workers/ddp.py, whose
    state is rank 0's; rank 0 alone saves). Through Sentinel the bytes of the last save of each
    name are kept, so :meth:`resave` can put them back on a new primary after a failover (one
    copy of each checkpoint in memory).
    """

    def __init__(self, conn: Optional[redis.Redis], exp: str, ckpt_dir: Path, lease_key: Optional[str] = None,
                 writable: bool = True, logger: Optional[logging.Logger] = None) -> None:
        self._conn, self._exp, self._dir, self._lease = conn, exp, ckpt_dir, lease_key
        self._writable = writable
        self.logger = logger
        self._keep = conn is not None and is_sentinel(conn)
        self._last: dict[str, tuple[bytes, int]] = {}  # name -> (bytes, train_iter), kept through Sentinel
        self._lock = threading.Lock()  # a save on the trainer thread vs a resave after a failover

    def save(self, name: str, state: dict[str, Any], train_iter: int) -> None:
        if not self._writable:
            return
        if self._conn is not None:
            payload = checkpoint_bytes(state, f"checkpoint {keys.ckpt(self._exp, name)} at train iter {train_iter}")
            with self._lock:
                self._put(name, payload, train_iter)
                if self._keep:
                    self._last[name] = (payload, train_iter)
        else:
            self._dir.mkdir(parents=True, exist_ok=True)
            torch.save(state, self._dir / f"{name}.pth")

    def _put(self, name: str, payload: bytes, train_iter: int) -> None:
        acked = put_checkpoint(self._conn, self._exp, name, payload, train_iter, lease_key=self._lease)
        if acked == 0 and self.logger is not None:
            self.logger.warning("checkpoint %s (train iter %d) is not on a replica yet (WAIT timed out)",
                                 keys.ckpt(self._exp, name), train_iter)

    def resave(self) -> None:
        """Write the last saved checkpoints again (after a failover: the new primary may lack them)."""
        with self._lock:
            for name, (payload, train_iter) in self._last.items():
                self._put(name, payload, train_iter)
                if self.logger is not None:
                    self.logger.warning("checkpoint %s (train iter %d) written again after the failover",
                                         keys.ckpt(self._exp, name), train_iter)

    def load(self, name: str, device: torch.device) -> Optional[dict[str, Any]]:
        if self._conn is not None:
            return load_checkpoint(self._conn, self._exp, name, map_location=device)
        path = self._dir / f"{name}.pth"
        return torch.load(path, map_location=device, weights_only=True) if path.exists() else None


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
        logger: where log lines go, or None for a file under ``{log_dir}``. A learner task passes
            a shipped logger and shipped scalars (common/logs.py): its lines and scalars reach the
            coordinator's run folder, whatever machine and folder the worker runs in.
    """

    def __init__(self, cfg: EasyDict, policy: Optional[Policy] = None, tb_logger: Any = None,
                 exp_name: str = "default_experiment", instance_name: str = "learner",
                 checkpoint_store: Optional[CheckpointStore] = None, log_dir: Optional[str] = None,
                 logger: Optional[logging.Logger] = None) -> None:
        self._cfg = cfg
        self._exp_name = exp_name
        self._instance_name = instance_name
        log_dir = log_dir or f"./{exp_name}/log/{instance_name}"
        self._logger = logger if logger is not None else build_logger(log_dir, instance_name)
        self._tb_logger = tb_logger if tb_logger is not None else build_tb_writer(log_dir)
        self._ckpt_store = checkpoint_store or CheckpointStore(None, exp_name, Path(f"./{exp_name}/ckpt"))
        self._ckpt_name: Optional[str] = None
        self._hooks: dict[str, list[LearnerHook]] = {p: [] for p in ("before_run", "before_iter", "after_iter", "after_run")}
        for hook in build_hooks(cfg.hook):
            self.register_hook(hook)
        self._log_buffer: dict[str, Any] = {"scalar": defaultdict(list)}
        self._train_iter = 0
        self._consumed_env_steps = 0
        self._end_flag = False
        self._learner_done = False
        self._priority_info: dict[str, Any] = {}
        self.get_data: Callable[[], Optional[dict[str, np.ndarray]]] = lambda: None
        if policy is not None:
            self.policy = policy

    # -- hooks -----------------------------------------------------------------------------
    def register_hook(self, hook: LearnerHook) -> None:
        """Add ``hook`` at its position, ordered by priority (lower first)."""
        self._hooks[hook.position].append(hook)
        self._hooks[hook.position].sort(key=lambda h: h.priority)

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
        check_train_step(self._policy, log_vars, self._train_iter + 1)
        self._log_buffer["scalar"]["train_time"].append(time.perf_counter() - t0)
        for k, v in log_vars.items():
            self._log_buffer["scalar"][k].append(float(v))
        self._train_iter += 1
        self.call_hook("after_iter")
        return log_vars

    def start(self) -> None:
        """Parallel-mode entry: before_run hooks, train until ``get_data`` returns None, after_run hooks.

        If an iteration raises, the ``latest`` checkpoint is saved before the error propagates
        (the seed's ``auto_checkpoint``), so a replacement learner loses nothing.
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
            self.info("iteration failed; saving checkpoint 'latest' before re-raising")
            try:
                self.save_checkpoint_now("latest")
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
        """Save checkpoint ``name``; ``final`` also saves ``final_model`` (the acting weights with what
        ``rqrl eval`` needs to rebuild the policy, which the coordinator copies to ``final.pt``
        without importing torch; see common/policy/export.py)."""
        self._ckpt_store.save(name, self.checkpoint_state(), self._train_iter)
        if name == "final":
            self._ckpt_store.save("final_model", export.bundle(self._policy, self._train_iter), self._train_iter)

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
        if self._cfg.log_policy:
            self.info(f"policy: {type(policy).__name__} on {policy.device}")

    @property
    def ckpt_name(self) -> Optional[str]:
        return self._ckpt_name

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


class PolicyPublisher:
    """Publishes collector weights (:func:`~workers.comm_learner.put_policy`) and keeps the last
    publication's bytes, so :meth:`republish` can put the newest version back on a new primary
    after a failover (from the buffer reader's thread: bytes only, no torch)."""

    def __init__(self, conn: redis.Redis, exp: str, policy_id: str, lease_key: str) -> None:
        self._conn, self._exp, self._policy_id, self._lease = conn, exp, policy_id, lease_key
        self._last: Optional[tuple[bytes, int, int, int]] = None  # payload, version, envstep_limit, envstep
        self._lock = threading.Lock()

    def publish(self, weights: dict[str, Any], train_iter: int, envstep_limit: int, envstep: int) -> None:
        check_arrays(weights, f"policy version {train_iter} for {keys.policy(self._exp, self._policy_id)}")
        payload = serialization.dumps(weights)
        with self._lock:
            self._last = (payload, train_iter, int(envstep_limit), int(envstep))
            put_policy(self._conn, self._exp, self._policy_id, payload, train_iter, envstep_limit, self._lease, envstep)

    def republish(self) -> Optional[int]:
        """Publish the last version again; returns it (None when nothing was published yet)."""
        with self._lock:
            if self._last is None:
                return None
            payload, version, limit, envstep = self._last
            put_policy(self._conn, self._exp, self._policy_id, payload, version, limit, self._lease, envstep)
            return version


def _sched_s() -> tuple[float, float]:
    """Seconds the calling thread has run on a CPU and waited, runnable, for one (Linux
    ``/proc/thread-self/schedstat``: the scheduler's run and run-queue times); zeros elsewhere."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            run_ns, wait_ns, _ = f.read().split()
        return int(run_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return 0.0, 0.0


def run_learner_task(task: dict) -> dict[str, Any]:
    """RQ job function for queue ``learner``: train until the experiment's stop flag.

    Args:
        task: plain dict from :meth:`coordinator.commander.SoloCommander.get_learner_task`;
            ``resume`` true loads checkpoint ``latest`` (a replacement after a failure).

    Returns:
        The learner's ``learn_info`` plus ``buffer_id`` (also sent as a ``finished`` event).

    Raises:
        workers.task.TaskError: a malformed task. Any error is also reported as a ``failed``
        event naming the task, then re-raised so RQ marks the job failed.
    """
    cfg = validate_task(task, "learner")
    conn = task_connection(task)
    check_current(conn, task)
    # A fatal error (non-finite weights, say) would fail a replacement the same way: the run stops.
    with task_scope(conn, task, "learner", cfg,
                    lambda e: {"buffer_id": task["buffer_id"], "fatal": bool(getattr(e, "fatal", False))}):
        return _run_learner(conn, cfg, task)




def _run_learner(conn: redis.Redis, cfg: EasyDict, task: dict) -> dict[str, Any]:
    exp, task_id = task_namespace(task), task["task_id"]
    rank, world_size = int(task.get("rank", 0)), int(task.get("world_size", 1))
    threads = int(os.environ.get("RQRL_TORCH_THREADS", "1"))
    torch.set_num_threads(threads)
    torch.manual_seed(int(task.get("seed", 0)))
    events.emit(conn, exp, "started", task_id, "learner", host=socket.gethostname(), pid=os.getpid(), rank=rank)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    device: Optional[str] = None
    group: Optional[LearnerGroup] = None
    if world_size > 1:
        dev = pick_device(cfg, None)
        if dev.type == "cuda":  # one GPU per rank of this host
            dev = torch.device("cuda", rank % torch.cuda.device_count())
        device = str(dev)
        group = join(conn, exp, task["group_id"], rank, world_size, float(cfg.policy.learn.learner.group_timeout), dev)
        if rank != 0:  # rank 0 alone checkpoints
            cfg.policy.learn.learner.hook.save_ckpt_after_iter = 0
            cfg.policy.learn.learner.hook.save_ckpt_after_run = False
    try:
        return _train(conn, cfg, task, spec, device, group)
    finally:
        if group is not None:
            group.close()


def _train(conn: redis.Redis, cfg: EasyDict, task: dict, spec: Any, device: Optional[str],
           group: Optional[LearnerGroup]) -> dict[str, Any]:
    exp, task_id = task_namespace(task), task["task_id"]
    lead = group is None or group.rank == 0  # publishes, checkpoints and reports
    policy = create_policy(cfg, spec, modes=("learn",), device=device)
    if task.get("resume"):
        cfg.policy.learn.learner.hook.load_ckpt_before_run = "latest"
    lease_key = keys.lease(exp, task_id)
    name = "learner" if lead else f"learner_rank{group.rank}"
    # Lines and scalars go to the coordinator's run folder through Redis: the worker's own folder
    # (any machine, any cwd) gets nothing.
    logger = shipped_logger(conn, exp, task_id, "learner", name)
    try:
        store = CheckpointStore(conn, exp, Path(), lease_key=lease_key, writable=lead)
        learner = create_learner(cfg, policy=policy, exp_name=exp, instance_name=name, checkpoint_store=store,
                                 logger=logger, tb_logger=ShippedScalars(conn, exp, task_id, "learner"))
        store.logger = learner.logger  # the learner's log, for what a failover costs a checkpoint
        return _train_with(conn, cfg, task, spec, group, policy, learner, store, lease_key)
    finally:
        close_logger(logger)


def _train_with(conn: redis.Redis, cfg: EasyDict, task: dict, spec: Any, group: Optional[LearnerGroup],
                policy: Policy, learner: "BaseLearner", store: CheckpointStore, lease_key: str) -> dict[str, Any]:
    """Wire the data source, hooks and buffer reader to ``learner``, train until the stop, report."""
    exp, task_id = task_namespace(task), task["task_id"]
    lead = group is None or group.rank == 0
    source = create_source(algorithm_of(cfg).data_source, conn, exp, learner, cfg, policy.schema(),
                           int(task.get("seed", 0)), spec, group_size=1 if group is None else group.world_size)
    lcfg = cfg.policy.learn.learner
    # before_run hooks run by priority: loading a checkpoint (20) precedes the group's state
    # broadcast (25) and the first publication (30), so collectors start from the resumed weights.
    send_freq = 1 if source.publish_every_iter else lcfg.send_policy_freq
    publisher = PolicyPublisher(conn, exp, task["policy_id"], lease_key)
    if lead:
        for position, freq in (("before_run", 1), ("after_iter", send_freq)):
            learner.register_hook(PublishPolicyHook(publisher, position, freq, source.envstep_limit))
        # After the first publication (priority 30).
        learner.register_hook(PhaseHook(conn, exp, "first_policy", "before_run", 31))
    first_step = PhaseHook(conn, exp, "first_train_step", "after_iter", 5, record=lead)
    learner.register_hook(first_step)
    t_start, cpu_start, sched_start = time.time(), time.process_time(), _sched_s()

    def stats() -> dict[str, Any]:
        r = source.reader
        elapsed = max(1e-9, time.time() - t_start)
        out = {**source.stats(), "chunks": r.chunks if r else 0, "expired": r.expired if r else 0,
               "corrupt": r.corrupt if r else 0, "malformed": r.malformed if r else 0,
               "redelivered": r.redelivered if r else 0,
               **(r.policy_lag() if r else {}), "wait_share": round(source.wait_seconds / elapsed, 4),
               "train_iter_per_sec": round(learner.train_iter / elapsed, 2),
               # Seconds since the first train iteration (train_iter / train_s: the training speed).
               "train_s": round(time.time() - first_step.at, 3) if first_step.at else 0.0,
               # Share of the time the training thread was ready to run but waited for a CPU:
               # what the other processes on the machine (collectors, evals) cost it.
               "sched_wait_share": round((_sched_s()[1] - sched_start[1]) / elapsed, 4),
               "cpu_s": round(time.process_time() - cpu_start, 2)}  # the learner process's CPU seconds
        if group is not None:  # rank 0's own share of the data, and the cost of averaging gradients
            out.update(learner_num=group.world_size, allreduce_share=round(group.allreduce_seconds / elapsed, 4))
        return out

    # On-policy iterations are whole rollouts: report each one (the commander's eval triggers count them).
    info_freq = 1 if source.publish_every_iter else lcfg.send_info_freq
    if lead:
        learner.register_hook(SendInfoHook(conn, exp, task_id, info_freq, stats))
    learner.get_data = source
    if group is not None:
        group.attach(policy)
        learner.register_hook(BroadcastStateHook(group))
        learner.get_data = group.agree(source)
    learner.register_hook(FeedbackHook(source))

    def after_failover() -> None:
        """A new primary may lack the newest policy version and checkpoints (asynchronous
        replication): put them back, so collectors waiting for a version are released."""
        if lead:
            version = publisher.republish()
            learner.logger.warning("after the failover: policy version %s published again", version)
            store.resave()

    reader = BufferReader(conn, exp, task["buffer_id"], task_id, source.store, learner.logger, source.notify, lease_key,
                          train_iter=lambda: learner.train_iter, claim_orphans=lead, on_failover=after_failover)
    source.reader = reader
    reader.start()
    try:
        learner.start()
    except BaseException:
        reader.stop()
        reader.join(timeout=5)
        learner.close()
        raise
    # The reader ends after its current blocking read (up to its block_ms): the run's wrap-up
    # waits for this report, not for that read, so it is joined after the report.
    reader.stop()
    learner.close()
    info = dict(learner.learn_info, buffer_id=task["buffer_id"], **stats())
    events.emit(conn, exp, "finished", task_id, "learner", **info)
    reader.join(timeout=5)
    return info
