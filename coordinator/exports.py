"""The run's exported weights: best.pt as the run goes, final.pt at its end, and the eval bundles
in Redis they are copied from (coordinator/bundles.py: pruned to what can still be exported)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import redis
from easydict import EasyDict

from common import blobstore, keys, serialization
from common.finite import NonFiniteError, check_arrays
from coordinator.bundles import EvalBundles
from coordinator.commander_view import AtStop, CommanderView
from coordinator.eval_judge import reached_stop_value
from coordinator.resume import write_atomic


@dataclass(frozen=True)
class FinalPt:
    """What :meth:`Exports.export_final` wrote: ``path`` (None: no final.pt) and the policy
    version of its weights (None when no final.pt, or when its eval named none)."""

    path: Optional[Path] = None
    policy_version: Optional[int] = None


class Exports:
    """best.pt, final.pt and the eval bundles of run ``ns``.

    Args:
        conn: Redis client.
        cfg: the compiled config (env.stop_value; the spaces and algorithm of a final.pt built
            from published weights).
        ns: the run's namespace.
        out: the run folder.
        view: what is read of the commander.
        log: the coordinator's logger.
    """

    def __init__(self, conn: redis.Redis, cfg: EasyDict, ns: str, out: Path, view: CommanderView,
                 log: logging.Logger) -> None:
        self.conn, self.cfg, self.ns, self.out, self.view, self.log = conn, cfg, ns, out, view, log
        self.best_written: Optional[str] = None  # the eval whose weights best.pt holds
        self._bundles = EvalBundles()  # eval bundles in Redis: pruned to what can still be exported

    def state_dict(self) -> dict[str, Any]:
        """The part of the coordinator's state the exports own (plain JSON values)."""
        return {"best_written": self.best_written, "eval_bundles": sorted(self._bundles.stored)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt :meth:`state_dict` of an earlier coordinator of the run (keys absent: none)."""
        self.best_written = state.get("best_written")
        self._bundles = EvalBundles(state.get("eval_bundles", ()))

    def eval_finished(self, task_id: str) -> None:
        """Eval task ``task_id`` finished: its bundle is in Redis (unless its worker could not store it)."""
        self._bundles.add(task_id)

    def export_best(self) -> None:
        """Keep ``best.pt`` = the best-evaluated weights so far (copied from what that eval played)."""
        best = self.view.best_eval
        if not best or best.get("task_id") == self.best_written:
            return
        got = blobstore.get_versioned(self.conn, keys.evaluated_policy(self.ns, best["task_id"]))
        if got is None:
            return  # the eval task's blob is not there (an older worker version): nothing to copy
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out / "best.pt", got[1])
        self.best_written = best["task_id"]
        self.log.info("best.pt: policy version %s, eval reward_mean %.2f", best["policy_version"], best["reward_mean"])

    def prune_bundles(self) -> None:
        """Delete the eval bundles in Redis that nothing can export or replay any more."""
        self._bundles.prune(self.conn, self.ns, self.view.bundles_in_use)

    def export_final(self, at_stop: AtStop, redis_lost: bool) -> FinalPt:
        """Write ``final.pt`` (common/policy/export.py: the acting weights, algorithm, config and spaces).

        A converged run (``at_stop.final_eval_task``) exports exactly the weights its passing
        (and confirming) eval played. Otherwise the main player's learner's ``final_model``
        checkpoint (:func:`common.keys.final_ckpt_name`) is
        copied byte for byte (no torch import here), or, if the learner never finished, the last
        published policy version of ``at_stop.policy_id``. Weights of policy version 0 (the
        learner never trained: a run that failed at its start) are untrained and never exported.
        When Redis lost the run (``redis_lost``), final.pt can only be best.pt (:meth:`_final_from_best`).

        Raises:
            redis.RedisError, OSError: Redis or the run folder failed while the bundle was copied.
        """
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / "final.pt"
        if redis_lost:
            return self._final_from_best(path)
        task = at_stop.final_eval_task
        got = blobstore.get_versioned(self.conn, keys.evaluated_policy(self.ns, task)) if task else None
        if got is None:
            got = blobstore.get_versioned(self.conn, keys.ckpt(self.ns, keys.final_ckpt_name(at_stop.ckpt_name, model=True)))
            got = got if got is not None and int(got[0]["version"]) > 0 else None
        if got is not None:
            path.write_bytes(got[1])
            return FinalPt(path, int(got[0]["version"]))
        return self._final_from_policy(path, at_stop.policy_id)

    def _final_from_policy(self, path: Path, policy_id: str) -> FinalPt:
        """``final.pt`` built from the last published policy version (the learner left no final checkpoint)."""
        got = blobstore.get_versioned(self.conn, keys.policy(self.ns, policy_id)) if policy_id else None
        if got is None or int(got[0]["version"]) == 0:
            self.log.warning("no final.pt: %s", "the learner never trained (policy version 0): its weights are "
                             "untrained" if got is not None else "no evaluated policy, final checkpoint or published "
                             "policy to export")
            return FinalPt()
        from common import spaces
        from common.policy import export

        weights = serialization.loads(got[1], what=keys.policy(self.ns, policy_id))
        try:
            check_arrays(weights, "final.pt")
        except NonFiniteError as e:
            self.log.error("not exporting: %s", e)
            return FinalPt()
        bundle = export.from_weights(self.cfg, spaces.probe(self.cfg), weights, int(got[0]["version"]))
        self.log.warning("the learner left no final checkpoint; final.pt holds the last published policy version")
        path.write_bytes(export.to_bytes(bundle))
        return FinalPt(path, int(got[0]["version"]))

    def _final_from_best(self, path: Path) -> FinalPt:
        """``final.pt`` without Redis: a copy of ``best.pt`` when the best eval reached stop_value
        (best.pt holds exactly the weights that eval played), else none."""
        best = self.view.best_eval
        stop_value, reward = self.cfg.env.stop_value, best.get("reward_mean")
        best_pt = self.out / "best.pt"
        if not reached_stop_value(reward, stop_value) or not best_pt.is_file() or best.get("task_id") != self.best_written:
            self.log.warning("no final.pt: Redis no longer holds the run's weights and no eval reached stop_value "
                             "(ckpt/latest.pth and resume.json remain for --resume)")
            return FinalPt()
        write_atomic(path, best_pt.read_bytes())
        self.log.warning("final.pt is best.pt (eval reward_mean %.2f >= stop_value %s, not confirmed): Redis no "
                         "longer holds the run", reward, stop_value)
        return FinalPt(path, best.get("policy_version"))
