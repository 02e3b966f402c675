"""Collector tasks: roll out the policy in a gymnasium vector env, ship transitions to the learner.

``rq worker collector`` runs :func:`run_collector_task` with a task dict from the commander.

A training task continues its run's envs where the run's last task on this worker left them
(workers/live_envs.py: envs live on the worker, not in the task), acts with the policy
(``policy.act`` with the collect setting, e.g. an exploration rate, which every flush reads back
from ``rqrl:{exp}:collect_setting``), turns steps into rows with the policy's adder, packs them
into chunks of at least ``policy.collect.n_sample`` rows (one msgpack blob plus one metadata
entry on the buffer's stream each; image fields as distinct frames, common/frames.py, and the
blob compressed per ``collector.compression``, common/chunk_codec.py; tagged with the policy
version that produced them), refreshes its weights whenever the learner publishes a newer
version (on-policy algorithms wait for it after each chunk), and ends after ``task_env_steps``
env steps, ``task_max_seconds`` or at the stop flag. An eval task (``eval_flag``) resets its
eval envs with its own seeds, plays ``env.n_evaluator_episode`` episodes (a confirming eval
its ``eval_episodes``), each started on whichever eval env is free, at most
``policy.eval.evaluator.max_env_steps`` env steps, counts each exactly once and sends no
training data. Both report the seed's finish info.
"""

from __future__ import annotations

import io
import json
import logging
import time
import uuid
from typing import Any

import numpy as np
import torch
from easydict import EasyDict

from common import chunk_codec, events, frames, keys, spaces
from common.config import is_deterministic
from common.messages import ChunkMeta
from common.policy import Algorithm, algorithm_of, create_policy, export
from common.seeding import env_seeds
from common.sources import get_source
from workers import live_envs, opponents
from workers.comm_collector import RedisCommCollector
from workers.envs import check_finite, episode_ends, make_vector_env, step, true_next_obs
from workers.episode_shipper import EpisodeShipper
from workers.live_envs import EpisodeStats, LiveEnvs
from workers.step_watch import StepWatch
from workers.task import TaskContext, open_task, task_namespace, task_scope

log = logging.getLogger(__name__)


class ChunkBuilder:
    """Accumulates adder rows until a chunk holds at least ``n_sample`` rows.

    Rows are never split across chunks, so every chunk is tagged with the oldest policy version
    that produced any of its rows (:attr:`version`).
    """

    def __init__(self, n_sample: int) -> None:
        self.n_sample = n_sample
        self._reset()

    def _reset(self) -> None:
        self._parts: list[dict[str, np.ndarray]] = []
        self.size = 0
        self.version: int | None = None

    def add(self, rows: dict[str, np.ndarray] | None, version: int) -> bool:
        """Append rows (a dict of equal-length arrays) made by policy ``version``; True when full."""
        if rows:
            self._parts.append(rows)
            self.size += len(next(iter(rows.values())))
            self.version = version if self.version is None else min(self.version, version)
        return self.size >= self.n_sample

    def take(self) -> dict[str, np.ndarray]:
        """The accumulated rows as one dict of stacked arrays, and start a new chunk."""
        parts = self._parts
        out = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        self._reset()
        return out


def finish_info(stats: EpisodeStats, env_steps: int, seconds: float, policy_version: int,
                eval_flag: bool) -> dict[str, Any]:
    """The seed's finish info of one task (times in seconds, steps in env steps): the episodes
    that finished during the task, whole episodes even when they began in an earlier task.

    A task that finished no episode has no per-episode figures: ``reward_mean``, ``reward_std``
    and the episode lengths and durations are left out, never 0.0 (on envs with negative returns
    a 0.0 would read as a record; the coordinator records such an eval with no reward)."""
    n = len(stats.returns)
    info: dict[str, Any] = {
        "real_episode_count": n,
        "env_steps": int(env_steps),
        "avg_time_per_step": seconds / env_steps if env_steps else 0.0,
        "policy_version": int(policy_version),
        "eval_flag": bool(eval_flag),
        "duration": round(seconds, 3),
    }
    if n:
        info.update(avg_time_per_episode=float(np.mean(stats.durations)), avg_step_per_episode=float(np.mean(stats.lengths)),
                    min_step_per_episode=int(min(stats.lengths)), max_step_per_episode=int(max(stats.lengths)),
                    reward_mean=float(np.mean(stats.returns)), reward_std=float(np.std(stats.returns)))
    return info


def build_live_envs(cfg: EasyDict, task: dict) -> LiveEnvs:
    """A task's vector env (``env.collector_env_num`` training envs, or ``env.evaluator_env_num``
    eval envs without the training-only wrappers) with its spaces and a collect- or eval-mode
    policy on the CPU, not yet reset.

    Raises:
        workers.envs.EnvError: the env cannot be built (names ``env.env_id``).
        common.spaces.SpaceError: the env's spaces disagree with the config.
    """
    is_eval = bool(task["eval_flag"])
    env_num = cfg.env.evaluator_env_num if is_eval else cfg.env.collector_env_num
    spaces.import_env_modules(list(cfg.env.import_names))
    env = make_vector_env(cfg.env, env_num, train=not is_eval)
    try:
        spec = spaces.from_spaces(cfg.env.env_id, env.single_observation_space, env.single_action_space)
        spaces.check_model(cfg, spec)
        policy = create_policy(cfg, spec, modes=("eval",) if is_eval else ("collect",), device="cpu")
    except Exception:
        env.close()
        raise
    return LiveEnvs(env=env, spec=spec, policy=policy, episodes=EpisodeStats(env_num),
                    idle_s=float(cfg.policy.collect.collector.env_idle_s), built_by=task["task_id"])


class Collector:
    """One collector task's rollout loop (train or eval) on envs it borrows (``live``; without
    them it builds its own and closes them at its end), talking to Redis through ``comm``.

    Algorithm-free: acting, the transition rows and exploration belong to the policy
    (common/policy/base.py); the collect setting is handed to it unread, and kept current from
    what every flush reads back (the coordinator's ``rqrl:{exp}:collect_setting``). A task passes
    the ``algorithm`` and namespace ``ns`` of its context (workers/task.py); without them (tests,
    benchmarks) they are worked out from ``cfg`` and ``task``.
    """

    def __init__(self, cfg: EasyDict, task: dict, comm: RedisCommCollector, live: LiveEnvs | None = None,
                 watch: StepWatch | None = None, algorithm: Algorithm | None = None, ns: str | None = None) -> None:
        self._cfg = cfg
        # A task's context (workers/task.py) hands in its algorithm and namespace, worked out once.
        self._algorithm = algorithm if algorithm is not None else algorithm_of(cfg)
        self._ns = ns
        self._watch = watch if watch is not None else StepWatch(0, cfg.env.env_id, lambda _: None)
        self._task = task
        self._comm = comm
        self._owns_envs = live is None
        live = build_live_envs(cfg, task) if live is None else live
        self._live = live
        self._eval = bool(task["eval_flag"])
        torch.set_num_threads(cfg.policy.collect.collector.torch_threads)
        torch.manual_seed(int(task.get("seed", 0)))
        self._rng = np.random.default_rng(int(task.get("seed", 0)))
        self._env, self._spec, self._policy = live.env, live.spec, live.policy
        self._source = get_source(self._algorithm.data_source)  # what to do with rows and after a chunk
        self._deterministic = is_deterministic(cfg)
        # Image fields travel as distinct frames (common/frames.py), compressed per the config.
        self._framed = frames.framed_fields(self._spec, self._policy.schema()) if not self._eval else []
        self._codec = chunk_codec.resolve(str(cfg.policy.collect.collector.compression), self._spec.obs_kind == "image")
        self._env_num = self._env.num_envs
        self.policy_version = -1  # version of the weights held; set by the first policy fetch
        self.update_delays: list[float] = []  # seconds from each publication to acting with it
        self.setting_delays: list[float] = []  # seconds from each new collect setting to acting with it
        self._setting_raw: bytes | None = None
        self.capped = False  # an eval stopped at its env-step cap

    def _refresh_policy(self, at_start: bool = False) -> None:
        weights = self._comm.get_policy_update_info()
        if weights is not None:
            self._policy.set_weights(weights)
            self.policy_version = int(self._comm.policy_version)
            if not at_start:  # a fetch at the start measures how old the policy was, not propagation
                # Publication -> acting with it (wall clocks of two hosts: skew adds to this figure).
                self.update_delays.append(max(0.0, time.time() - self._comm.policy_published_at))

    def run(self) -> dict[str, Any]:
        """Run the task to its end; returns the finish info (plus ``policy_update_delay_p50_ms`` /
        ``p95`` and, for training tasks, ``setting_delay_p50_ms`` / ``p99``).

        Raises:
            TimeoutError: no policy was published within ``collector.policy_wait_s`` seconds.
        """
        try:
            return self._run()
        finally:
            if self._owns_envs:
                self._live.close()

    def _run(self) -> dict[str, Any]:
        live = self._live
        replay_key = self._task.get("eval_policy_key")
        if replay_key:  # a confirmation eval: exactly the weights an earlier eval played
            saved = export.load(io.BytesIO(self._comm.load_evaluated(replay_key)))
            self._policy.set_weights({k: v.numpy() for k, v in saved["weights"].items()})
            self.policy_version = int(saved["train_iter"])
            self._comm.policy_envstep = int(saved.get("envstep", 0))
            live.policy_version = -1  # not a published version: the next task fetches one
        else:
            if live.policy_version >= 0 and not self._eval:
                # Envs kept from an earlier task hold that task's weights: fetch only another version (older too).
                self.policy_version = self._comm.policy_version = live.policy_version
            else:
                self._comm.wait_for_policy(float(self._cfg.policy.collect.collector.policy_wait_s))
            self._refresh_policy(at_start=True)
        start, cpu0 = time.time(), time.process_time()
        self.ready_at = time.perf_counter()
        steps = self._run_eval() if self._eval else self._run_train()
        if not replay_key:
            live.policy_version = self.policy_version
        info = finish_info(live.episodes, steps, time.time() - start, self.policy_version, self._eval)
        info["policy_envstep"] = int(self._comm.policy_envstep)
        info["cpu_s"] = round(time.process_time() - cpu0, 3)  # this process's CPU seconds while the task ran
        if self._task.get("opponent") is not None:  # the games' results for the league's payoff table
            sign = np.sign(live.episodes.returns)
            info.update(opponent=self._task["opponent"], wins=int((sign > 0).sum()), draws=int((sign == 0).sum()),
                        losses=int((sign < 0).sum()))
        if self._eval:  # what was played is what the coordinator may export
            info["confirmation"] = bool(replay_key)
            info["eval_capped"] = self.capped
            bundle = export.bundle(self._policy, self.policy_version)
            bundle["envstep"] = info["policy_envstep"]
            self._comm.store_evaluated(export.to_bytes(bundle), self.policy_version)
        for name, values, pcts in (("policy_update_delay", self.update_delays, (50, 95)),
                                   ("setting_delay", self.setting_delays, (50, 99))):
            for q in pcts if values else ():
                info[f"{name}_p{q}_ms"] = round(float(np.percentile(values, q)) * 1000, 2)
        return info

    def _follow_setting(self, setting: dict[str, Any]) -> None:
        """Take the collect setting the last flush read, when it changed (in place: the adder and
        ``act`` hold this dict). A setting that does not check is logged and ignored."""
        raw = self._comm.collect_setting_raw
        if raw is None or raw == self._setting_raw:
            return
        first, self._setting_raw = self._setting_raw is None, raw
        try:
            doc = json.loads(raw)
            new = dict(doc["setting"])
            self._algorithm.check_setting(new)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("task %s: ignoring the collect setting at %s (%s: %s)", self._task["task_id"],
                        keys.collect_setting(self._ns or task_namespace(self._task)), type(e).__name__, e)
            return
        if not first:  # the first read may be older than the task; later ones are news
            self.setting_delays.append(max(0.0, time.time() - float(doc.get("ts", time.time()))))
        setting.clear()
        setting.update(new)

    def _setting_at(self, setting: dict[str, Any], envstep: int) -> None:
        """Deterministic mode: the collect setting for the run's ``envstep`` env steps, computed
        here (in place) where the coordinator's copy would arrive at a moment no seed decides."""
        setting.clear()
        setting.update(self._algorithm.collect_setting(
            self._cfg.policy, {"envstep": envstep, "train_iter": max(self.policy_version, 0), "collectors": 1}))

    def _run_train(self) -> int:
        cfg, live = self._cfg, self._live
        env_id = cfg.env.env_id
        c = cfg.policy.collect.collector
        setting = dict(self._task["collect_setting"])
        if self._deterministic:
            self._setting_at(setting, int(self._task.get("envstep", 0)))
        budget = int(c.task_env_steps)
        deadline = time.monotonic() + float(c.task_max_seconds)
        adder = self._policy.make_adder(self._env_num, setting)
        # Rows a source needs whole (on-policy: one version's rollout) go out as the adder emits them.
        chunk = ChunkBuilder(1 if self._source.chunk_rows == "emitted" else int(cfg.policy.collect.n_sample))
        stats = live.episodes
        stats.new_task()
        opponent = self._task.get("opponent")
        if opponent is not None:  # a two-player game under the league commander
            self._env.call("set_opponent", opponents.seat_for(live, opponent, self._policy, cfg, self._comm.conn,
                                                              self._ns or task_namespace(self._task), setting, self._rng))
            if live.opponent != opponent:  # the games under way were against another opponent: new ones
                live.obs, live.opponent = None, opponent
        if live.obs is None:  # the run's first task on these envs
            obs, _ = self._env.reset(seed=env_seeds(int(self._task.get("seed", 0)), self._env_num))
            live.obs = self._spec.obs_batch(obs)
            stats.restart()
        obs = live.obs
        steps = steps_at_last_send = 0
        base_envstep = int(self._task.get("envstep", 0))
        shipper = EpisodeShipper(self._comm.send_episodes)

        def send() -> None:
            nonlocal steps_at_last_send
            data_id = f"{self._task['task_id']}_{uuid.uuid4().hex[:8]}"
            version = chunk.version if chunk.version is not None else self.policy_version
            rows = chunk.size
            arrays = chunk.take()
            # Once per chunk rather than per step: NaN/inf from the env would poison training.
            check_finite(env_id, *(a for a in arrays.values() if a.dtype.kind == "f"))
            nbytes = self._comm.send_stepdata(data_id, frames.pack(arrays, self._framed), self._codec)
            self._comm.send_metadata(ChunkMeta(
                data_id=data_id, task_id=self._task["task_id"], policy_version=version, n_samples=rows,
                env_steps=steps - steps_at_last_send, nbytes=nbytes, envstep=base_envstep + steps,
                ts=round(time.time(), 3)).to_dict())
            steps_at_last_send = steps
            if self._deterministic:  # lockstep: wait as long as a policy (common/config.py apply_deterministic)
                newer = self._comm.flush(max_wait_s=float(c.policy_wait_s))
                self._setting_at(setting, base_envstep + steps)
            else:
                newer = self._comm.flush()
                self._follow_setting(setting)
            # On-policy data is only useful from the version the learner trains next: wait for it.
            if self._source.waits_for_new_version and not self._comm.stop_flag and steps < budget:
                newer = self._comm.wait_for_policy_update(float(c.policy_wait_s))
            if newer:
                self._refresh_policy()

        while steps < budget and not self._comm.stop_flag and time.monotonic() < deadline:
            env_action, record = self._policy.act(obs, setting, self._rng)
            self._watch.stepping()
            next_obs, reward, terminated, truncated, info = step(self._env, env_id, env_action)
            self._watch.stepped()
            next_obs = self._spec.obs_batch(next_obs)
            done = terminated | truncated
            real_next = true_next_obs(next_obs, done, info, self._spec)
            finished = len(stats.returns)
            stats.step(reward, episode_ends(done, info))  # whole games, where a lost life is terminal for learning
            steps += self._env_num
            if len(stats.returns) > finished:
                shipper.add(stats.returns[finished:], stats.lengths[finished:], base_envstep + steps, self.policy_version)
            shipper.tick()
            if chunk.add(adder.add(obs, record, reward, real_next, terminated, truncated), self.policy_version):
                send()
            obs = next_obs
        # The task's end is not the episodes': the adder bootstraps them from obs, and the next
        # task of the run continues them from there (live.obs).
        chunk.add(adder.flush(obs), self.policy_version)
        if chunk.size or steps > steps_at_last_send:
            send()
        shipper.ship()
        live.obs = obs
        return steps

    def _run_eval(self) -> int:
        cfg = self._cfg
        ev = cfg.policy.eval.evaluator
        n_episode = int(self._task.get("eval_episodes") or cfg.env.n_evaluator_episode)
        # Episodes start on whichever env is free, the first n_episode started count, and each of
        # them plays to its end: the episodes spread over the envs (none idles while another has
        # several left to play, as with fixed per-env quotas), and whether an episode counts never
        # depends on how it turns out ("the first N to finish" would favour short ones).
        counting = np.arange(self._env_num) < n_episode  # the env's current episode counts
        started = int(counting.sum())
        stats = self._live.episodes
        stats.new_task()
        # Every eval plays fresh episodes from its own seeds, on envs built once per run.
        obs, _ = self._env.reset(seed=env_seeds(int(self._task.get("seed", 0)), self._env_num))
        stats.restart()
        steps = 0
        cap = int(ev.max_env_steps)
        deadline = time.time() + float(ev.max_episode_seconds) * max(1, -(-n_episode // self._env_num))
        while counting.any():
            if self._comm.poll_stop() or time.time() > deadline:
                break
            if cap and steps >= cap:
                self.capped = True
                break
            env_action = self._policy.act_eval(self._spec.obs_batch(obs), self._rng)
            self._watch.stepping()
            obs, reward, terminated, truncated, _ = step(self._env, cfg.env.env_id, env_action)
            self._watch.stepped()
            check_finite(cfg.env.env_id, reward, *([obs] if self._spec.obs_kind == "box" else []))
            done = terminated | truncated
            stats.step(reward, done, counting)
            steps += int(counting.sum())
            # The vector env has reset these envs (autoreset): their next episodes start now.
            for i in np.flatnonzero(done & counting):
                counting[i] = started < n_episode
                started += int(counting[i])
        return steps


def _notice_no_env_cache(conn: Any) -> None:
    """Say once per worker (a Redis key, SET NX, remembers it across work-horses) that a forking
    worker rebuilds and resets envs at every task."""
    from rq import get_current_job

    job = get_current_job()
    name = getattr(job, "worker_name", None)
    if not name:
        return
    try:
        first = bool(conn.set(keys.worker_notice(name), "1", nx=True, ex=86400))
    except ValueError:  # a worker name that is no key component: say it every time
        first = True
    if first:
        log.warning("worker %s runs each collector task in a fresh work-horse, so envs are built and reset at every "
                    "task and episodes longer than a task are cut at its end; start collector workers with "
                    "-w workers.worker.CollectorWorker to keep envs between tasks (docs/architecture.md)", name)


def run_collector_task(task: dict) -> dict[str, Any]:
    """RQ job function for queue ``collector``: run one collector or eval task to its end.

    On a :class:`workers.worker.CollectorWorker` the task borrows its run's envs from the
    worker's cache (workers/live_envs.py) and leaves them for the next task of the run; in a
    forking worker it builds its own and closes them at its end.

    Args:
        task: the wire form of a :class:`common.messages.CollectorTask`
            (:meth:`coordinator.commander.SoloCommander.get_collector_task`).

    Returns:
        The finish info (also sent as a ``finished`` event on ``rqrl:{exp}:events``), with
        ``env_built`` (this task built its envs), ``episodes_cut`` (training episodes this task
        left unfinished that no later task continues) and ``setup_s``.

    Raises:
        workers.task.TaskError: a malformed task. Any error is also reported as a ``failed``
        event naming the task, then re-raised so RQ marks the job failed.
    """
    t_entry = time.perf_counter()
    ctx = open_task(task, "collector")
    conn, exp, cfg, eval_flag = ctx.conn, ctx.ns, ctx.cfg, ctx.task.eval_flag
    task = ctx.task.to_dict()  # the checked task, for the parts that take its dict
    comm = RedisCommCollector(conn, task, cfg.policy.collect.collector.data_ttl)
    cache = live_envs.CACHE
    key = (exp, ctx.task.run_id, "eval" if eval_flag else "train")

    def report_stall(reason: str) -> None:  # from the watch's thread: the main one is stuck in env.step
        events.emit(conn, exp, "failed", ctx.task_id, "collector", error=f"EnvStalled: {reason}", eval_flag=eval_flag)

    watch = StepWatch(float(cfg.policy.collect.collector.step_timeout_s), cfg.env.env_id, report_stall)
    with task_scope(ctx, lambda _e: {"eval_flag": eval_flag}), watch:
        comm.deal_with_collector_start()
        try:
            if cache is None:
                if not eval_flag:
                    _notice_no_env_cache(conn)
                live = build_live_envs(cfg, task)
                try:
                    info = _run(ctx, task, comm, live, t_entry, watch)
                    info["episodes_cut"] = 0 if eval_flag or comm.stop_flag else live.episodes.running
                finally:
                    live.close()
            else:
                with cache.borrow(key, lambda: build_live_envs(cfg, task)) as live:
                    info = _run(ctx, task, comm, live, t_entry, watch)
                    info["episodes_cut"] = 0
                if comm.stop_flag:  # the run is ending: its envs are not needed again
                    cache.close_run(exp, ctx.task.run_id)
        finally:
            comm.close()
        info["limiter_wait_s"] = round(comm.limiter_wait_s, 3)
        info["policy_errors"] = comm.policy_errors
        comm.deal_with_collector_close(info)
    return info


def _run(ctx: TaskContext, task: dict, comm: RedisCommCollector, live: LiveEnvs, t_entry: float,
         watch: StepWatch) -> dict[str, Any]:
    collector = Collector(ctx.cfg, task, comm, live, watch, algorithm=ctx.algorithm, ns=ctx.ns)
    info = collector.run()
    info["env_built"] = live.built_by == ctx.task_id
    # Task start-up: config, env build (on a run's first task), policy wait and fetch (seconds).
    info["setup_s"] = round(collector.ready_at - t_entry, 4)
    return info
