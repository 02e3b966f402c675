"""The run folder's resume point: ``ckpt/latest.pth`` and ``resume.json``, and a restore from them.

Whenever the learner's ``latest`` checkpoint has a new version, :meth:`ResumePoint.save` copies
it to the run folder with ``resume.json`` (commander state, run id, seed, wall seconds, env
steps consumed); ``--resume`` restores them into a fresh Redis (:meth:`ResumePoint.restore`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import redis

from common import blobstore, keys
from coordinator.commander import BaseCommander
from coordinator.errors import CoordinatorError
from coordinator.eval_log import read_lines


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file and a rename: a reader (or a crash) never finds half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


class ResumePoint:
    """The resume point of run ``exp`` in its folder ``out``.

    Args:
        conn: Redis client.
        exp: the run's namespace.
        out: the run folder.
        seed: the run's seed (recorded, so a resume can be checked against its config).
        commander: whose state is saved and restored.
    """

    def __init__(self, conn: redis.Redis, exp: str, out: Path, seed: int, commander: BaseCommander) -> None:
        self.conn, self.exp, self.out, self.seed, self.commander = conn, exp, out, seed, commander
        self.ckpt_on_disk = -1  # version (train_iter) of the checkpoint copied to the run folder

    def save(self, run_id: str, t0: float, state: Optional[dict[str, Any]] = None) -> None:
        """Copy the learner's ``latest`` checkpoint to ``ckpt/latest.pth`` in the run folder when it is
        newer than the copy there, and write ``resume.json`` beside it: the commander state, the run
        id, seed, start time ``t0`` (unix seconds) and wall seconds, the checkpoint's train_iter and
        the env steps the learner had consumed. One HGET when nothing changed. With ``state`` (the
        commander's state at the stop) ``resume.json`` is rewritten even when the checkpoint is the same."""
        key = keys.ckpt(self.exp, "latest")
        version = self.conn.hget(key, "version")
        if version is None or (int(version) == self.ckpt_on_disk and state is None):
            return
        (self.out / "ckpt").mkdir(parents=True, exist_ok=True)
        if int(version) != self.ckpt_on_disk:
            got = blobstore.get_versioned(self.conn, key)
            if got is None:
                return
            write_atomic(self.out / "ckpt" / "latest.pth", got[1])
            self.ckpt_on_disk = int(got[0]["version"])
        state = state if state is not None else self.commander.state_dict()
        buffer_id = state.get("current_buffer_id")
        consumed = int(self.conn.hget(keys.buffer_stats(self.exp, buffer_id), "env_steps") or 0) if buffer_id else 0
        point = {"run_id": run_id, "seed": int(self.seed), "t0": t0,
                 "wall_seconds": round(time.time() - t0, 3), "ckpt_train_iter": self.ckpt_on_disk,
                 "consumed_env_steps": consumed, "commander": state}
        write_atomic(self.out / "resume.json", json.dumps(point).encode())

    def files(self) -> tuple[Path, Path]:
        """``resume.json`` and ``ckpt/latest.pth`` of the run folder.

        Raises:
            CoordinatorError: one of them is missing.
        """
        path, ckpt = self.out / "resume.json", self.out / "ckpt" / "latest.pth"
        if not path.is_file() or not ckpt.is_file():
            raise CoordinatorError(f"cannot resume {self.exp}: {path} or {ckpt} is missing (the run never saved a "
                                   "learner checkpoint: policy.learn.learner.hook.save_ckpt_after_iter)")
        return path, ckpt

    def forget(self) -> None:
        """Delete what an earlier run of this name left for a resume (a fresh start)."""
        for old in (self.out / "evals.jsonl", self.out / "resume.json", self.out / "ckpt" / "latest.pth"):
            old.unlink(missing_ok=True)

    def restore(self, t0: float) -> tuple[str, float, int]:
        """Continue the run from its folder (``--resume`` when Redis no longer holds it unfinished);
        ``t0`` is this start's clock (unix seconds). Returns the run id, the run's start moved by
        the pause (so its wall seconds count on), and the number of evals restored.

        Restored: the commander state of the last checkpoint copy (env steps, eval history, best
        eval, seed counter, so the exploration schedule goes on where it was), the run id, the
        wall clock (``t0`` moved by the pause), the learner checkpoint (weights, optimizer,
        train_iter) as ``rqrl:{exp}:ckpt:latest`` with the learner task set to resume from it,
        the env-step counters, and ``evals.jsonl`` into ``rqrl:{exp}:evals``. Not restored: the
        replay buffer (it lived in the learner's memory; collectors refill it to
        ``replay_start_size`` first), step data and tasks in flight, and training after the last
        checkpoint (at most ``save_ckpt_after_iter`` train iterations).

        Raises:
            CoordinatorError: the folder holds no ``resume.json`` / ``ckpt/latest.pth``.
        """
        path, ckpt = self.files()
        point = json.loads(path.read_text())
        state, version, consumed = point["commander"], int(point["ckpt_train_iter"]), int(point["consumed_env_steps"])
        t0 = t0 - float(point["wall_seconds"])  # the pause is not counted
        # Eval times move with the clock, so eval_interval counts run time.
        self.commander.restore(state, t0 - float(point["t0"]), version, consumed)
        self.ckpt_on_disk = version
        blobstore.put_versioned(self.conn, keys.ckpt(self.exp, "latest"), ckpt.read_bytes(), version,
                                meta={"train_iter": version, "ts": round(time.time(), 3), "format": "torch"})
        pipe = self.conn.pipeline(transaction=True)
        pipe.set(keys.envstep(self.exp), consumed)
        buffer_id = self.commander.summary()["buffer_id"]
        if buffer_id:
            pipe.hset(keys.buffer_stats(self.exp, buffer_id), "env_steps", consumed)
        lines = read_lines(self.out)
        if lines:
            pipe.rpush(keys.evals(self.exp), *lines)
        pipe.execute()
        return point["run_id"], t0, len(lines)
