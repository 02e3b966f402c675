"""The solo commander's task spaces: how many collector and learner tasks run, and the eval slot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from common.task_space import TaskSpace
from coordinator.wire_state import WireState


@dataclass
class TaskSpaces(WireState):
    """Collector and learner task space, and which eval task runs (at most one at a time).

    An eval takes the separate eval slot (``eval_own_slot``, when ``commander.eval_task_space``
    > 0) instead of collector space, so evaluation never waits for a training task to finish.
    The field names are the commander state's wire keys (:class:`coordinator.wire_state.WireState`).
    """

    collector_task_space: TaskSpace
    learner_task_space: TaskSpace
    eval_in_flight: Optional[str] = None  # the running eval task's id
    eval_own_slot: bool = False  # the eval in flight holds the eval slot, not collector space

    def take_collector(self, task_id: str, eval_flag: bool, own_slot: bool) -> bool:
        """Take space for collector task ``task_id`` (an eval when ``eval_flag``, in the eval slot
        when ``own_slot``); False when no collector space is free."""
        if not own_slot and not self.collector_task_space.acquire_space():
            return False
        if eval_flag:
            self.eval_in_flight, self.eval_own_slot = task_id, own_slot
        return True

    def release_collector(self, task_id: str) -> None:
        """Give back the space collector task ``task_id`` held (its eval slot, if it was the eval in it)."""
        if self.eval_in_flight == task_id:
            self.eval_in_flight = None
            if self.eval_own_slot:
                self.eval_own_slot = False
                return
        self.collector_task_space.release_space()

    def follow_collector_workers(self, workers: int, cap: Optional[int], eval_slot: bool) -> None:
        """Size the collector task space to ``workers`` live collector workers.

        The rule: one worker is kept free for evaluation when evals have their own slot
        (``eval_slot``: ``commander.eval_task_space`` > 0), at least one collector task may run
        (it waits in the queue while no worker is up, and an eval waits at the queue's front
        behind at most the running tasks), and ``cap`` (``commander.collector_task_space``),
        when set, caps the result. Running tasks keep their slots when the space shrinks.
        """
        space = max(1, int(workers) - (1 if eval_slot else 0))
        self.collector_task_space.resize(min(space, int(cap)) if cap else space)

    def clear_running(self) -> None:
        """No task holds space (a resume into a fresh Redis: no task of the old run is running)."""
        for space in (self.collector_task_space, self.learner_task_space):
            space.cur = space.min_val
        self.eval_in_flight, self.eval_own_slot = None, False
