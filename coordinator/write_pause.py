"""Telling a Redis that holds or refuses writes from dead workers.

``CLIENT PAUSE <ms> WRITE`` (what Redis's ``FAILOVER`` and a manual failover do to clients)
holds every write while reads are served on time; a demoted primary answers ``READONLY``, a
full ``noeviction`` Redis ``OOM``. No worker can write its heartbeat then, and a heartbeat past
its TTL reads as gone even while a pause keeps Redis from deleting it, so the liveness read
shows every task dead although all are alive; the stall guard (coordinator/stall.py) does not
see it, because the read came back on time. Redis 6.2 and 7.0 say nothing of a pause in
``INFO`` or ``CLIENT INFO``, so the coordinator asks with a write of its own: each liveness pass
first SETs ``rqrl:{exp}:write_probe`` and waits a moment for the reply. While the write is held
or refused, no task is declared dead; once one is served again, every task gets one more
heartbeat timeout to beat.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

import redis


class WriteProbe:
    """One small write (``SET key 1 PX ttl``) that waits at most ``wait_s`` seconds for its reply.

    It uses a connection of ``conn``'s pool of its own, so a held probe is dropped with its
    connection (Redis forgets a held command whose client left) without touching the
    coordinator's other commands, and the next call connects again.

    Args:
        conn: the coordinator's client.
        key: the probe's key.
        wait_s: seconds the reply may take before the write counts as held.
        ttl_s: the key's TTL (seconds); nothing reads it.
    """

    def __init__(self, conn: redis.Redis, key: str, wait_s: float, ttl_s: float = 10.0) -> None:
        self.conn, self.key, self.wait_s, self._ttl_ms = conn, key, float(wait_s), max(1, int(ttl_s * 1000))
        self._client: Optional[redis.Redis] = None

    def __call__(self) -> Optional[str]:
        """None when Redis took the write in time; else why not (held past ``wait_s``, or its error
        reply: ``READONLY ...``, ``OOM ...``, a lost connection)."""
        if self._client is None:
            self._client = redis.Redis(connection_pool=self.conn.connection_pool, single_connection_client=True)
        c = self._client.connection
        try:
            c.send_command("SET", self.key, "1", "PX", self._ttl_ms)
            if not c.can_read(timeout=self.wait_s):
                c.disconnect()
                return f"no reply within {self.wait_s:g} s"
            c.read_response()
        except redis.RedisError as e:
            c.disconnect()
            return f"{type(e).__name__}: {e}"
        return None

    def close(self) -> None:
        """Hand the probe's connection back to the pool (the next call takes one again)."""
        if self._client is not None:
            self._client.close()
            self._client = None


class WritePause:
    """Whether Redis holds the coordinator's writes, from one probe per liveness pass; logs each
    pause once as it starts and once as it ends, with its length.

    Args:
        probe: one write attempt: None when it was served, else why not (:class:`WriteProbe`).
        log: the coordinator's logger.
        clock: a monotonic clock (seconds); tests may pass their own.
    """

    def __init__(self, probe: Callable[[], Optional[str]], log: logging.Logger,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.probe, self.log, self._clock = probe, log, clock
        self.since: Optional[float] = None  # when the pause going on was first seen; None while writes are served
        self.cause = ""  # the probe's answer when the pause was first seen
        self._reads_waited = False
        self._full_at: Optional[float] = None  # the last write seen refused for memory (a full noeviction Redis)
        self._oom_replies: Optional[int] = None  # Redis's OOM replies to any client, at the last count

    def held(self) -> bool:
        """Probe once (before the heartbeats are read). True while writes are held or refused, and on
        the pass that sees them served again: heartbeats missed until now may be the pause's, and
        the caller gives every task one heartbeat timeout from now."""
        cause = self.probe()
        now = self._clock()
        if cause is not None and cause.startswith("OutOfMemoryError"):
            self._full_at = now
        if cause is not None:
            if self.since is None:
                self.since, self.cause, self._reads_waited = now, cause, False
                self.log.warning("Redis takes no writes (a write probe: %s): no task is declared dead until it does "
                                 "again", cause)
            return True
        if self.since is None:
            return False
        seconds, self.since = now - self.since, None
        if self._reads_waited:  # a stall of the whole server, which the stall guard names
            self.log.warning("Redis took writes again after %.1f s (reads waited too: a stall)", seconds)
        else:
            what = ("paused writes (CLIENT PAUSE / failover)" if self.cause.startswith("no reply")
                    else f"refused writes ({self.cause})")
            self.log.warning("Redis %s for %.1f s: heartbeats missed during it are not deaths", what, seconds)
        return True

    def note_oom_replies(self, count: int) -> None:
        """Hand in Redis's count of OOM replies to any client (``INFO errorstats``'s
        ``errorstat_OOM``, Redis >= 6.2), read once per liveness pass: a rise since the last count
        is a write refused for memory now, as a refused probe is. At the limit, Redis refuses
        writes on and off; a worker's write may be refused while every probe gets through."""
        if self._oom_replies is not None and count > self._oom_replies:
            self._full_at = self._clock()
        self._oom_replies = count

    def forget_oom_replies(self) -> None:
        """Drop the last count of OOM replies: the next one is a baseline (another server's)."""
        self._oom_replies = None

    def full_within(self, seconds: float) -> bool:
        """Whether a probe was refused for memory (redis-py's ``OutOfMemoryError``: a full
        ``noeviction`` Redis), or Redis counted an OOM reply (:meth:`note_oom_replies`), in the
        last ``seconds`` seconds. Redis at its limit refuses writes on
        and off as keys expire, and a task whose own write was refused so ends without a word
        (its failure event is a write too): its heartbeat stops one heartbeat timeout after its last
        beat, which may be that long after the probe was last refused."""
        return self._full_at is not None and self._clock() - self._full_at <= seconds

    def reads_waited(self) -> None:
        """The heartbeats' read of this pass was late too: the pause going on is a whole-Redis stall."""
        if self.since is not None:
            self._reads_waited = True
