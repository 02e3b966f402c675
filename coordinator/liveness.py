"""Liveness: which running tasks are dead, and how many collector workers are alive.

A started task refreshes ``rqrl:{exp}:task:{task_id}:heartbeat`` (TTL
``commander.heartbeat_timeout``) from a thread of its worker; a queued one is dead when its RQ
job failed, stopped or vanished before it started. :class:`Liveness` checks both every second
on a thread of its own and queues what it finds; the coordinator's loop applies it
(:meth:`Liveness.drain`), so the running tasks and the commander change on one thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, Optional

import redis
from rq import Queue
from rq.job import Job, JobStatus

from common import keys, redis_memory, worker_presence
from common.connection import primary_changes
from coordinator.stall import StallGuard
from coordinator.write_pause import WritePause, WriteProbe


def live_workers(conn: redis.Redis, queue: Queue) -> int:
    """The ``rq worker`` processes listening on ``queue`` that are alive
    (:func:`common.worker_presence.count_live`): rqrl's workers by the alive key each refreshes
    every 10 s (TTL 30 s), so a Redis that lost RQ's registry still sees them and a worker that
    died stops counting within 30 s; stock ``rq worker`` processes by RQ's registry (a member
    counts while its RQ key exists: up to 90 s after a kill while it runs a job, 480 s idle).
    At most three round trips, whatever the number of workers.
    """
    return worker_presence.count_live(conn, queue.name)


class Liveness:
    """Finds dead tasks of run ``exp`` among those ``snapshot`` returns.

    Args:
        conn: Redis client.
        exp: the run's namespace.
        heartbeat_timeout: seconds without a heartbeat that make a started task dead.
        snapshot: the running tasks, ``[(task_id, {"started": bool, ...})]``, safe to call from a thread.
        log: the coordinator's logger.
        probe: one write to Redis, None when it was served in time, else why not; default a
            :class:`coordinator.write_pause.WriteProbe` of ``rqrl:{exp}:write_probe`` that waits a
            sixth of the heartbeat timeout (tests pass their own).
        clock: a monotonic clock (seconds) for the stall guard and the write pause; tests pass their own.
    """

    def __init__(self, conn: redis.Redis, exp: str, heartbeat_timeout: float,
                 snapshot: Callable[[], list[tuple[str, dict[str, Any]]]], log: logging.Logger,
                 probe: Optional[Callable[[], Optional[str]]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn, self.exp, self.heartbeat_timeout, self.snapshot, self.log = conn, exp, heartbeat_timeout, snapshot, log
        self.stall = StallGuard(float(heartbeat_timeout), clock=clock)  # a Redis stall is no worker death
        # Nor is a pause of writes alone (CLIENT PAUSE WRITE, a failover), which reads do not show.
        self._probe = probe or WriteProbe(conn, keys.write_probe(exp), wait_s=float(heartbeat_timeout) / 6)
        self.writes = WritePause(self._probe, log, clock)
        self._failovers_seen = 0  # Sentinel's changes of primary when the OOM replies were last counted
        # The liveness pass runs on a thread; the tasks it finds dead wait here for the loop.
        self.dead: queue.SimpleQueue[list[tuple[str, str]]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if isinstance(self._probe, WriteProbe):
            self._probe.close()

    def grace(self) -> None:
        """Give every task one heartbeat period to beat again (heartbeats were refused: a failover)."""
        self.stall.grace()

    def _run(self) -> None:
        """Run :meth:`find_dead` every second, off the event loop."""
        while not self._stop.wait(1.0):
            try:
                self.dead.put(self.find_dead())
            except Exception as e:  # noqa: BLE001 - the pass must outlive one bad round; the loop meets
                # the same Redis errors and handles them
                self.log.warning("liveness pass failed: %s: %s", type(e).__name__, e)

    def _count_oom_replies(self) -> None:
        """Hand Redis's count of OOM replies to :meth:`WritePause.note_oom_replies` (a Redis
        without ``INFO errorstats``, before 6.2, or one that refuses INFO: nothing to count). The
        count is one server's: after a Sentinel failover the next count is a new baseline."""
        try:
            stats = self.conn.info("errorstats")
        except redis.RedisError:
            return
        failovers = len(primary_changes(self.conn))
        if failovers != self._failovers_seen:
            self._failovers_seen = failovers
            self.writes.forget_oom_replies()
        self.writes.note_oom_replies(_count_of(stats.get("errorstat_OOM")))

    def _redis_full(self) -> bool:
        """Redis is at its ``maxmemory`` (within 1 %): writes that need memory are refused; or it
        refused the write probe, or any client's write, for memory within two heartbeat timeouts
        (the grace after the refusal, and the heartbeat timeout of a task that its own refused
        write ended: :meth:`coordinator.write_pause.WritePause.full_within`)."""
        if self.writes.full_within(2 * float(self.heartbeat_timeout)):
            return True
        try:
            mem = redis_memory.memory_info(self.conn)
        except redis.RedisError:
            return False
        return mem["max"] > 0 and mem["used"] >= 0.99 * mem["max"]

    def find_dead(self) -> list[tuple[str, str]]:
        """Started tasks whose heartbeat expired and queued ones whose RQ job died, with the reason.

        Four round trips whatever the number of tasks: a write probe, one MGET of the heartbeat
        keys, Redis's error counts (``INFO errorstats``), one pipeline reading the status of the
        queued tasks' RQ jobs. A
        heartbeat read that spanned a stall (a Redis pause longer than the heartbeat TTL expires
        every heartbeat while no worker can write) is not trusted, nor one made while Redis holds
        or refuses writes (:class:`coordinator.write_pause.WritePause`); workers get one heartbeat
        timeout after either to refresh before missing heartbeats count as deaths
        (:class:`coordinator.stall.StallGuard`).
        """
        snapshot = self.snapshot()
        started = [t for t, e in snapshot if e["started"]]
        waiting = [t for t, e in snapshot if not e["started"]]
        dead = []
        # Probed before the read: heartbeats cannot expire between a write served and the MGET.
        if self.writes.held():
            self.stall.grace()
        beats = self.conn.mget([keys.heartbeat(self.exp, t) for t in started]) if started else []
        # The clock is read after the reply: the reply that spanned a stall is the one to distrust.
        trusted = self.stall.read_done()
        self._count_oom_replies()
        if self.stall.stall_s:
            self.writes.reads_waited()
            self.log.warning("liveness pass stalled %.1f s (Redis unavailable?); heartbeat checks paused %.0f s",
                             self.stall.stall_s, self.heartbeat_timeout)
        missing = [t for t, beat in zip(started, beats) if beat is None]
        if trusted and missing and self._redis_full():
            # A full noeviction Redis refuses the heartbeat writes of live workers: the run's
            # OOM stop follows, and no worker died.
            self.log.warning("%d heartbeat(s) missing while Redis is full: not counted as worker deaths", len(missing))
        elif trusted:
            dead += [(t, f"heartbeat lost (no {keys.heartbeat(self.exp, t)} for "
                         f"{self.heartbeat_timeout} s): the worker process died") for t in missing]
        if waiting:
            pipe = self.conn.pipeline(transaction=False)
            for t in waiting:
                pipe.hget(Job.key_for(t), "status")
            for t, raw in zip(waiting, pipe.execute()):
                status = raw.decode() if raw else None
                if status is None or status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
                    dead.append((t, f"RQ job is {status or 'gone'} before the task started"))
        return dead

    def check_now(self) -> None:
        """One pass on this thread (the wrap-up, after the thread stopped); :meth:`drain` returns it."""
        self.dead.put(self.find_dead())

    def drain(self) -> list[tuple[str, str]]:
        """Every dead task found since the last call, ``[(task_id, reason)]`` (a task may have ended since)."""
        found: list[tuple[str, str]] = []
        while True:
            try:
                found += self.dead.get_nowait()
            except queue.Empty:
                return found


def _count_of(errorstat: Any) -> int:
    """``count`` of an ``INFO errorstats`` entry: ``{"count": 3}``, or ``"count=3"`` as redis-py
    5.0 (the floors' pin) leaves a one-field value; 0 when absent."""
    if isinstance(errorstat, dict):
        return int(errorstat.get("count", 0))
    if isinstance(errorstat, str) and errorstat.startswith("count="):
        return int(errorstat.split("=", 1)[1])
    return 0


class WorkerCount:
    """The live ``rq worker collector`` processes, handed to the commander when their number changes
    (it sizes the collector task space from it).

    Args:
        conn: Redis client.
        queue: the collector queue.
        commander: has ``follow_collector_workers(n)``.
        log: the coordinator's logger.
    """

    def __init__(self, conn: redis.Redis, queue: Queue, commander: Any, log: logging.Logger) -> None:
        self.conn, self.queue, self.commander, self.log = conn, queue, commander, log
        self.count: int | None = None  # at the last poll; None before the first

    def poll(self) -> None:
        """Count the workers (two round trips) and tell the commander a changed count."""
        n = live_workers(self.conn, self.queue)
        if n != self.count:
            self.commander.follow_collector_workers(n)
            self.log.info("collector workers: %s -> %d; collector task space %s", self.count, n,
                          self.commander.summary()["collector_task_space"])
            self.count = n
