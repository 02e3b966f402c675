"""Collector tasks: roll out the policy in a gymnasium vector env, ship transitions to the learner.

``rq worker collector`` runs :func:`run_collector_task` with a task dict from the commander.

A training task acts with the policy (``policy.act`` with the task's ``collect_setting``, e.g.
an exploration rate), turns steps into rows with the policy's adder, packs them into chunks of at
least ``policy.collect.n_sample`` rows (one msgpack blob plus one metadata entry on the
buffer's stream each; image fields as distinct frames, common/frames.py, and the blob
compressed per ``collector.compression``, common/chunk_codec.py; tagged with the policy version that produced them), refreshes its
weights whenever the learner publishes a newer version (on-policy algorithms wait for it after
each chunk), and ends after ``task_env_steps`` env steps or at the stop flag. An eval task
(``eval_flag``) plays ``env.n_evaluator_episode`` deterministic episodes, counts each exactly
once and sends no training data. Both report the seed's finish info.
"""

from __future__ import annotations

import io
import time
import uuid
from typing import Any

import numpy as np
import torch
from easydict import EasyDict

from common import chunk_codec, events, frames, spaces
from common.policy import algorithm_of, create_policy, export
from common.seeding import env_seeds
from workers.comm_collector import RedisCommCollector
from workers.envs import check_finite, make_vector_env, step, true_next_obs
from workers.task import Heartbeat, TaskError, check_current, task_connection, task_namespace, validate_task


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


class EpisodeStats:
    """Per-env episode return / length / duration accounting for the finish info."""

    def __init__(self, env_num: int) -> None:
        self.ret = np.zeros(env_num)
        self.len = np.zeros(env_num, dtype=np.int64)
        self.start = np.full(env_num, time.time())
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.durations: list[float] = []

    def step(self, reward: np.ndarray, done: np.ndarray, count: np.ndarray | None = None) -> None:
        """Add one vector step; close episodes where ``done`` (and ``count`` allows, if given)."""
        self.ret += reward
        self.len += 1
        if done.any():
            now = time.time()
            for i in np.flatnonzero(done):
                if count is None or count[i]:
                    self.returns.append(float(self.ret[i]))
                    self.lengths.append(int(self.len[i]))
                    self.durations.append(now - self.start[i])
                self.ret[i], self.len[i], self.start[i] = 0.0, 0, now

    def finish_info(self, step_count: int, seconds: float, policy_version: int, eval_flag: bool) -> dict[str, Any]:
        """The seed's finish info (times in seconds, steps in env steps)."""
        n = len(self.returns)
        return {
            "real_episode_count": n,
            "step_count": int(step_count),
            "avg_time_per_episode": float(np.mean(self.durations)) if n else 0.0,
            "avg_step_per_episode": float(np.mean(self.lengths)) if n else 0.0,
            "avg_time_per_step": seconds / step_count if step_count else 0.0,
            "reward_mean": float(np.mean(self.returns)) if n else 0.0,
            "reward_std": float(np.std(self.returns)) if n else 0.0,
            "policy_version": int(policy_version),
            "eval_flag": bool(eval_flag),
            "duration": round(seconds, 3),
        }


class Collector:
    """One collector task's rollout loop (train or eval), talking to Redis through ``comm``.

    Algorithm-free: acting, the transition rows and exploration belong to the policy
    (common/policy/base.py); the task's ``collect_setting`` is handed to it unread.
    """

    def __init__(self, cfg: EasyDict, task: dict, comm: RedisCommCollector) -> None:
        self._cfg = cfg
        self._task = task
        self._comm = comm
        self._eval = bool(task["eval_flag"])
        torch.set_num_threads(cfg.policy.collect.collector.torch_threads)
        torch.manual_seed(int(task.get("seed", 0)))
        self._rng = np.random.default_rng(int(task.get("seed", 0)))
        env_num = cfg.env.evaluator_env_num if self._eval else cfg.env.collector_env_num
        spaces.import_env_modules(list(cfg.env.import_names))
        self._env = make_vector_env(cfg.env, env_num, train=not self._eval)
        try:
            self._spec = spaces.from_spaces(cfg.env.env_id, self._env.single_observation_space,
                                            self._env.single_action_space)
            spaces.check_model(cfg, self._spec)
            self._policy = create_policy(cfg, self._spec, modes=("eval",) if self._eval else ("collect",), device="cpu")
        except Exception:
            self._env.close()
            raise
        self._on_policy = algorithm_of(cfg).data_source == "on_policy"
        # Image fields travel as distinct frames (common/frames.py), compressed per the config.
        self._framed = frames.framed_fields(self._spec, self._policy.schema()) if not self._eval else []
        self._codec = chunk_codec.resolve(str(cfg.policy.collect.collector.compression), self._spec.obs_kind == "image")
        self._env_num = env_num
        self.policy_version = -1  # version of the weights held; set by the first policy fetch
        self.update_delays: list[float] = []  # seconds from each publication to acting with it

    def _refresh_policy(self) -> None:
        weights = self._comm.get_policy_update_info()
        if weights is not None:
            self._policy.set_weights(weights)
            self.policy_version = int(self._comm.policy_version)
            # Publication -> acting with it (wall clocks of two hosts: skew adds to this figure).
            self.update_delays.append(max(0.0, time.time() - self._comm.policy_published_at))

    def run(self) -> dict[str, Any]:
        """Run the task to its end; returns the finish info (plus ``policy_update_delay_p50_ms`` / ``p95``).

        Raises:
            TimeoutError: no policy was published within ``collector.policy_wait_s`` seconds.
        """
        replay_key = self._task.get("eval_policy_key")
        if replay_key:  # a confirmation eval: exactly the weights an earlier eval played
            saved = export.load(io.BytesIO(self._comm.load_evaluated(replay_key)))
            self._policy.set_weights({k: v.numpy() for k, v in saved["weights"].items()})
            self.policy_version = int(saved["train_iter"])
            self._comm.policy_envstep = int(saved.get("envstep", 0))
        else:
            self._comm.wait_for_policy(float(self._cfg.policy.collect.collector.policy_wait_s))
            self._refresh_policy()
        start = time.time()
        self.ready_at = time.perf_counter()
        try:
            steps, stats = self._run_eval() if self._eval else self._run_train()
        finally:
            self._env.close()
        info = stats.finish_info(steps, time.time() - start, self.policy_version, self._eval)
        info["policy_envstep"] = int(self._comm.policy_envstep)
        if self._eval:  # what was played is what the coordinator may export
            info["confirmation"] = bool(replay_key)
            bundle = export.bundle(self._policy, self.policy_version)
            bundle["envstep"] = info["policy_envstep"]
            self._comm.store_evaluated(export.to_bytes(bundle), self.policy_version)
        delays = self.update_delays[1:]  # the first fetch measures how old the policy was at task start
        if delays:
            info["policy_update_delay_p50_ms"] = round(float(np.percentile(delays, 50)) * 1000, 2)
            info["policy_update_delay_p95_ms"] = round(float(np.percentile(delays, 95)) * 1000, 2)
        return info

    def _run_train(self) -> tuple[int, EpisodeStats]:
        cfg = self._cfg
        env_id = cfg.env.env_id
        setting = dict(self._task["collect_setting"])
        budget = int(cfg.policy.collect.collector.task_env_steps)
        adder = self._policy.make_adder(self._env_num, setting)
        # On-policy rows go out as soon as the adder emits a rollout: its version is current now.
        chunk = ChunkBuilder(1 if self._on_policy else int(cfg.policy.collect.n_sample))
        stats = EpisodeStats(self._env_num)
        obs, _ = self._env.reset(seed=env_seeds(int(self._task.get("seed", 0)), self._env_num))
        obs = self._spec.obs_batch(obs)
        steps = steps_at_last_send = 0
        base_envstep = int(self._task.get("envstep", 0))

        def send() -> None:
            nonlocal steps_at_last_send
            data_id = f"{self._task['task_id']}_{uuid.uuid4().hex[:8]}"
            version = chunk.version if chunk.version is not None else self.policy_version
            rows = chunk.size
            arrays = chunk.take()
            # Once per chunk rather than per step: NaN/inf from the env would poison training.
            check_finite(env_id, *(a for a in arrays.values() if a.dtype.kind == "f"))
            nbytes = self._comm.send_stepdata(data_id, frames.pack(arrays, self._framed), self._codec)
            self._comm.send_metadata({
                "data_id": data_id, "task_id": self._task["task_id"], "policy_version": version,
                "n_samples": rows, "env_steps": steps - steps_at_last_send, "nbytes": nbytes,
                "envstep": base_envstep + steps, "ts": round(time.time(), 3),
            })
            steps_at_last_send = steps
            newer = self._comm.flush()
            # On-policy data is only useful from the version the learner trains next: wait for it.
            if self._on_policy and not self._comm.stop_flag and steps < budget:
                newer = self._comm.wait_for_policy_update(float(cfg.policy.collect.collector.policy_wait_s))
            if newer:
                self._refresh_policy()

        while steps < budget and not self._comm.stop_flag:
            env_action, record = self._policy.act(obs, setting, self._rng)
            next_obs, reward, terminated, truncated, info = step(self._env, env_id, env_action)
            next_obs = self._spec.obs_batch(next_obs)
            done = terminated | truncated
            real_next = true_next_obs(next_obs, done, info, self._spec)
            stats.step(reward, done)
            steps += self._env_num
            if chunk.add(adder.add(obs, record, reward, real_next, terminated, truncated), self.policy_version):
                send()
            obs = next_obs
        # Episodes cut by the task's end are not terminal: the adder bootstraps them from obs.
        chunk.add(adder.flush(obs), self.policy_version)
        if chunk.size or steps > steps_at_last_send:
            send()
        return steps, stats

    def _run_eval(self) -> tuple[int, EpisodeStats]:
        cfg = self._cfg
        n_episode = int(self._task.get("eval_episodes") or cfg.env.n_evaluator_episode)
        # Fixed per-env quotas: counting "the first N episodes to finish" would favour short ones.
        quota = np.full(self._env_num, n_episode // self._env_num)
        quota[: n_episode % self._env_num] += 1
        done_count = np.zeros(self._env_num, np.int64)
        stats = EpisodeStats(self._env_num)
        obs, _ = self._env.reset(seed=env_seeds(int(self._task.get("seed", 0)), self._env_num))
        steps = 0
        deadline = time.time() + float(cfg.policy.eval.evaluator.max_episode_seconds) * max(1, quota.max())
        while (done_count < quota).any():
            if self._comm.poll_stop() or time.time() > deadline:
                break
            env_action = self._policy.act_eval(self._spec.obs_batch(obs))
            obs, reward, terminated, truncated, _ = step(self._env, cfg.env.env_id, env_action)
            check_finite(cfg.env.env_id, reward, *([obs] if self._spec.obs_kind == "box" else []))
            done = terminated | truncated
            counts = done_count < quota
            stats.step(reward, done, counts)
            done_count += (done & counts).astype(np.int64)
            steps += int(counts.sum())
        return steps, stats


def run_collector_task(task: dict) -> dict[str, Any]:
    """RQ job function for queue ``collector``: run one collector or eval task to its end.

    Args:
        task: plain dict from :meth:`coordinator.commander.SoloCommander.get_collector_task`.

    Returns:
        The finish info (also sent as a ``finished`` event on ``rqrl:{exp}:events``).

    Raises:
        workers.task.TaskError: a malformed task. Any error is also reported as a ``failed``
        event naming the task, then re-raised so RQ marks the job failed.
    """
    t_entry = time.perf_counter()
    cfg = validate_task(task, "collector")
    conn = task_connection(task)
    exp, task_id = task_namespace(task), task["task_id"]
    check_current(conn, task)
    comm = RedisCommCollector(conn, task, cfg.policy.collect.collector.data_ttl)
    try:
        with Heartbeat(conn, exp, task_id, cfg.commander.heartbeat_timeout):
            comm.deal_with_collector_start()
            try:
                collector = Collector(cfg, task, comm)
                info = collector.run()
            finally:
                comm.close()
            # Task start-up: config, env build, policy wait and first fetch (seconds).
            info["setup_s"] = round(collector.ready_at - t_entry, 4)
            info["limiter_wait_s"] = round(comm.limiter_wait_s, 3)
            info["policy_errors"] = comm.policy_errors
            comm.deal_with_collector_close(info)
        return info
    except TaskError:
        raise  # not this task's runner (a duplicate id): report nothing under its id
    except Exception as e:
        events.emit(conn, exp, "failed", task_id, "collector", error=f"{type(e).__name__}: {e}"[:2000],
                    eval_flag=bool(task.get("eval_flag")))
        raise
