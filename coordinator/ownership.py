"""Owning a run: its name, the ownership key ``rqrl:{exp}:coordinator`` and its keep-alive.

One coordinator per run: it holds a redis-py ``Lock`` on the ownership key (TTL
:data:`ALIVE_TTL_S`, extended every second; the token is the coordinator's name, so
``rqrl status`` and ``redis-cli GET`` show who owns the run). :meth:`Ownership.claim` says how
the run goes on (adopt it from Redis, start it fresh, or restore it from its folder); the
coordinator acts on that answer.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal, Optional

import redis
from redis.exceptions import LockError
from redis.lock import Lock

from common import keys
from common.data_shards import DataShards, StoreGroup, run_stores
from coordinator.errors import CoordinatorError, RunLost
from coordinator.runs import new_run_name, run_unfinished

ALIVE_TTL_S = 6.0  # seconds the ownership key outlives a coordinator that stopped extending it

Start = Literal["adopt", "fresh", "from_folder"]


def pick_run_name(conn: redis.Redis, exp_name: str, seed: int, fresh: bool) -> str:
    """The newest unfinished run of this experiment and seed in Redis (a restart), unless
    ``fresh``; else a new name, made unique in ``rqrl:runs`` (SADD answers who was first)."""
    suffix = f"-s{int(seed)}"
    if not fresh:
        for ns in sorted((n.decode() for n in conn.smembers(keys.runs())), reverse=True):
            other_exp, run_name = keys.split_namespace(ns)
            if other_exp == exp_name and run_name.endswith(suffix) and run_unfinished(conn, ns):
                return run_name
    base, n = new_run_name(int(seed)), 1
    name = base
    while not conn.sadd(keys.runs(), keys.namespace(exp_name, name)):
        n += 1
        name = f"{base}-{n}"
    return name


class Ownership:
    """The ownership key of run ``exp``, held under the token ``name``.

    Args:
        conn: Redis client.
        exp: the run's namespace.
        name: the coordinator's name (host and pid), the lock's token.
        log: the coordinator's logger.
    """

    def __init__(self, conn: redis.Redis, exp: str, name: str, log: logging.Logger,
                 data: Optional[DataShards] = None) -> None:
        self.conn, self.exp, self.name, self.log = conn, exp, name, log
        self.data = data  # the run's data shards (None: step data on conn)
        self.key = keys.coordinator_alive(exp)
        self.lock = Lock(conn, self.key, timeout=ALIVE_TTL_S, thread_local=False)
        self.saved_state: Optional[dict[str, Any]] = None  # the coordinator state to adopt, after claim()

    def claim(self, fresh: bool, from_folder: bool) -> Start:
        """Take the ownership key and say how the run starts: ``adopt`` (an unfinished run of this
        name is in Redis and not ``fresh``: its state is :attr:`saved_state`), ``from_folder``
        (``--resume`` of a run Redis no longer holds) or ``fresh``.

        Raises:
            CoordinatorError: another coordinator owns the run.
        """
        # A killed coordinator's lock expires within ALIVE_TTL_S; a live one keeps extending it.
        if not self._acquire(blocking=True, blocking_timeout=ALIVE_TTL_S + 1):
            owner = self.conn.get(self.key)
            raise CoordinatorError(
                f"run {self.exp!r} is owned by {owner.decode() if owner else '?'} (key {self.key}); "
                "stop it, or start another run (a different run name)")
        state_raw = self.conn.hget(keys.commander(self.exp), "state")
        run = self.conn.get(keys.run(self.exp))
        if state_raw and run and not self.conn.exists(keys.stop(self.exp)) and not fresh:
            self.saved_state = json.loads(state_raw)
            return "adopt"
        return "from_folder" if from_folder else "fresh"

    def clear_run_keys(self) -> None:
        """Delete every key an earlier run of this name left, but the ownership key: its step data
        (through the step-data store, wherever that keeps it), then the rest."""
        cleared = StoreGroup(run_stores(self.conn, self.data, self.exp)).drop_run()
        stale = [k for k in self.conn.scan_iter(match=keys.all_keys_pattern(self.exp), count=1000)
                 if k.decode() != self.key]
        if stale:
            cleared += int(self.conn.delete(*stale))
        if cleared:
            self.log.info("cleared %d keys left by an earlier run of %s", cleared, self.exp)

    def keep_alive(self) -> None:
        """Extend the ownership key's TTL (every second).

        Raises:
            RunLost: Redis lost the run (its run id key is gone), or another coordinator took it.
        """
        if not self.conn.exists(keys.run(self.exp)):
            raise RunLost(f"Redis lost the state of run {self.exp!r} (key {keys.run(self.exp)} is gone): "
                          "was it restarted without persistence, or flushed? See docs/deploy.md on AOF.")
        try:
            # Re-set the full TTL; fails atomically when the key expired or another coordinator holds it.
            self.lock.reacquire()
        except LockError:
            # Expired during a stall (a Redis pause longer than the TTL) and nobody took it: take it back.
            if not self._acquire(blocking=False):
                owner = self.conn.get(self.key)
                raise RunLost(f"lost ownership of {self.exp!r} to {owner.decode() if owner else '?'}") from None
            self.log.warning("ownership key %s had expired during a stall; re-acquired", self.key)

    def _acquire(self, **kwargs: Any) -> bool:
        """The lock's ``acquire`` under our token; also True when the key already holds our token:
        a SET NX that landed but whose reply a dropped connection lost is retried by the client,
        and the retry finds the key taken (by us)."""
        if self.lock.acquire(token=self.name, **kwargs):
            return True
        if self.conn.get(self.key) == self.name.encode():
            self.lock.local.token = self.name.encode()
            return True
        return False

    def release(self) -> None:
        """Give the run up (its end); nothing to do when the key expired or was taken over."""
        try:
            self.lock.release()
        except (LockError, redis.RedisError):
            pass
