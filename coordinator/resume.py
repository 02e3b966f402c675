"""The run folder's resume point: ``ckpt/latest.pth`` and ``resume.json``, and a restore from them.

Whenever the main player's checkpoint (``latest`` for the solo commander) has a new version,
:meth:`ResumePoint.save` copies it to the run folder with ``resume.json`` (commander state, run
id, seed, wall seconds, env steps consumed); ``--resume`` restores them into a fresh Redis
(:meth:`ResumePoint.restore`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import redis

from common import blobstore, keys
from common.data_shards import DataShards, run_stores
from common.step_data import StepDataStore
from coordinator.commander import BaseCommander, Player
from coordinator.errors import CoordinatorError
from coordinator.eval_log import read_lines


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` through a temporary file and a rename: a reader (or a crash) never finds half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def main_player(players: list[Player]) -> Player:
    """The player of role "main" among a commander's ``players``: the run folder holds its resume point.

    Raises:
        CoordinatorError: none has that role.
    """
    for player in players:
        if player.role == "main":
            return player
    raise CoordinatorError(f"the commander names no main player (players: {players!r}): nothing to resume from")


class ResumePoint:
    """The resume point of run ``exp`` in its folder ``out``.

    Args:
        conn: Redis client.
        exp: the run's namespace.
        out: the run folder.
        seed: the run's seed (recorded, so a resume can be checked against its config).
        commander: whose state is saved and restored.
    """

    def __init__(self, conn: redis.Redis, exp: str, out: Path, seed: int, commander: BaseCommander,
                 data: Optional[DataShards] = None) -> None:
        self.conn, self.exp, self.out, self.seed, self.commander = conn, exp, out, seed, commander
        self.data = data  # the run's data shards (None: step data on conn)
        self.shard_consumed: dict[int, int] = {}  # per data shard, the consumed env steps last read
        self.ckpt_on_disk = -1  # version (train_iter) of the checkpoint copied to the run folder

    def save(self, run_id: str, t0: float, state: Optional[dict[str, Any]] = None) -> None:
        """Copy the main player's checkpoint (``rqrl:{exp}:ckpt:{ckpt_name}``) to ``ckpt/latest.pth``
        in the run folder when it is newer than the copy there, and write ``resume.json`` beside
        it: the commander state, the run id, seed, start time ``t0`` (unix seconds) and wall
        seconds, the checkpoint's train_iter and the env steps the player's learner had consumed.
        One HGET when nothing changed. With ``state`` (the commander's state at the stop)
        ``resume.json`` is rewritten even when the checkpoint is the same."""
        player = main_player(self.commander.players(state))
        key = keys.ckpt(self.exp, player.ckpt_name)
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
        buffer_id = player.buffer_id
        consumed = self._consumed(buffer_id) if buffer_id else 0
        point = {"run_id": run_id, "seed": int(self.seed), "t0": t0,
                 "wall_seconds": round(time.time() - t0, 3), "ckpt_train_iter": self.ckpt_on_disk,
                 "consumed_env_steps": consumed, "commander": state}
        write_atomic(self.out / "resume.json", json.dumps(point).encode())

    def _consumed(self, buffer_id: str) -> int:
        """Env steps consumed from the buffer, summed over its stores; on data shards read without
        retries, and a dead shard's last figure read stands in for it (the run is stopping on it)."""
        if not self.data:
            return StepDataStore(self.conn, self.exp, buffer_id).consumed_env_steps()
        for i, store in enumerate(self.data.stores(self.conn, self.exp, buffer_id, probe=True)):
            try:
                self.shard_consumed[i] = store.consumed_env_steps()
            except redis.RedisError:
                pass
        return sum(self.shard_consumed.values())

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
        for old in (self.out / "evals.jsonl", self.out / "episodes.jsonl", self.out / "resume.json",
                    self.out / "ckpt" / "latest.pth"):
            old.unlink(missing_ok=True)

    def restore(self, t0: float) -> tuple[str, float, int]:
        """Continue the run from its folder (``--resume`` when Redis no longer holds it unfinished);
        ``t0`` is this start's clock (unix seconds). Returns the run id, the run's start moved by
        the pause (so its wall seconds count on), and the number of evals restored.

        Restored: the commander state of the last checkpoint copy (env steps, eval history, best
        eval, seed counter, so the exploration schedule goes on where it was), the run id, the
        wall clock (``t0`` moved by the pause), the learner checkpoint (weights, optimizer,
        train_iter) as the main player's ``rqrl:{exp}:ckpt:{ckpt_name}`` with the learner task
        set to resume from it, the env-step counters, and ``evals.jsonl`` into ``rqrl:{exp}:evals``. Not restored: the
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
        player = main_player(self.commander.players())
        blobstore.put_versioned(self.conn, keys.ckpt(self.exp, player.ckpt_name), ckpt.read_bytes(), version,
                                meta={"train_iter": version, "ts": round(time.time(), 3), "format": "torch"})
        pipe = self.conn.pipeline(transaction=True)
        pipe.set(keys.envstep(self.exp), consumed)
        if player.buffer_id:
            # On the first shard: the learner sums every shard's, and the others start empty.
            run_stores(self.conn, self.data, self.exp, player.buffer_id)[0].set_consumed_env_steps(consumed)
        lines = read_lines(self.out)
        if lines:
            pipe.rpush(keys.evals(self.exp), *lines)
        pipe.execute()
        return point["run_id"], t0, len(lines)
