"""Collector tasks: roll out the policy in a gymnasium vector env, ship transitions to the learner.

``rq worker collector`` runs :func:`run_collector_task` with a task dict from the commander.

A training task acts epsilon-greedily (epsilon from the task's ``collect_setting``), packs
n-step transitions into chunks of ``policy.collect.n_sample`` stacked rows (one msgpack blob
plus one metadata entry on the buffer's stream each), refreshes its weights whenever the
learner publishes a newer version, and ends after ``task_env_steps`` env steps or at the stop
flag. An eval task (``eval_flag``) plays ``env.n_evaluator_episode`` greedy episodes, counts
each exactly once and sends no training data. Both report the seed's finish info.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import torch
from easydict import EasyDict

from common import events
from common.policy import create_policy
from common.policy.dqn import TRANSITION_FIELDS, transition_schema
from common.seeding import env_seeds
from workers.comm_collector import RedisCommCollector
from workers.envs import check_finite, make_vector_env, step, true_next_obs
from workers.task import Heartbeat, TaskError, check_current, task_connection, validate_task


class ChunkBuilder:
    """Fills preallocated stacked arrays (see common/policy/dqn.py for the row layout)."""

    def __init__(self, n_sample: int, obs_shape: int) -> None:
        self.n_sample = n_sample
        self._schema = transition_schema(obs_shape)
        self._reset()

    def _reset(self) -> None:
        self.arrays = {k: np.empty((self.n_sample, *shape), dt) for k, (shape, dt) in self._schema.items()}
        self.size = 0

    def add(self, row: tuple) -> bool:
        """Append one transition row; True when the chunk is full."""
        for name, value in zip(TRANSITION_FIELDS, row):
            self.arrays[name][self.size] = value
        self.size += 1
        return self.size == self.n_sample

    def take(self) -> dict[str, np.ndarray]:
        """The filled rows (a view trimmed to ``size``), and start a new chunk."""
        out = {k: v[: self.size] for k, v in self.arrays.items()}
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

    def finish_info(self, step_count: int, seconds: float, train_iter: int, eval_flag: bool) -> dict[str, Any]:
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
            "train_iter": int(train_iter),
            "eval_flag": bool(eval_flag),
            "duration": round(seconds, 3),
        }


class Collector:
    """One collector task's rollout loop (train or eval), talking to Redis through ``comm``."""

    def __init__(self, cfg: EasyDict, task: dict, comm: RedisCommCollector) -> None:
        self._cfg = cfg
        self._task = task
        self._comm = comm
        self._eval = bool(task["eval_flag"])
        torch.set_num_threads(cfg.policy.collect.collector.torch_threads)
        torch.manual_seed(int(task.get("seed", 0)))
        self._policy = create_policy(cfg, enable_field=("collect", "eval"), device="cpu")
        self._rng = np.random.default_rng(int(task.get("seed", 0)))
        env_num = cfg.env.evaluator_env_num if self._eval else cfg.env.collector_env_num
        self._env = make_vector_env(cfg.env.env_id, env_num, cfg.env.manager.type, dict(cfg.env.env_kwargs))
        self._env_num = env_num
        self.train_iter = -1  # version of the weights held; set by the first policy fetch
        self.policy_lags: list[float] = []  # seconds from each publication to its use

    def _refresh_policy(self) -> None:
        weights = self._comm.get_policy_update_info()
        if weights is not None:
            self._policy.load_weights(weights)
            self.train_iter = int(self._comm.policy_version)
            # Publication -> acting with it (wall clocks of two hosts: skew adds to this figure).
            self.policy_lags.append(max(0.0, time.time() - self._comm.policy_published_at))

    def run(self) -> dict[str, Any]:
        """Run the task to its end; returns the finish info (plus ``policy_lag_p50_ms`` / ``p95``).

        Raises:
            TimeoutError: no policy was published within ``collector.policy_wait_s`` seconds.
        """
        self._comm.wait_for_policy(float(self._cfg.policy.collect.collector.policy_wait_s))
        self._refresh_policy()
        start = time.time()
        self.ready_at = time.perf_counter()
        try:
            steps, stats = self._run_eval() if self._eval else self._run_train()
        finally:
            self._env.close()
        info = stats.finish_info(steps, time.time() - start, self.train_iter, self._eval)
        lags = self.policy_lags[1:]  # the first fetch measures how old the policy was at task start
        if lags:
            info["policy_lag_p50_ms"] = round(float(np.percentile(lags, 50)) * 1000, 2)
            info["policy_lag_p95_ms"] = round(float(np.percentile(lags, 95)) * 1000, 2)
        return info

    def _run_train(self) -> tuple[int, EpisodeStats]:
        cfg = self._cfg
        env_id = cfg.env.env_id
        eps = float(self._task["collect_setting"]["eps"])
        budget = int(cfg.policy.collect.collector.task_env_steps)
        adder = self._policy.make_adder(self._env_num)
        chunk = ChunkBuilder(int(cfg.policy.collect.n_sample), int(cfg.policy.model.obs_shape))
        stats = EpisodeStats(self._env_num)
        obs, _ = self._env.reset(seed=env_seeds(int(self._task.get("seed", 0)), self._env_num))
        steps = steps_at_last_send = 0
        base_envstep = int(self._task.get("envstep", 0))

        def send() -> None:
            nonlocal steps_at_last_send
            data_id = f"{self._task['task_id']}_{uuid.uuid4().hex[:8]}"
            rows = chunk.size
            arrays = chunk.take()
            # Once per chunk rather than per step: NaN/inf from the env would poison training.
            check_finite(env_id, arrays["obs"], arrays["next_obs"], arrays["reward"])
            nbytes = self._comm.send_stepdata(data_id, arrays)
            self._comm.send_metadata({
                "data_id": data_id, "task_id": self._task["task_id"], "policy_iter": self.train_iter,
                "n_samples": rows, "env_steps": steps - steps_at_last_send, "nbytes": nbytes,
                "envstep": base_envstep + steps, "eps": round(eps, 4), "ts": round(time.time(), 3),
            })
            steps_at_last_send = steps
            if self._comm.flush():
                self._refresh_policy()

        while steps < budget and not self._comm.stop_flag:
            actions = self._policy.act(obs, eps, self._rng)
            next_obs, reward, terminated, truncated, info = step(self._env, env_id, actions)
            done = terminated | truncated
            real_next = true_next_obs(next_obs, done, info)
            stats.step(reward, done)
            steps += self._env_num
            for row in adder.add(obs, actions, reward, real_next, terminated, truncated):
                if chunk.add(row):
                    send()
            obs = next_obs
        # Episodes cut by the task's end are not terminal: bootstrap them from the current obs.
        for row in adder.flush(obs):
            if chunk.add(row):
                send()
        if chunk.size or steps > steps_at_last_send:
            send()
        return steps, stats

    def _run_eval(self) -> tuple[int, EpisodeStats]:
        cfg = self._cfg
        n_episode = int(cfg.env.n_evaluator_episode)
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
            actions = self._policy.greedy(obs)
            obs, reward, terminated, truncated, _ = step(self._env, cfg.env.env_id, actions)
            check_finite(cfg.env.env_id, obs, reward)
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
    exp, task_id = task["exp_name"], task["task_id"]
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
