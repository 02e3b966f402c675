"""Telling a whole-Redis stall from a worker death.

A task is declared dead when its heartbeat key (TTL ``heartbeat_timeout``) is missing. But a
Redis that stops answering for longer than that TTL (``DEBUG SLEEP``, a slow fork or disk, a
paused VM) expires every heartbeat while no worker can refresh its own: the read that follows
shows them all missing although every worker is alive. What gives such a stall away is the
coordinator's own clock: the pass that read the heartbeats, measured from the end of the pass
before it to the moment the reply came, took far longer than its usual pause plus one round
trip. A read that spanned a stall is not trusted, and the workers get one heartbeat period
after it to refresh before a missing heartbeat counts again.
"""

from __future__ import annotations

import time
from typing import Callable, Optional


class StallGuard:
    """Decides whether a liveness read may declare tasks dead.

    Args:
        heartbeat_timeout_s: the heartbeat keys' TTL (seconds): a stall shorter than about two
            thirds of it (workers refresh every third) cannot expire a live heartbeat; after a
            stall missing heartbeats are ignored for this long.
        pass_every_s: the pause between liveness passes (seconds).
        clock: a monotonic clock (seconds); tests may pass their own.
    """

    def __init__(self, heartbeat_timeout_s: float, pass_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        # A pass may be this much later than its schedule before it counts as stalled: one
        # heartbeat refresh period, the least delay that can make a live worker miss a beat.
        self.slack_s = self.heartbeat_timeout_s / 3
        self.pass_every_s = float(pass_every_s)
        self._clock = clock
        self._last_done: Optional[float] = None
        self._grace_until = 0.0
        self.stall_s = 0.0  # how late the last read was when it spanned a stall (seconds), else 0

    def grace(self, seconds: Optional[float] = None) -> None:
        """Ignore missing heartbeats for ``seconds`` (default one heartbeat timeout) from now,
        e.g. after a Sentinel failover, during which heartbeat writes were refused."""
        self._grace_until = max(self._grace_until, self._clock() + (self.heartbeat_timeout_s if seconds is None
                                                                     else float(seconds)))

    def read_done(self) -> bool:
        """Call once per pass, right after the heartbeats' reply arrived; True when it can be
        trusted (missing heartbeats are deaths).

        False in a grace period, and when the time since the previous pass ended exceeds the pause between passes by
        more than :attr:`slack_s`: the reply then spanned a stall (of Redis, or of this process,
        which cannot tell them apart), and a grace period of one heartbeat timeout starts
        (:attr:`stall_s` then says how late the reply was).
        """
        now = self._clock()
        previous, self._last_done = self._last_done, now
        late = 0.0 if previous is None else now - previous - self.pass_every_s
        self.stall_s = late if late > self.slack_s else 0.0
        if self.stall_s:
            self._grace_until = max(self._grace_until, now + self.heartbeat_timeout_s)
        return now >= self._grace_until
