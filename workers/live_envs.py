"""Envs that outlive a collector task: one run's vector env, the observations where its last
task stopped and its running episode statistics, kept by a long-lived collector worker.

A collector task borrows its run's live envs (building them on the run's first task on this
worker), steps them from :attr:`LiveEnvs.obs`, and hands them back with the observations where
it stopped, so the next task of the run continues the same episodes: a training episode ends
only when the env ends it (terminated or truncated by its own rules), never because a task
ended. The task's end is still a flush that bootstraps the unfinished episodes (the adder's
``flush``), as at a rollout's end in PPO with persistent envs (Schulman et al. 2017)::

    cache = live_envs.enable(max_runs=2)         # workers.worker.CollectorWorker, once per process
    with cache.borrow(key, build) as live:       # build() -> LiveEnvs on the run's first task
        obs = live.obs                           # None on a fresh build: reset with the task's seed
        ... step live.env, live.episodes.step(...) ...
        live.obs = obs                           # where the next task of the run continues
    # an exception inside the block closes the envs: their state is unknown
    cache.close_run(ns, run_id)                  # the run's stop flag: its envs go at once
    cache.sweep()                                # a timer thread: envs idle past their idle_s go

Only a process that runs tasks one after another keeps envs (RQ's ``SimpleWorker`` base of
``CollectorWorker``); in RQ's default forking worker each task runs in a fresh work-horse, the
module's :data:`CACHE` stays None, and every task builds and closes its own envs (the old life
cycle: episodes longer than a task are cut, and bootstrapped, at every task end).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (run namespace, run id, "train" | "eval")


class EpisodeStats:
    """Per-env running episode return / length / start time, and the episodes finished since
    :meth:`new_task` (what one task reports: returns in env reward units, lengths in env steps,
    durations in seconds)."""

    def __init__(self, env_num: int) -> None:
        self.ret = np.zeros(env_num)
        self.len = np.zeros(env_num, dtype=np.int64)
        self.start = np.full(env_num, time.time())
        self.new_task()

    def new_task(self) -> None:
        """Forget the finished episodes reported so far; running episodes go on."""
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.durations: list[float] = []

    def restart(self) -> None:
        """Every env was reset: running episodes start again from zero."""
        self.ret[:] = 0.0
        self.len[:] = 0
        self.start[:] = time.time()

    @property
    def running(self) -> int:
        """Episodes under way (an env stepped at least once since its last reset)."""
        return int((self.len > 0).sum())

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


@dataclass
class LiveEnvs:
    """One run's vector env on this worker, and what a task needs to continue where the last stopped.

    Attributes:
        env: the gymnasium vector env (SAME_STEP autoreset, workers/envs.py).
        spec: its spaces (common/spaces.py).
        policy: the collect- or eval-mode policy built for these envs (weights set per task).
        episodes: running episode statistics (:class:`EpisodeStats`).
        obs: the stored-form observations (E, *O) where the last task stopped; None until the
            first reset.
        policy_version: the version of the weights ``policy`` holds (-1: none yet).
        idle_s: seconds these envs may sit unused before :meth:`EnvCache.sweep` closes them.
        built_by: the task that built them (its finish info says it built envs).
        opponent: the league opponent of the games under way (two-player games, workers/opponents.py).
        opponents: snapshot policies loaded for these envs, least recently used first.
    """

    env: Any
    spec: Any
    policy: Any
    episodes: EpisodeStats
    obs: Optional[np.ndarray] = None
    policy_version: int = -1
    idle_s: float = 300.0
    built_by: str = ""
    last_used: float = field(default_factory=time.monotonic)
    opponent: Optional[str] = None
    opponents: OrderedDict = field(default_factory=OrderedDict)

    def close(self) -> None:
        """Close the vector env (and its subprocesses, for an async one); errors are logged."""
        try:
            self.env.close()
        except Exception as e:  # a broken env must not take the worker down with it
            log.warning("closing envs of %s failed: %s: %s", self.spec.env_id if self.spec else "?", type(e).__name__, e)


class EnvCache:
    """The live envs of at most ``max_runs`` runs on this process, least recently used first out.

    Thread-safe: tasks borrow on the worker's main thread while a timer thread sweeps; a
    borrowed entry is never closed under its task.
    """

    def __init__(self, max_runs: int = 2) -> None:
        if max_runs < 1:
            raise ValueError(f"max_runs must be >= 1, got {max_runs}")
        self.max_runs = int(max_runs)
        self._entries: dict[Key, LiveEnvs] = {}
        self._borrowed: set[Key] = set()
        self._lock = threading.Lock()
        self.builds = 0  # vector envs built over the process's life

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def keys(self) -> list[Key]:
        with self._lock:
            return list(self._entries)

    @contextlib.contextmanager
    def borrow(self, key: Key, build: Callable[[], LiveEnvs]) -> Iterator[LiveEnvs]:
        """The live envs under ``key``, built by ``build()`` on a miss; an exception inside the
        block closes and forgets them (their episode state can no longer be trusted).

        Raises:
            RuntimeError: ``key`` is already borrowed (two tasks at once on one process).
        """
        with self._lock:
            if key in self._borrowed:
                raise RuntimeError(f"envs of {key[0]} ({key[2]}) are already in use on this process")
            live = self._entries.pop(key, None)
            self._borrowed.add(key)
        try:
            if live is None:
                live = build()
                self.builds += 1
            yield live
        except BaseException:
            with self._lock:
                self._borrowed.discard(key)
            if live is not None:
                live.close()
            raise
        live.last_used = time.monotonic()
        evicted = []
        with self._lock:
            self._borrowed.discard(key)
            self._entries[key] = live  # re-inserted last: the most recently used
            # A run is as recent as its most recently used entry (entries are in use order).
            recency = {k[:2]: i for i, k in enumerate(self._entries)}
            runs = sorted(recency, key=recency.get)
            for run in runs[: max(0, len(runs) - self.max_runs)]:
                evicted += [self._entries.pop(k) for k in list(self._entries) if k[:2] == run]
        for old in evicted:
            log.info("closing the envs of %s: more than %d runs on this worker", old.spec.env_id, self.max_runs)
            old.close()

    def close_run(self, ns: str, run_id: str) -> int:
        """Close every idle entry of run (``ns``, ``run_id``); returns how many."""
        with self._lock:
            gone = [self._entries.pop(k) for k in list(self._entries) if k[:2] == (ns, run_id)]
        for live in gone:
            live.close()
        return len(gone)

    def sweep(self, now: Optional[float] = None) -> int:
        """Close entries idle for longer than their ``idle_s``; returns how many."""
        now = time.monotonic() if now is None else now
        with self._lock:
            gone = [self._entries.pop(k) for k, v in list(self._entries.items()) if now - v.last_used > v.idle_s]
        for live in gone:
            log.info("closing the envs of %s: idle for %.0f s", live.spec.env_id, now - live.last_used)
            live.close()
        return len(gone)

    def close_all(self) -> None:
        """Close every idle entry (the worker is exiting)."""
        with self._lock:
            gone = list(self._entries.values())
            self._entries.clear()
        for live in gone:
            live.close()


CACHE: Optional[EnvCache] = None  # set in processes that run tasks one after another


def enable(max_runs: int = 2) -> EnvCache:
    """Keep envs between the tasks this process runs (call once, in the worker process)."""
    global CACHE
    if CACHE is None:
        CACHE = EnvCache(max_runs)
    return CACHE
