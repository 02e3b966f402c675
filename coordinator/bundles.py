"""The eval bundles kept in Redis: only those that can still be exported or replayed.

Every eval task stores the final.pt bundle it played (``rqrl:{exp}:task:{task_id}:evaluated``,
TTL 2 h), so the coordinator can copy the best one to best.pt, a confirmation eval can replay
exactly the weights that passed, and final.pt can be those weights. Kept for their TTL, they
added up to most of a run's Redis memory (a 5 MB bundle per eval). Once an eval's bundle is none
of the best, the one under confirmation or the converged one, it is deleted.
"""

from __future__ import annotations

from typing import Any

from common import keys


class EvalBundles:
    """The eval task ids whose bundles may still be in Redis (finished evals not yet pruned)."""

    def __init__(self, stored: Any = ()) -> None:
        self.stored: set[str] = set(stored)

    def add(self, task_id: str) -> None:
        """An eval task finished: its bundle is in Redis (unless its worker could not store it)."""
        self.stored.add(task_id)

    def prune(self, conn: Any, exp: str, keep: set[str]) -> list[str]:
        """Delete the bundles of ``exp`` not in ``keep``; one round trip when there are any.

        Returns:
            The task ids whose bundles were deleted.

        Raises:
            redis.RedisError: the DEL failed (the ids stay listed; the next prune tries again).
        """
        drop = sorted(self.stored - keep)
        if drop:
            conn.delete(*[keys.evaluated_policy(exp, t) for t in drop])
            self.stored -= set(drop)
        return drop
