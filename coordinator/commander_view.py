"""What the run's exports and records read of the commander, in one place.

Only the commander contract (coordinator/commander.py's BaseCommander) is read: the best eval,
the eval bundles still in use, the converged eval, the running figures and the ids of the main
player's policy and buffer (``players()``, the main player first).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.commander import BaseCommander


@dataclass(frozen=True)
class AtStop:
    """The commander's figures when the run stops, kept before the learner's finish resets its
    run state (as the seed's commander does).

    Attributes:
        envstep: env steps collected so far; train_iter: the learner's train iterations so far.
        final_eval_task: the eval task whose weights passed (and were confirmed); "" when the run
            did not converge.
        best: the best eval (``task_id``, ``reward_mean``, ``policy_version``; empty before one).
        last: the newest finished eval (empty before one; no ``reward_mean`` when it finished no episode).
        policy_id, buffer_id: the learner's policy and buffer ids ("" when none).
        ckpt_name: the main player's resumable checkpoint (its final checkpoints are named after it).
    """

    envstep: int
    train_iter: int
    final_eval_task: str
    best: dict[str, Any]
    last: dict[str, Any]
    policy_id: str
    buffer_id: str
    ckpt_name: str = "latest"


class CommanderView:
    """Reads ``commander`` for the exports and the records; never writes it."""

    def __init__(self, commander: BaseCommander) -> None:
        self._commander = commander

    @property
    def best_eval(self) -> dict[str, Any]:
        """The best eval so far (empty before one): what best.pt holds the weights of."""
        return self._commander.best_eval

    @property
    def bundles_in_use(self) -> set[str]:
        """Eval task ids whose bundles in Redis can still be exported or replayed."""
        return self._commander.eval_bundles_in_use

    def at_stop(self) -> AtStop:
        """The figures of the moment (see :class:`AtStop`)."""
        cm = self._commander
        main = cm.players()[0]
        return AtStop(envstep=cm.total_envstep, train_iter=cm.train_iter, final_eval_task=cm.final_eval_task or "",
                      best=cm.best_eval, last=cm.last_eval or {}, policy_id=main.policy_id, buffer_id=main.buffer_id,
                      ckpt_name=main.ckpt_name)
