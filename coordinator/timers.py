"""Periodic work of the coordinator's loop, registered as timers and run when due.

The loop polls its timers once a pass (a pass blocks at most 0.5 s on the events stream), so a
timer's period is a lower bound: a timer runs at most once every ``period_s`` seconds.
"""

from __future__ import annotations

import time
from typing import Callable


class Timers:
    """Callables to run every so many seconds, in the order they were added.

    Args:
        clock: seconds, e.g. ``time.monotonic`` (the default) or ``time.time``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._timers: list[list] = []  # [period_s, next due time, fn]

    def every(self, period_s: float, fn: Callable[[], object]) -> None:
        """Run ``fn`` at the first :meth:`poll` and then at most once every ``period_s`` seconds."""
        self._timers.append([float(period_s), 0.0, fn])

    def poll(self) -> None:
        """Run every timer that is due."""
        now = self._clock()
        for timer in self._timers:
            if now >= timer[1]:
                timer[1] = now + timer[0]
                timer[2]()
