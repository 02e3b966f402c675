"""The coordinator daemon: runs a commander, dispatches its tasks on RQ, digests worker events.

``python -m coordinator CONFIG --redis-url URL`` (see coordinator/__main__.py) runs
:meth:`Coordinator.run`:

1. names the run and claims it (``rqrl:{exp}:coordinator``, a key with a TTL: one coordinator
   per run; ``{exp}`` is the run's namespace ``{exp_name}/{run_name}``, see
   :func:`common.keys.namespace`). The run name is given (``--run-name``; ``rqrl train`` always
   gives one) or, by default, that of the newest unfinished run of this experiment and seed in
   Redis (a coordinator restarted after a crash), else a new one, ``{UTC time}-s{seed}``
   (:func:`coordinator.runs.new_run_name`). If an unfinished run of that name is in Redis it
   resumes it: commander state and running tasks from Redis, un-acked events reclaimed with
   XAUTOCLAIM, running tasks adopted rather than duplicated. Otherwise (or with
   ``fresh=True``) it clears what an earlier run left and stamps a new run id;
2. loops: size the collector task space from the live collector workers (RQ's worker
   registry, counted twice a second: :func:`live_workers`), enqueue every task the commander
   hands out (job id = task id, explicit ``job_timeout``), read worker events from
   ``rqrl:{exp}:events`` through consumer group ``coordinator`` (XREADGROUP BLOCK, at most
   0.5 s), route them to the commander, and declare a task dead when its heartbeat key
   expires or RQ marks its job failed before it started (revoking its write lease, so a zombie
   cannot publish; the check itself runs on a thread, see :meth:`Coordinator._find_dead`).
   Commander state, running tasks and the events' acks are written in one MULTI/EXEC, so a
   crash at any point neither loses nor double-counts an event. Each new learner checkpoint
   (``rqrl:{exp}:ckpt:latest``) is also copied to the run folder (``ckpt/latest.pth`` and
   ``resume.json``), so ``--resume`` can continue the run after Redis lost it
   (:meth:`Coordinator._resume_from_folder`);
3. on convergence sets the stop flag, waits (``commander.finish_timeout`` seconds) for the
   learner's final checkpoint, writes ``./{exp_name}/{run_name}/final.pt`` and ``summary.json``
   (the run folder; ``./{exp_name}/latest`` links to the newest run) and exits 0;
   when ``max_env_step`` / ``max_train_iter`` / ``max_wall_seconds`` pass first it stops the
   run the same way and exits 2; SIGINT / SIGTERM stop it likewise and exit 130.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import redis
from easydict import EasyDict
from redis.exceptions import LockError
from redis.lock import Lock
from rq import Queue
from rq.job import Callback, Job, JobStatus

from common import blobstore, events, keys, lease, phases, serialization, server_limits, streams, worker_presence
from common.connection import primary_changes
from common.finite import NonFiniteError, check_arrays
from common.redis_memory import oom_reason
from common.rq_json import TaskSerializer
from common.logs import build_logger, build_tb_writer
from coordinator.commander import BaseCommander, create_commander
from coordinator.offload import DeferredScalars, offload_logging
from coordinator.bundles import EvalBundles
from coordinator.clocks import WorkerClocks
from coordinator.runs import link_latest, link_tensorboard, new_run_name, run_unfinished
from coordinator.stall import StallGuard

EXIT_CONVERGED, EXIT_ERROR, EXIT_LIMIT, EXIT_INTERRUPTED = 0, 1, 2, 130

_JOB_FUNC = {"collector": "workers.collector.run_collector_task", "learner": "workers.learner.run_learner_task"}
_QUEUE = {"collector": keys.COLLECTOR_QUEUE, "learner": keys.LEARNER_QUEUE}
_ALIVE_TTL_S = 6.0
# Events the coordinator has read stay this long on the stream (rqrl status, the launcher's
# progress line); unread ones are never trimmed. Eval results are kept whole in rqrl:{exp}:evals.
_EVENTS_RETENTION_S = 600.0
# Eval records kept in rqrl:{exp}:evals (newest; ~300 B each): the run folder's evals.jsonl has all.
_EVALS_KEPT = 2000
_TRIM_EVERY_S = 5.0
# How often the collector workers are counted (two round trips), so a worker that joins gets a
# task within about a second without the registry being read on every pass of the loop.
_WORKERS_EVERY_S = 0.5
# How often the collect setting is recomputed (and written when it changed): the bound on how
# stale a collector's setting can be, beside one loop pass (at most 0.5 s of blocking read).
_SETTING_EVERY_S = 0.2


def _fmt(value: Any) -> str:
    """An eval figure for the closing lines: 2 decimals, or ``-`` (no eval, or one that finished no episode)."""
    return f"{value:.2f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def eval_record(ev: dict[str, Any], run_id: str, envstep: int, wall_seconds: float) -> dict[str, Any]:
    """The record of one finished eval task (``rqrl:{exp}:evals``, ``evals.jsonl``) from its event.

    ``envstep`` (env steps collected so far) and ``wall_seconds`` (the run's wall clock: seconds
    since it started, pauses before a ``--resume`` not counted) are the coordinator's when it
    read the event; ``time`` is the coordinator's unix time at its receipt (one clock for the whole
    run, whatever the workers' clocks say). An eval that finished no episode has
    ``episodes`` 0 and no ``reward_mean`` / ``reward_std`` (never 0.0: there is no number).
    """
    rec: dict[str, Any] = {
        "task_id": ev["task_id"], "run_id": run_id, "envstep": envstep,
        "train_iter": ev.get("policy_version", 0), "policy_envstep": ev.get("policy_envstep", 0),
        "episodes": int(ev.get("real_episode_count") or 0), "confirmation": ev.get("confirmation") is True,
        "time": round(time.time(), 3), "wall_seconds": round(wall_seconds, 3)}
    reward = events.episode_figure(ev, "reward_mean")
    if reward is not None:
        rec.update(reward_mean=reward, reward_std=events.episode_figure(ev, "reward_std") or 0.0)
    return rec


def write_shipped_log(run_dir: Path, ev: dict[str, Any]) -> None:
    """Append a task's shipped log lines (a ``log`` event, common/logs.py) to the run folder's
    ``log/{name}/{name}.txt``, where a learner started in the run folder used to write them.

    Raises:
        ValueError: ``name`` is not one plain file name.
    """
    name = keys.check_path_component("log name", str(ev.get("name", "")))
    folder = run_dir / "log" / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.txt", "a") as f:
        f.write(str(ev.get("lines", "")) + "\n")


def write_shipped_scalars(tb: Any, ev: dict[str, Any]) -> None:
    """Hand a task's shipped TensorBoard scalars (a ``scalars`` event: a JSON list of
    ``[tag, value, step, walltime]``) to the run's writer, with their own wall times.

    Raises:
        ValueError: the field is not such a list.
    """
    for tag, value, step, walltime in json.loads(ev["scalars"]):
        tb.add_scalar(str(tag), float(value), int(step), walltime=float(walltime))


def _id_tuple(entry_id: bytes | str) -> tuple[int, int]:
    ms, _, seq = (entry_id.decode() if isinstance(entry_id, bytes) else entry_id).partition("-")
    return int(ms), int(seq or 0)


def live_workers(conn: redis.Redis, queue: Queue) -> int:
    """The ``rq worker`` processes listening on ``queue`` that are alive
    (:func:`common.worker_presence.count_live`): rqrl's workers by the alive key each refreshes
    every 10 s (TTL 30 s), so a Redis that lost RQ's registry still sees them and a worker that
    died stops counting within 30 s; stock ``rq worker`` processes by RQ's registry (a member
    counts while its RQ key exists: up to 90 s after a kill while it runs a job, 480 s idle).
    At most three round trips, whatever the number of workers.
    """
    return worker_presence.count_live(conn, queue.name)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file and a rename: a reader (or a crash) never finds half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


class CoordinatorError(RuntimeError):
    """The coordinator cannot run (e.g. another one owns the run)."""


class RunLost(CoordinatorError):
    """Mid-run, Redis no longer holds this coordinator's run (wiped, flushed, restarted without
    persistence) or another coordinator took it over: the wrap-up leaves Redis alone."""


class Coordinator:
    """One experiment's control loop (see module docstring).

    Args:
        cfg: the compiled config.
        conn: Redis client (bytes replies, as RQ needs).
        out_dir: where the run folder ``{exp_name}/{run_name}/`` (logs, final.pt, summary.json) is written.
        fresh: start a new run even if an unfinished one of this name is in Redis.
        run_name: the run's name; None picks one (module docstring).
        resume: continue run ``run_name``: from Redis when it is unfinished there, else from its
            run folder (:meth:`_resume_from_folder`).
        started_at: unix seconds where the run's clock starts (``rqrl train`` passes its launch,
            so its progress line and summary.json count the same seconds); default now. A run
            resumed from its folder counts on from its earlier wall seconds.
        done_fd: the write end of a pipe (``rqrl train``): the exit code is written there and it is
            closed once summary.json and final.pt are written, before curve.png is drawn.
    """

    def __init__(self, cfg: EasyDict, conn: redis.Redis, out_dir: Path | str = ".", fresh: bool = False,
                 run_name: Optional[str] = None, resume: bool = False, started_at: Optional[float] = None,
                 done_fd: Optional[int] = None) -> None:
        if resume and (fresh or not run_name):
            raise CoordinatorError("resuming needs the run's name and excludes --fresh")
        self.cfg = cfg
        self.fresh = fresh
        self.resume_from_disk = resume
        self.conn = conn
        self.exp_name = cfg.exp_name
        self.run_name = run_name or self._pick_run_name()
        self.exp = keys.namespace(self.exp_name, self.run_name)  # every key of the run is under it
        self.out = Path(out_dir) / self.exp
        self.name = f"coordinator-{socket.gethostname()}-{os.getpid()}"
        self.lock = Lock(conn, keys.coordinator_alive(self.exp), timeout=_ALIVE_TTL_S, thread_local=False)
        self.run_id = uuid.uuid4().hex[:12]
        self.log = build_logger(self.out / "log" / "commander", "coordinator", console=True)
        # The run's one TensorBoard event file: the commander's scalars and those the tasks ship
        # (common/logs.py), queued by the loop and written by a thread (coordinator/offload.py).
        self.tb = DeferredScalars(build_tb_writer(self.out / "tensorboard"))
        self.commander: BaseCommander = create_commander(cfg, tb_logger=self.tb, logger=self.log, run_id=self.run_id,
                                                         run_name=self.run_name)
        # JSON payloads: no worker ever unpickles what it reads from Redis (common/rq_json.py).
        self.queues = {kind: Queue(name, connection=conn, serializer=TaskSerializer) for kind, name in _QUEUE.items()}
        self.running: dict[str, dict[str, Any]] = {}
        self._signal: Optional[int] = None
        self.learner_final: dict[str, Any] = {}  # the learner's closing figures, for summary.json
        self.learner_last = {"train_iter": 0, "envstep": 0}  # its train_iter and env steps when it finished
        self._t0 = time.time() if started_at is None else float(started_at)
        self._next_liveness = 0.0
        self._next_summary = 0.0
        # Failures in a row per task kind: collectors that keep finishing must not hide a learner
        # that fails every time (nor the other way round).
        self._failures_in_a_row = {"collector": 0, "learner": 0}
        self._last_failure = ""
        self._dirty: set[str] = set()  # task ids whose record changed since the last _persist
        self._drop_leases: list[str] = []  # task ids whose leases the next _persist revokes
        self._stall = StallGuard(float(cfg.commander.heartbeat_timeout))  # a Redis stall is no worker death
        # The liveness pass runs on a thread; the tasks it finds dead wait here for the loop.
        self._dead: queue.SimpleQueue[list[tuple[str, str]]] = queue.SimpleQueue()
        self._stop_liveness = threading.Event()
        # Held while tasks are enqueued: the liveness pass never sees a task whose RQ job is not
        # written yet (it would read the job as gone).
        self._enqueue_lock = threading.Lock()
        self.resumed = False
        self._best_written: Optional[str] = None
        self._bundles = EvalBundles()  # eval bundles in Redis: pruned to what can still be exported
        self._clocks = WorkerClocks()  # workers whose clocks are off Redis's
        self._fatal = ""  # why the run must end now (a task failed in a way a retry cannot fix)
        self._oom = False  # Redis answered OOM: the wrap-up is best effort
        # Redis lost the run, or cannot be reached: the wrap-up writes the run folder from memory only.
        self._hands_off = False
        self._last_event_id = ""  # the newest event read and acked: trimming never passes it
        self._next_trim = 0.0
        self._new_evals: list[dict[str, Any]] = []  # eval results to store with the next _persist
        self.collector_workers: Optional[int] = None  # live collector workers at the last count
        self._next_workers = 0.0
        self.events_lost = ""  # how unread events were found trimmed, if they were
        self._ckpt_on_disk = -1  # version (train_iter) of the checkpoint copied to the run folder
        self._setting_sent = ""  # the collect setting last written to rqrl:{exp}:collect_setting (JSON)
        self._next_setting = 0.0
        self._done_fd = done_fd
        self.failovers: list[dict[str, Any]] = []  # Redis primary changes seen through Sentinel

    # ------------------------------------------------------------------ lifecycle
    def _pick_run_name(self) -> str:
        """The newest unfinished run of this experiment and seed in Redis (a restart), unless
        ``fresh``; else a new name, made unique in ``rqrl:runs`` (SADD answers who was first)."""
        suffix = f"-s{int(self.cfg.seed)}"
        if not self.fresh:
            for ns in sorted((n.decode() for n in self.conn.smembers(keys.runs())), reverse=True):
                exp_name, run_name = keys.split_namespace(ns)
                if exp_name == self.exp_name and run_name.endswith(suffix) and run_unfinished(self.conn, ns):
                    return run_name
        base, n = new_run_name(int(self.cfg.seed)), 1
        name = base
        while not self.conn.sadd(keys.runs(), keys.namespace(self.exp_name, name)):
            n += 1
            name = f"{base}-{n}"
        return name

    def _claim(self) -> None:
        key = keys.coordinator_alive(self.exp)
        # A killed coordinator's lock expires within _ALIVE_TTL_S; a live one keeps extending it.
        # The token is our name, so `rqrl status` and `redis-cli GET` show who owns the run.
        if not self.lock.acquire(blocking=True, blocking_timeout=_ALIVE_TTL_S + 1, token=self.name):
            owner = self.conn.get(key)
            raise CoordinatorError(
                f"run {self.exp!r} is owned by {owner.decode() if owner else '?'} (key {key}); "
                "stop it, or start another run (a different run name)")
        state_raw = self.conn.hget(keys.commander(self.exp), "state")
        run = self.conn.get(keys.run(self.exp))
        self.out.mkdir(parents=True, exist_ok=True)
        link_latest(self.out.parent, self.run_name)
        link_tensorboard(self.out.parent, self.run_name)
        if state_raw and run and not self.conn.exists(keys.stop(self.exp)) and not self.fresh:
            self._resume(json.loads(state_raw))
            return
        if self.resume_from_disk:
            self._resume_files()  # refuse before clearing anything
        stale = [k for k in self.conn.scan_iter(match=keys.all_keys_pattern(self.exp), count=1000) if k.decode() != key]
        if stale:
            self.conn.delete(*stale)
            self.log.info("cleared %d keys left by an earlier run of %s", len(stale), self.exp)
        if self.resume_from_disk:
            self._resume_from_folder()
        else:  # what an earlier run of this name left (as summary.json, which is rewritten)
            for old in (self.out / "evals.jsonl", self.out / "resume.json", self.out / "ckpt" / "latest.pth"):
                old.unlink(missing_ok=True)
        self.conn.set(keys.run(self.exp), self.run_id)
        self.conn.sadd(keys.runs(), self.exp)
        streams.ensure_group(self.conn, keys.events(self.exp), keys.COORDINATOR_GROUP, start_id="0")
        self._persist(self.conn.pipeline(transaction=True)).execute()

    def _resume(self, state: dict[str, Any]) -> None:
        """Adopt the unfinished run in Redis: commander state, running tasks, un-acked events."""
        self.commander.load_state_dict(state["commander"])
        self.run_id = state["run_id"]
        self._t0 = float(state["t0"])
        saved = state.get("failures_in_a_row", {})
        self._failures_in_a_row = {"collector": 0, "learner": 0, **(saved if isinstance(saved, dict) else {})}
        self._last_event_id = str(state.get("last_event_id", ""))
        self._best_written = state.get("best_written")  # the eval whose weights best.pt holds
        self._bundles = EvalBundles(state.get("eval_bundles", ()))
        self.running = {k.decode(): json.loads(v) for k, v in self.conn.hgetall(keys.tasks(self.exp)).items()}
        self.resumed = True
        self.log.info("resuming run %s of %s: %d running tasks adopted, %d env steps, train iter %d",
                      self.run_id, self.exp, len(self.running), self.commander.total_envstep, self.commander.train_iter)
        stream = keys.events(self.exp)
        streams.ensure_group(self.conn, stream, keys.COORDINATOR_GROUP, start_id="0")
        start = "0-0"
        while True:  # events the dead coordinator read but never acked
            start, claimed, *_ = self.conn.xautoclaim(stream, keys.COORDINATOR_GROUP, self.name, min_idle_time=0,
                                                      start_id=start, count=256)
            claimed = [e for e in claimed if e[1] is not None]
            if claimed:
                self.log.info("reclaimed %d unacked events", len(claimed))
                self._handle_entries(stream, claimed)
            if start in (b"0-0", "0-0"):
                break
        self._check_events_trimmed()

    def _save_resume_point(self, state: Optional[dict[str, Any]] = None) -> None:
        """Copy the learner's ``latest`` checkpoint to ``ckpt/latest.pth`` in the run folder when it is
        newer than the copy there, and write ``resume.json`` beside it: the commander state, the run
        id, seed, start time and wall seconds, the checkpoint's train_iter and the env steps the
        learner had consumed. One HGET when nothing changed. With ``state`` (the commander's state
        at the stop) ``resume.json`` is rewritten even when the checkpoint is the same."""
        key = keys.ckpt(self.exp, "latest")
        version = self.conn.hget(key, "version")
        if version is None or (int(version) == self._ckpt_on_disk and state is None):
            return
        (self.out / "ckpt").mkdir(parents=True, exist_ok=True)
        if int(version) != self._ckpt_on_disk:
            got = blobstore.get_versioned(self.conn, key)
            if got is None:
                return
            _write_atomic(self.out / "ckpt" / "latest.pth", got[1])
            self._ckpt_on_disk = int(got[0]["version"])
        state = state if state is not None else self.commander.state_dict()
        buffer_id = state.get("current_buffer_id")
        consumed = int(self.conn.hget(keys.buffer_stats(self.exp, buffer_id), "env_steps") or 0) if buffer_id else 0
        point = {"run_id": self.run_id, "seed": int(self.cfg.seed), "t0": self._t0,
                 "wall_seconds": round(time.time() - self._t0, 3), "ckpt_train_iter": self._ckpt_on_disk,
                 "consumed_env_steps": consumed, "commander": state}
        _write_atomic(self.out / "resume.json", json.dumps(point).encode())

    def _resume_files(self) -> tuple[Path, Path]:
        """``resume.json`` and ``ckpt/latest.pth`` of the run folder.

        Raises:
            CoordinatorError: one of them is missing.
        """
        path, ckpt = self.out / "resume.json", self.out / "ckpt" / "latest.pth"
        if not path.is_file() or not ckpt.is_file():
            raise CoordinatorError(f"cannot resume {self.exp}: {path} or {ckpt} is missing (the run never saved a "
                                   "learner checkpoint: policy.learn.learner.hook.save_ckpt_after_iter)")
        return path, ckpt

    def _resume_from_folder(self) -> None:
        """Continue the run from its folder (``--resume`` when Redis no longer holds it unfinished).

        Restored: the commander state of the last checkpoint copy (env steps, eval history, best
        eval, seed counter, so the exploration schedule goes on where it was), the run id, the
        wall clock (``t0`` moved by the pause), the learner checkpoint (weights, optimizer,
        train_iter) as ``rqrl:{exp}:ckpt:latest`` with the learner task set to resume from it,
        the env-step counters, and ``evals.jsonl`` into ``rqrl:{exp}:evals``. Not restored: the
        replay buffer (it lived in the learner's memory; collectors refill it to
        ``replay_start_size`` first), step data and tasks in flight, and training after the last
        checkpoint (at most ``save_ckpt_after_iter`` train iterations).

        Raises:
            CoordinatorError: the folder holds no ``resume.json`` / ``ckpt/latest.pth``.
        """
        path, ckpt = self._resume_files()
        point = json.loads(path.read_text())
        state, version, consumed = point["commander"], int(point["ckpt_train_iter"]), int(point["consumed_env_steps"])
        t0 = self._t0 - float(point["wall_seconds"])  # the pause is not counted
        shift = t0 - float(point["t0"])  # eval times move with the clock, so eval_interval counts run time
        for ev in state["evaluator_info"]:
            ev["time"] = float(ev.get("time", point["t0"])) + shift
        state["last_eval"]["time"] = float(state["last_eval"]["time"]) + shift
        for name in ("collector_task_space", "learner_task_space"):
            state[name]["cur"] = state[name]["min_val"]  # no task of the old run is running
        state.update(eval_in_flight=None, eval_own_slot=False, confirm=None, end_flag=False, final_task=None,
                     resume_learner=True, learner_info=[{"train_iter": version, "collector_envstep": consumed}])
        self.commander.load_state_dict(state)
        self.run_id, self._t0, self._ckpt_on_disk = point["run_id"], t0, version
        blobstore.put_versioned(self.conn, keys.ckpt(self.exp, "latest"), ckpt.read_bytes(), version,
                                meta={"train_iter": version, "ts": round(time.time(), 3), "format": "torch"})
        pipe = self.conn.pipeline(transaction=True)
        pipe.set(keys.envstep(self.exp), consumed)
        if state.get("current_buffer_id"):
            pipe.hset(keys.buffer_stats(self.exp, state["current_buffer_id"]), "env_steps", consumed)
        evals = self.out / "evals.jsonl"
        lines = [ln for ln in evals.read_text().splitlines() if ln.strip()] if evals.is_file() else []
        if lines:
            pipe.rpush(keys.evals(self.exp), *lines)
        pipe.execute()
        self.resumed = True
        self.log.info("resuming run %s of %s from %s: train iter %d, %d env steps, %d evals", self.run_id, self.exp,
                      self.out, version, self.commander.total_envstep, len(lines))

    def _persist(self, pipe: redis.client.Pipeline) -> redis.client.Pipeline:
        """Queue the commander state and the running tasks changed since the last call on ``pipe``
        (a MULTI pipeline); only changed task records are rewritten."""
        state = {"commander": self.commander.state_dict(), "run_id": self.run_id, "t0": self._t0,
                 "failures_in_a_row": self._failures_in_a_row, "last_event_id": self._last_event_id,
                 "best_written": self._best_written, "eval_bundles": sorted(self._bundles.stored)}
        pipe.hset(keys.commander(self.exp), "state", json.dumps(state))
        if self._new_evals:
            pipe.rpush(keys.evals(self.exp), *[json.dumps(e) for e in self._new_evals])
            pipe.ltrim(keys.evals(self.exp), -_EVALS_KEPT, -1)  # evals.jsonl in the run folder keeps them all
            self._write_evals_file(self._new_evals)
            self._new_evals = []
        # The config, the bulk of a task, is left out: the coordinator has it (a resumed run too).
        changed = {t: json.dumps(dict(self.running[t], task={k: v for k, v in self.running[t]["task"].items()
                                                             if k != "config"}))
                   for t in self._dirty if t in self.running}
        gone = [t for t in self._dirty if t not in self.running]
        if changed:
            pipe.hset(keys.tasks(self.exp), mapping=changed)
        if gone:
            pipe.hdel(keys.tasks(self.exp), *gone)
        lease.revoke(pipe, self.exp, *self._drop_leases)
        self._dirty.clear()
        self._drop_leases.clear()
        return pipe

    def _follow_failover(self) -> None:
        """After a Sentinel failover, write again what the promoted replica may lack.

        Replication is asynchronous: the old primary's last writes (~ms of them) may not have
        reached the replica. What this coordinator wrote it still holds and writes again: the
        ownership key, the run id, every running task's record and write lease, the commander
        state and the eval results (from the run folder's ``evals.jsonl``). The newest events
        may be gone too; if the last one read is, reading goes on from the newest one left (it
        was lost, not trimmed). Lost task events heal through liveness: a task whose
        ``finished`` was lost is declared dead when its heartbeat stops, and replaced.
        """
        changes = primary_changes(self.conn)
        if len(changes) == len(self.failovers):
            return
        for ch in changes[len(self.failovers):]:
            self.log.warning("Redis failover: primary %s -> %s (Sentinel); writing the run's records again on the "
                             "new primary", ch["from"], ch["to"])
        self.failovers = changes
        # Heartbeats written during the failover were refused: give every task one period to beat again.
        self._stall.grace()
        c = self.cfg.commander
        stream = keys.events(self.exp)
        streams.ensure_group(self.conn, stream, keys.COORDINATOR_GROUP, start_id="0")
        if self._last_event_id and not self.conn.xrange(stream, min=self._last_event_id, max=self._last_event_id):
            older = self.conn.xrevrange(stream, max=self._last_event_id, count=1)
            self.log.warning("the last event read (%s) was lost with the old primary", self._last_event_id)
            self._last_event_id = older[0][0].decode() if older else ""
        pipe = self.conn.pipeline(transaction=True)
        pipe.set(keys.run(self.exp), self.run_id)
        pipe.sadd(keys.runs(), self.exp)
        for tid, entry in self.running.items():
            timeout = int(c.learner_job_timeout if entry["kind"] == "learner" else c.collector_job_timeout)
            lease.grant(pipe, self.exp, tid, timeout + 3600)
        self._dirty.update(self.running)
        evals = self.out / "evals.jsonl"
        lines = [ln for ln in evals.read_text().splitlines() if ln.strip()] if evals.is_file() else []
        pipe.delete(keys.evals(self.exp))
        if lines:
            pipe.rpush(keys.evals(self.exp), *lines)
        self._persist(pipe).execute()
        self._keep_alive()  # the ownership key: re-set, or taken back if it is gone
        self._write_summary(running=True)

    def _keep_alive(self) -> None:
        if not self.conn.exists(keys.run(self.exp)):
            raise RunLost(f"Redis lost the state of run {self.exp!r} (key {keys.run(self.exp)} is gone): "
                          "was it restarted without persistence, or flushed? See docs/deploy.md on AOF.")
        try:
            # Re-set the full TTL; fails atomically when the key expired or another coordinator holds it.
            self.lock.reacquire()
        except LockError:
            # Expired during a stall (a Redis pause longer than the TTL) and nobody took it: take it back.
            if not self.lock.acquire(blocking=False, token=self.name):
                owner = self.conn.get(keys.coordinator_alive(self.exp))
                raise RunLost(f"lost ownership of {self.exp!r} to {owner.decode() if owner else '?'}") from None
            self.log.warning("ownership key %s had expired during a stall; re-acquired", keys.coordinator_alive(self.exp))

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signal = signum

    def run(self) -> int:
        """Run the experiment to its end; returns the process exit code (see module docstring)."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        restore_logging = offload_logging(self.log)  # log lines are written by a thread
        try:
            try:
                self._claim()
                if not self.resumed:
                    self.log.info("experiment %s run %s started (stop_value %s)", self.exp, self.run_id,
                                  self.cfg.env.stop_value)
                code, reason = self._loop()
            except redis.OutOfMemoryError:
                code, reason = EXIT_ERROR, self._out_of_memory()
            except RunLost as e:
                code, reason, self._hands_off = EXIT_ERROR, str(e), True
            except (redis.ConnectionError, redis.TimeoutError) as e:  # still, after the client's retries (~15 s)
                code, reason, self._hands_off = EXIT_ERROR, f"Redis unreachable: {type(e).__name__}: {e}", True
            # The wrap-up logs on this thread again, so its lines and the closing summary it
            # prints come out in order.
            restore_logging()
            self._finish(code, reason)
            return code
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self.tb.close()
            restore_logging()
            try:
                self.lock.release()
            except (LockError, redis.RedisError):
                pass  # expired or taken over: nothing of ours to release

    def _loop(self) -> tuple[int, str]:
        self._rejections = server_limits.RejectionWatch(self.conn)  # maxclients: named when it is hit
        liveness = threading.Thread(target=self._liveness_thread, name="liveness", daemon=True)
        liveness.start()
        try:
            return self._loop_body()
        finally:
            self._stop_liveness.set()
            liveness.join(timeout=10)

    def _loop_body(self) -> tuple[int, str]:
        c = self.cfg.commander
        while True:
            if self._signal is not None:
                return EXIT_INTERRUPTED, f"interrupted by {signal.Signals(self._signal).name}"
            self._follow_workers()
            self._dispatch()
            converged = self._process_events(block_ms=500)
            if self._fatal:
                return EXIT_ERROR, self._fatal
            self._apply_dead()
            self._follow_failover()
            self._dispatch()  # refill freed slots before the periodic checks below
            now = time.time()
            if now >= self._next_setting:
                self._next_setting = now + _SETTING_EVERY_S
                self._publish_setting()
            if now >= self._next_liveness:
                self._next_liveness = now + 1.0
                self._keep_alive()
            if now >= self._next_summary:
                self._next_summary = now + 1.0
                self._write_summary(running=True)
                self._save_resume_point()
            if now >= self._next_trim:
                self._next_trim = now + _TRIM_EVERY_S
                self._trim_events()
                if rejected := self._rejections.reason():
                    return EXIT_ERROR, rejected
            if converged:
                last = self.commander.last_eval or {}
                return EXIT_CONVERGED, (f"converged: eval reward_mean {last.get('reward_mean', 0):.2f} "
                                        f">= stop_value {self.cfg.env.stop_value}")
            worst = max(self._failures_in_a_row.values())
            if c.max_task_failures and worst >= c.max_task_failures:
                return EXIT_ERROR, (f"{worst} tasks failed in a row (commander.max_task_failures); "
                                    f"last error: {self._last_failure}")
            cm = self.commander
            if c.max_env_step and cm.total_envstep >= c.max_env_step:
                return EXIT_LIMIT, f"max_env_step {c.max_env_step} reached without convergence"
            if c.max_train_iter and cm.train_iter >= c.max_train_iter:
                return EXIT_LIMIT, f"max_train_iter {c.max_train_iter} reached without convergence"
            if c.max_wall_seconds and now - self._t0 >= c.max_wall_seconds:
                return EXIT_LIMIT, f"max_wall_seconds {c.max_wall_seconds} passed without convergence"

    # ------------------------------------------------------------------ dispatch
    def _follow_workers(self) -> None:
        """Count the live collector workers (at most every ``_WORKERS_EVERY_S``) and hand a
        changed count to the commander, which sizes the collector task space from it."""
        now = time.monotonic()
        if now < self._next_workers:
            return
        self._next_workers = now + _WORKERS_EVERY_S
        n = live_workers(self.conn, self.queues["collector"])
        if n != self.collector_workers:
            self.commander.follow_collector_workers(n)
            self.log.info("collector workers: %s -> %d; collector task space %s", self.collector_workers, n,
                          self.commander.summary()["collector_task_space"])
            self.collector_workers = n

    def _publish_setting(self) -> None:
        """Write the commander's collect setting to ``rqrl:{exp}:collect_setting`` when it changed
        (collectors read it with every chunk: a task lasting minutes acts on the current one)."""
        setting = json.dumps(self.commander.collect_setting(), sort_keys=True)
        if setting != self._setting_sent:
            self.conn.set(keys.collect_setting(self.exp), json.dumps({"setting": json.loads(setting), "ts": time.time()}))
            self._setting_sent = setting

    def _dispatch(self) -> None:
        """Enqueue every task the commander hands out, all in one MULTI/EXEC with their leases and
        the coordinator's state (so a burst of freed slots costs one round trip)."""
        pipe = None
        with self._enqueue_lock:
            for kind, getter in (("learner", self.commander.get_learner_task),
                                 ("collector", self.commander.get_collector_task)):
                while (task := getter()) is not None:
                    pipe = pipe or self.conn.pipeline(transaction=True)
                    self._enqueue(kind, task, pipe)
            if pipe is not None:
                self._persist(pipe).execute()

    def _enqueue(self, kind: str, task: dict, pipe: redis.client.Pipeline) -> None:
        c = self.cfg.commander
        timeout = int(c.learner_job_timeout if kind == "learner" else c.collector_job_timeout)
        self.running[task["task_id"]] = {"task": task, "kind": kind, "started": False, "enqueued": time.time()}
        self._dirty.add(task["task_id"])
        self.queues[kind].enqueue_call(
            _JOB_FUNC[kind], args=(task,), job_id=task["task_id"], timeout=timeout,
            result_ttl=3600, failure_ttl=7 * 86400,
            description=f"rqrl {self.exp} {kind}{' eval' if task.get('eval_flag') else ''} {task['task_id']}",
            on_failure=Callback("workers.callbacks.report_job_failure"),
            at_front=bool(task.get("eval_flag")),  # an eval should not wait behind training tasks
            pipeline=pipe,
        )
        lease.grant(pipe, self.exp, task["task_id"], timeout + 3600)
        # One line per training collector task would cost the loop more than the dispatch: DEBUG.
        level = logging.DEBUG if kind == "collector" and not task.get("eval_flag") else logging.INFO
        self.log.log(level, "dispatched %s%s task %s", kind, " (eval)" if task.get("eval_flag") else "", task["task_id"])

    # ------------------------------------------------------------------ events
    def _process_events(self, block_ms: int) -> bool:
        stream = keys.events(self.exp)
        try:
            entries = streams.read_group(self.conn, stream, keys.COORDINATOR_GROUP, self.name, 1000, block_ms)
        except redis.ResponseError as e:
            # NOGROUP, or UNBLOCKED: the stream was deleted while this read waited on it.
            if "NOGROUP" in str(e) or "UNBLOCKED" in str(e):
                raise RunLost(f"Redis lost the state of run {self.exp!r} ({stream} lost its consumer group): was "
                              "it restarted without persistence, or flushed? See docs/deploy.md on AOF.") from None
            raise
        return self._handle_entries(stream, entries)

    def _handle_entries(self, stream: str, entries: list) -> bool:
        if not entries:
            return False
        converged = False
        for entry_id, raw in entries:
            try:
                ev = events.parse(stream, entry_id, raw)
                if skew := self._clocks.note(ev, entry_id):
                    self.log.warning("%s", skew)
                converged |= self._route(ev)
            except (streams.MalformedEntry, KeyError, ValueError, TypeError) as e:
                self.log.error("dropping bad event %s: %s", entry_id.decode(), e)
        # The state the events produced and their acks land together (exactly-once routing).
        self._last_event_id = max((e for e, _ in entries), key=_id_tuple).decode()
        pipe = self._persist(self.conn.pipeline(transaction=True))
        pipe.xack(stream, keys.COORDINATOR_GROUP, *[e for e, _ in entries])
        pipe.execute()
        self._export_best()
        self._bundles.prune(self.conn, self.exp, self.commander.eval_bundles_in_use)
        return converged

    def _export_best(self) -> None:
        """Keep ``best.pt`` = the best-evaluated weights so far (copied from what that eval played)."""
        best = getattr(self.commander, "best_eval", {})
        if not best or best.get("task_id") == self._best_written:
            return
        got = blobstore.get_versioned(self.conn, keys.evaluated_policy(self.exp, best["task_id"]))
        if got is None:
            return  # the eval task's blob is not there (an older worker version): nothing to copy
        self.out.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.out / "best.pt", got[1])
        self._best_written = best["task_id"]
        self.log.info("best.pt: policy version %s, eval reward_mean %.2f", best["policy_version"], best["reward_mean"])

    def _route(self, ev: dict[str, Any]) -> bool:
        tid, kind, etype = ev["task_id"], ev["task_type"], ev["type"]
        entry = self.running.get(tid)
        if entry is None:
            return False  # a task of an earlier run, or one already declared dead
        if etype == "started":
            entry["started"] = True
            self._dirty.add(tid)
        elif etype == "learner_info":
            self.commander.update_learner_info(tid, ev)
            self._failures_in_a_row["learner"] = 0  # it trains
        elif etype == "scalars":
            write_shipped_scalars(self.tb, ev)
        elif etype == "log":
            write_shipped_log(self.out, ev)
        elif etype == "finished":
            del self.running[tid]
            self._dirty.add(tid)
            self._drop_leases.append(tid)
            self._failures_in_a_row[kind] = 0
            if kind == "collector":
                converged = self.commander.finish_collector_task(tid, ev)
                if ev.get("eval_flag") is True:
                    self._bundles.add(tid)
                    self._new_evals.append(eval_record(ev, self.run_id, self.commander.total_envstep,
                                                       time.time() - self._t0))
                    self._note_eval_phase(ev)
                return converged
            if int(entry["task"].get("rank", 0)) != 0:
                return False  # rank 0 of a learner group reports for the group
            self.learner_final = {k: ev[k] for k in ("wait_share", "train_iter_per_sec", "train_s", "sched_wait_share",
                                                     "cpu_s", "pushed", "chunks", "expired", "corrupt", "malformed",
                                                     "redelivered", "stale_chunks", "stale_rows", "policy_lag_p50",
                                                     "policy_lag_p95", "policy_lag_max") if k in ev}
            self.learner_last = {"train_iter": int(ev.get("train_iter", 0)), "envstep": int(ev.get("collector_envstep", 0))}
            self.commander.finish_learner_task(tid, ev)
        elif etype == "failed":
            if ev.get("source") == "rq_on_failure" and self.conn.exists(keys.heartbeat(self.exp, tid)):
                # RQ's verdict (e.g. its abandoned-job cleanup on a worker whose clock runs ahead)
                # never overrides a live task's fresh heartbeat; a real death stops the heartbeat.
                self.log.warning("RQ reported task %s failed (%s), but its heartbeat is fresh: ignored", tid,
                                 ev.get("error", "?"))
                return False
            self._fail(tid, ev.get("error", "unknown error"))
            if ev.get("fatal") is True:  # a replacement would fail the same way (e.g. NaN weights)
                self._fatal = f"{kind} task {tid} failed: {ev.get('error', 'unknown error')}"
            elif limit := server_limits.explain(self.conn, str(ev.get("error", ""))):
                self._fatal = f"{kind} task {tid} failed: {limit}"
        return False

    def _note_eval_phase(self, ev: dict[str, Any]) -> None:
        """Phases ``first_eval``, ``passing_eval`` (an eval reaching stop_value: the last one before
        the run converges is the one confirmed) and ``confirmation``, at this eval's receipt."""
        now, stop_value = time.time(), self.cfg.env.stop_value
        reward = events.episode_figure(ev, "reward_mean")  # None: the eval finished no episode
        pipe = self.conn.pipeline(transaction=False)
        phases.record(pipe, self.exp, "first_eval", now)
        if ev.get("confirmation") is True:
            phases.record(pipe, self.exp, "confirmation", now, first_only=False)
        elif stop_value is not None and reward is not None and reward >= float(stop_value):
            phases.record(pipe, self.exp, "passing_eval", now, first_only=False)
        pipe.execute()

    def _fail(self, tid: str, reason: str) -> None:
        entry = self.running.pop(tid)
        self._dirty.add(tid)
        # Revoked in the same transaction as the state change: a zombie task can no longer write.
        self._drop_leases.append(tid)
        self._failures_in_a_row[entry["kind"]] += 1
        self._last_failure = f"{entry['kind']} task {tid}: {reason}"
        self.log.warning("%s task %s failed: %s; its space is freed and a replacement will be issued",
                         entry["kind"], tid, reason)
        if entry["kind"] == "collector":
            self.commander.notify_fail_collector_task(entry["task"])
        else:
            self.commander.notify_fail_learner_task(entry["task"])
            self._drop_group(entry["task"], tid)

    def _drop_group(self, task: dict, lost: str) -> None:
        """A lost rank fails its learner group: the other ranks are dropped too (leases revoked,
        so they cannot write; their collectives fail or time out and they exit), and the
        commander's replacement group resumes from checkpoint ``latest``."""
        group = task.get("group_id")
        if group is None:
            return
        for tid in [t for t, e in self.running.items() if e["kind"] == "learner" and e["task"].get("group_id") == group]:
            entry = self.running.pop(tid)
            self._dirty.add(tid)
            self._drop_leases.append(tid)
            self.log.warning("learner task %s (rank %s of group %s) dropped with its group: %s was lost",
                             tid, entry["task"].get("rank"), group, lost)

    def _write_evals_file(self, evals: list[dict[str, Any]]) -> None:
        """Append eval results to the run folder's ``evals.jsonl`` (one JSON object per line)."""
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "evals.jsonl", "a") as f:
            f.writelines(json.dumps(e) + "\n" for e in evals)

    def _trim_events(self) -> None:
        """Trim the events stream to what was read and is older than the retention window."""
        self._check_events_trimmed()
        if not self._last_event_id:
            return
        cutoff = min(_id_tuple(self._last_event_id), (int((time.time() - _EVENTS_RETENTION_S) * 1000), 0))
        self.conn.xtrim(keys.events(self.exp), minid=f"{cutoff[0]}-{cutoff[1]}", approximate=True)

    def _check_events_trimmed(self) -> None:
        """Report (once) a stream trimmed past the last event this coordinator read.

        rqrl's own trimming keeps that entry (MINID never passes it), so its absence means a
        MAXLEN or XTRIM from elsewhere removed it, and with it possibly events not yet read.
        """
        if self.events_lost or not self._last_event_id:
            return
        last = self._last_event_id
        if self.conn.xrange(keys.events(self.exp), min=last, max=last):
            return
        first = self.conn.xrange(keys.events(self.exp), count=1)
        first_id = first[0][0].decode() if first else "none"
        self.events_lost = (f"{keys.events(self.exp)} was trimmed past the last event read ({last}; first entry "
                            f"now {first_id}): unread task results may have been lost")
        self.log.error("%s", self.events_lost)

    def _liveness_thread(self) -> None:
        """Run :meth:`_find_dead` every second, off the event loop; the loop alone applies what it
        finds (:meth:`_apply_dead`), so the running tasks and the commander change on one thread."""
        while not self._stop_liveness.wait(1.0):
            try:
                self._dead.put(self._find_dead())
            except Exception as e:  # noqa: BLE001 - the pass must outlive one bad round; the loop meets
                # the same Redis errors and handles them
                self.log.warning("liveness pass failed: %s: %s", type(e).__name__, e)

    def _find_dead(self) -> list[tuple[str, str]]:
        """Started tasks whose heartbeat expired and queued ones whose RQ job died, with the reason.

        Two round trips whatever the number of tasks: one MGET of the heartbeat keys, one
        pipeline reading the status of the queued tasks' RQ jobs. A heartbeat read that spanned
        a stall (a Redis pause longer than the heartbeat TTL expires every heartbeat while no
        worker can write) is not trusted, and workers get one heartbeat period after it to
        refresh before missing heartbeats count as deaths (:class:`coordinator.stall.StallGuard`).
        """
        with self._enqueue_lock:
            snapshot = list(self.running.items())
        started = [t for t, e in snapshot if e["started"]]
        waiting = [t for t, e in snapshot if not e["started"]]
        dead = []
        beats = self.conn.mget([keys.heartbeat(self.exp, t) for t in started]) if started else []
        # The clock is read after the reply: the reply that spanned a stall is the one to distrust.
        trusted = self._stall.read_done()
        if self._stall.stall_s:
            self.log.warning("liveness pass stalled %.1f s (Redis unavailable?); heartbeat checks paused %.0f s",
                             self._stall.stall_s, self.cfg.commander.heartbeat_timeout)
        if trusted:
            dead += [(t, f"heartbeat lost (no {keys.heartbeat(self.exp, t)} for "
                         f"{self.cfg.commander.heartbeat_timeout} s): the worker process died")
                     for t, beat in zip(started, beats) if beat is None]
        if waiting:
            pipe = self.conn.pipeline(transaction=False)
            for t in waiting:
                pipe.hget(Job.key_for(t), "status")
            for t, raw in zip(waiting, pipe.execute()):
                status = raw.decode() if raw else None
                if status is None or status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
                    dead.append((t, f"RQ job is {status or 'gone'} before the task started"))
        return dead

    def _apply_dead(self) -> None:
        """Fail the tasks the liveness pass found dead that still run (a task may have finished
        since), and persist the change in one transaction."""
        found: list[tuple[str, str]] = []
        while True:
            try:
                found += self._dead.get_nowait()
            except queue.Empty:
                break
        failed = False
        for tid, reason in found:
            if tid in self.running:
                self._fail(tid, reason)
                failed = True
        if failed:
            self._persist(self.conn.pipeline(transaction=True)).execute()

    def _check_liveness(self) -> None:
        """The liveness pass on this thread, applied at once (the wrap-up, after the loop's thread stopped)."""
        self._dead.put(self._find_dead())
        self._apply_dead()

    # ------------------------------------------------------------------ ending
    def _out_of_memory(self) -> str:
        """Redis refused a write (OOM, noeviction): the run stops. Step data is dropped first (the
        stopping learner will not read it), so the stop flag, the learner's final checkpoint and
        RQ's own bookkeeping find room again."""
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
        if self._hands_off:
            return False
        try:
            fn(*args, **kwargs)
            return True
        except redis.OutOfMemoryError as e:
            self.log.error("could not %s: %s", what, e)
            return False

    def _write_summary(self, running: bool = False, **extra: Any) -> dict[str, Any]:
        """Write the commander summary for ``rqrl status``. While ``running``, an OOM reply is
        raised (it is the first write refused once Redis is full, and stopping at once beats
        waiting for heartbeats to expire); in the wrap-up it is logged."""
        summary = dict(self.commander.summary(), exp_name=self.exp_name, run_name=self.run_name,
                       run_id=self.run_id, coordinator=self.name,
                       collector_workers=self.collector_workers,
                       wall_seconds=round(time.time() - self._t0, 2), **extra)
        if self._clocks.skewed:
            summary["worker_clock_skew"] = self._clocks.summary()
        if self.failovers:  # one line per Sentinel failover seen (summary fields are scalars)
            summary["redis_failovers"] = len(self.failovers)
            summary["redis_failover"] = "; ".join(
                f"primary {f['from']} -> {f['to']} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(f['time']))}"
                for f in self.failovers)
        mapping = streams.encode_fields(summary)
        if running:
            self.conn.hset(keys.commander(self.exp), mapping=mapping)
        else:
            self._best_effort("write the summary to Redis", self.conn.hset, keys.commander(self.exp), mapping=mapping)
        return summary

    def _finish(self, code: int, reason: str) -> None:
        self.log.info("stopping: %s", reason)
        # The learner's finish resets the commander's run state (as the seed); keep the figures.
        cm = self.commander
        resume_state = cm.state_dict()  # what --resume continues from (with the learner's last checkpoint)
        last = cm.last_eval or {}
        final_task = getattr(cm, "final_eval_task", None)
        best = dict(getattr(cm, "best_eval", {}))
        # No eval yet, or none with a finished episode: None (null in summary.json), never 0.
        self._at_stop = {"envstep": cm.total_envstep, "train_iter": cm.train_iter,
                         "final_eval_task": final_task or "", "best_eval_reward_mean": best.get("reward_mean"),
                         "best_policy_version": best.get("policy_version"),
                         "last_eval_reward_mean": last.get("reward_mean"),
                         "last_eval_train_iter": last.get("train_iter"),
                         "last_eval_envstep": last.get("envstep"),
                         "last_eval_policy_envstep": last.get("policy_envstep"),
                         "policy_id": cm.summary()["policy_id"], "buffer_id": cm.summary()["buffer_id"]}
        if not self._best_effort("set the stop flag", self.conn.set, keys.stop(self.exp), reason) and self.running \
                and not self._hands_off:
            # DEL needs no memory: without their leases the tasks stop at their next write.
            lease.revoke(self.conn, self.exp, *self.running)
        self._best_effort("cancel queued tasks", self._cancel_queued)
        timeout = float(self.cfg.commander.finish_timeout)
        if code == EXIT_INTERRUPTED or self._oom:
            timeout = min(timeout, 10.0)
        if self._hands_off:
            timeout = 0.0  # no learner can report through a Redis that lost the run
        deadline = time.time() + timeout
        while any(e["kind"] == "learner" for e in self.running.values()) and time.time() < deadline:
            if not self._best_effort("read events", self._process_events, block_ms=250):
                time.sleep(0.25)  # Redis refuses writes: nothing to block on until it has room
            # A full Redis refuses heartbeats too: missing ones then say nothing about the workers.
            if time.time() >= self._next_liveness and not self._oom:
                self._next_liveness = time.time() + 1.0
                self._best_effort("check task liveness", self._check_liveness)
        # The learner reports its last figures after the stop: the summary takes them (the progress
        # line of `rqrl train` ends with the summary's numbers).
        self._at_stop["train_iter"] = max(int(self._at_stop["train_iter"]), self.learner_last["train_iter"])
        self._at_stop["envstep"] = max(int(self._at_stop["envstep"]), self.learner_last["envstep"])
        self._best_effort("copy the last checkpoint to the run folder", self._save_resume_point, resume_state)
        final = self._export_final()
        learner = {f"learner_{k}": v for k, v in self.learner_final.items()}
        if self.events_lost:
            learner["events_lost"] = self.events_lost
        summary = self._write_summary(status=reason, exit_code=code, final_pt=str(final) if final else "",
                                      **self._at_stop, **learner)
        summary["phases"] = self._phases_at_end()
        self.out.mkdir(parents=True, exist_ok=True)
        _write_atomic(self.out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        curve = self._curve_to_draw()
        lines = [
            f"rqrl {self.exp}: {reason}",
            f"  wall time      {summary['wall_seconds']:.1f} s",
            f"  env steps      {summary['envstep']}",
            f"  train iters    {summary['train_iter']}",
            f"  last eval      {_fmt(summary['last_eval_reward_mean'])} (stop_value {self.cfg.env.stop_value})",
            f"  final policy   {final or 'not saved'}" + (
                f" (policy version {summary.get('final_policy_version')}"
                + (", the weights the converging eval played)" if summary.get("final_eval_task") else ")")
                if final else ""),
            f"  curve          {curve or 'no evaluations'}",
            f"  phases         {phases.render(summary['phases'])}",
        ]
        print("\n".join(lines), flush=True)
        self._signal_done(code)
        if curve is not None:  # after the summary: rqrl train does not wait for the plot
            self._plot_curve()

    def _phases_at_end(self) -> dict[str, float]:
        """Record phase ``final_pt`` (final.pt is written, summary.json is next) and return the
        run's phases for summary.json (common/phases.py); what Redis cannot give is left out."""
        if self._hands_off:
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

    def _cancel_queued(self) -> None:
        waiting = [t for t, e in self.running.items() if not e["started"]]
        for job in Job.fetch_many(waiting, connection=self.conn, serializer=TaskSerializer) if waiting else []:
            if job is not None and job.get_status(refresh=False) == JobStatus.QUEUED:
                job.cancel()
        for t in waiting:
            entry = self.running.pop(t)
            self._dirty.add(t)
            self._drop_leases.append(t)
            if entry["kind"] == "collector":
                self.commander.notify_fail_collector_task(entry["task"])
        self._persist(self.conn.pipeline(transaction=True)).execute()

    def _final_from_best(self, path: Path) -> Optional[Path]:
        """``final.pt`` without Redis: a copy of ``best.pt`` when the best eval reached stop_value
        (best.pt holds exactly the weights that eval played), else none."""
        best = getattr(self.commander, "best_eval", {})
        stop_value, reward = self.cfg.env.stop_value, best.get("reward_mean")
        best_pt = self.out / "best.pt"
        if (stop_value is None or reward is None or reward < float(stop_value) or not best_pt.is_file()
                or best.get("task_id") != self._best_written):
            self.log.warning("no final.pt: Redis no longer holds the run's weights and no eval reached stop_value "
                             "(ckpt/latest.pth and resume.json remain for --resume)")
            return None
        _write_atomic(path, best_pt.read_bytes())
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
        if self._hands_off:
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
