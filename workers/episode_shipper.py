"""A collector task's finished training episodes, sent to the coordinator as they happen.

Each finished episode's return, length, the run's env steps at its end and the acting policy
version go out batched: at most one event per :data:`common.logs.SHIP_EVERY_S` (1 s) per task,
holding every episode finished since the last, and none while no episode finished. The first
episode goes out at once, so a run's first return shows within a second.

Why an event on the control Redis and not a field of the chunk metadata: chunk metadata goes to
the learner (its buffer's stream), which would parse episodes it never uses on its hot path, and
the coordinator does not read that stream. The event is a ``scalars`` event, not a type of its own:
its ``scalars`` field holds ``train/episode_return`` and ``train/episode_length`` against env
steps, which a coordinator of the previous release writes to TensorBoard as any shipped scalar
(its event parser drops an unknown type with an error line per event), and its ``episodes`` field
(a JSON list of :class:`common.messages.TrainEpisode` dicts) is what today's coordinator also
logs (coordinator/episode_log.py). The collector's per-step cost is a list check and, while an
episode waits to be sent, a clock read.
"""

from __future__ import annotations

import json
import math
import time
from typing import Callable

from common.logs import SHIP_EVERY_S
from common.messages import TrainEpisode

RETURN_TAG = "train/episode_return"
LENGTH_TAG = "train/episode_length"


class EpisodeShipper:
    """Gathers a task's finished training episodes and sends them as one event when due.

    Args:
        send: sends one ``scalars`` event with the given fields (JSON strings):
            :meth:`workers.comm_collector.RedisCommCollector.send_episodes`.
        clock: monotonic seconds (injected by tests).
        every_s: the least seconds between two events.
    """

    def __init__(self, send: Callable[[dict[str, str]], None], clock: Callable[[], float] = time.monotonic,
                 every_s: float = SHIP_EVERY_S) -> None:
        self._send, self._clock, self._every_s = send, clock, every_s
        self._pending: list[TrainEpisode] = []
        self._sent_at = -math.inf  # the first episode is sent at once

    def add(self, returns: list[float], lengths: list[int], envstep: int, policy_version: int) -> None:
        """Queue episodes that ended at env step ``envstep`` (returns in env reward units, lengths in
        env steps, one each), then :meth:`tick`."""
        ts = round(time.time(), 3)
        self._pending.extend(TrainEpisode(envstep=int(envstep), ret=float(r), length=int(n),
                                          policy_version=int(policy_version), ts=ts) for r, n in zip(returns, lengths))
        self.tick()

    def tick(self) -> None:
        """Send the queue if the last event is ``every_s`` old (called every env step: without a
        queued episode it reads no clock)."""
        if self._pending and self._clock() - self._sent_at >= self._every_s:
            self.ship()

    def ship(self) -> None:
        """Send what is queued now (nothing when no episode finished since the last event)."""
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        self._sent_at = self._clock()
        scalars = [[tag, value, e.envstep, e.ts] for e in batch
                   for tag, value in ((RETURN_TAG, e.ret), (LENGTH_TAG, float(e.length)))]
        self._send({"scalars": json.dumps(scalars), "episodes": json.dumps([e.to_dict() for e in batch])})
