"""The league commander: self-play for two-player games (``create_config.commander.type="league"``).

The solo commander's tasks, spaces, evals and stop rule (coordinator/commander.py), with a
league (coordinator/league.py) on top, as DI-engine's OneVsOneCommander plays one::

    learner report, train_iter past the next multiple of commander.league.snapshot_every
        -> snapshot main@{train_iter}: the main policy's blob copied (Redis COPY, in the
           transaction that persists the commander's state) to rqrl:{exp}:league:snapshot:{id}
    training collector task -> opponent: main (self-play) or a snapshot by PFSP
    its finish (wins, draws, losses of its games) -> payoff table, Elo, TensorBoard
        league/win_rate/{opponent}, league/elo/{player}, league/seat_advantage (Elo points)
    evals -> the env's own opponent (common/games.py: the heuristic); stop_value on its win rate

The league is part of :meth:`state_dict`, so a restarted coordinator adopts it from Redis and a
task's result, persisted with the ack of its event, counts once. ``rqrl:{exp}:league:elo`` and
``rqrl:{exp}:league:payoff`` (hashes) mirror it for ``redis-cli``; summary.json and ``rqrl
status`` show it (``league``). ``rqrl train --resume`` restores it from the run folder into a
fresh Redis, where the snapshots' blobs are gone: they keep their Elo and payoff rows and leave
the opponent pool, and new snapshots follow.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np
from easydict import EasyDict

from common import games, keys
from common.registry import COMMANDER_REGISTRY
from coordinator.commander import Player, SoloCommander
from coordinator.league import MAIN, League, LeagueError, LeagueSettings

# Failed tasks in a row against one snapshot (no success between) that retire it: its blob is
# missing or unreadable (each failure's error names it) or it breaks the envs; never main.
RETIRE_AFTER = 2


@COMMANDER_REGISTRY.register("league")
class LeagueCommander(SoloCommander):
    """Self-play with frozen snapshots and PFSP (module docstring); arguments as :class:`SoloCommander`.

    Raises:
        LeagueError: the env is not a two-player game of common/games.py, its envs are not
            in-process (``env.manager.type`` must be "sync": the opponent acts inside the env),
            a bad ``commander.league`` key, or an ``opponent_lookahead`` the game lacks (each
            named).
    """

    @classmethod
    def check_config(cls, cfg: EasyDict) -> None:
        """Raises: LeagueError, as the class docstring says."""
        env_id = cfg.env.env_id
        if not games.is_two_player(env_id):
            raise LeagueError(f"config key 'env.env_id' is {env_id!r}, a single-player env: the league commander "
                              f"plays two-player games ({', '.join(games.GAMES)}); use commander type 'solo'")
        if cfg.env.manager.type != "sync":
            raise LeagueError("config key 'env.manager.type' must be 'sync' under the league commander: the opponent's "
                              f"policy acts inside the envs, which 'async' puts in subprocesses (got {cfg.env.manager.type!r})")
        settings = LeagueSettings.of(cfg.commander.get("league"))
        try:
            games.check_lookahead(games.game_of(env_id), settings.opponent_lookahead)
        except games.GameError as e:
            raise LeagueError(f"config key 'commander.league.opponent_lookahead' is {settings.opponent_lookahead!r}, "
                              f"but {e}") from None

    def __init__(self, cfg: EasyDict, **kwargs: Any) -> None:
        self.check_config(cfg)
        self.league = League(LeagueSettings.of(cfg.commander.get("league")))
        super().__init__(cfg, **kwargs)
        self._opponents: dict[str, str] = {}  # running training task -> its opponent
        self._copies: list[tuple[str, str]] = []  # (snapshot id, policy id) to copy at the next persist
        self._deletes: list[str] = []  # snapshots out of the pool: their blobs go at the next persist
        self._failures: dict[str, int] = {}  # snapshot -> failed tasks against it in a row
        self._mirror_due = True  # the payoff / Elo hashes differ from the league

    # ------------------------------------------------------------------ tasks
    def get_collector_task(self) -> Optional[dict]:
        """The solo commander's task; a training one names its opponent (seeded by the task's seed)."""
        task = super().get_collector_task()
        if task is None or task["eval_flag"]:
            return task
        task["opponent"] = self.league.pick_opponent(np.random.default_rng([int(task["seed"]), 1]))
        self._opponents[task["task_id"]] = task["opponent"]
        return task

    def finish_collector_task(self, task_id: str, finished_task: dict) -> bool:
        """The solo commander's, then the task's games into the payoff table and Elo."""
        opponent = self._opponents.pop(task_id, None)
        converged = super().finish_collector_task(task_id, finished_task)
        if opponent is not None:
            self._failures.pop(opponent, None)
            counts = [int(finished_task.get(k, 0)) for k in ("wins", "draws", "losses")]
            try:
                self.league.record(opponent, *counts)
            except LeagueError as e:  # a bad report costs its games, never the run
                if self._logger is not None:
                    self._logger.error("collector task %s: %s", task_id, e)
                return converged
            self._mirror_due = True
            self._log_league(opponent)
        return converged

    def notify_fail_collector_task(self, task: dict) -> None:
        """The solo commander's; a snapshot that :data:`RETIRE_AFTER` tasks in a row failed against
        leaves the pool (its blob is deleted)."""
        opponent = self._opponents.pop(task.get("task_id", ""), None)
        super().notify_fail_collector_task(task)
        if opponent is None or opponent == MAIN or not self.league.players[opponent].active:
            return
        failed = self._failures[opponent] = self._failures.get(opponent, 0) + 1
        if failed >= RETIRE_AFTER:
            self._drop([opponent])
            if self._logger is not None:
                self._logger.error("league: snapshot %s retired: %d tasks against it failed in a row (their errors "
                                   "say why)", opponent, failed)

    def _drop(self, snapshots: list[str]) -> None:
        """Retire ``snapshots`` and delete their blobs at the next persist."""
        self.league.retire(snapshots)
        self._deletes.extend(snapshots)
        self._mirror_due = True

    def update_learner_info(self, task_id: str, info: dict) -> None:
        """The solo commander's; a snapshot of main when one is due (module docstring)."""
        super().update_learner_info(task_id, info)
        policy_id = self._state.current_policy_id
        snapshot = self.league.snapshot_due(self.train_iter)
        if snapshot is not None and policy_id and snapshot not in self.league.players:
            before = self.league.pool()
            self.league.add_snapshot(snapshot, self.train_iter)
            self._copies.append((snapshot, policy_id))
            # Beyond commander.league.max_snapshots the oldest leaves the pool for good: its blob goes.
            self._drop(sorted(set(before) - set(self.league.pool())))
            self._mirror_due = True
            if self._logger is not None:
                self._logger.info("league: snapshot %s of policy %s (Elo %.0f)", snapshot, policy_id,
                                  self.league.players[snapshot].elo)

    def _log_league(self, opponent: str) -> None:
        if self._tb_logger is None:
            return
        rate = self.league.win_rate(opponent)
        if rate is not None:
            self._tb_logger.add_scalar(f"league/win_rate/{opponent}", rate, self.train_iter)
        for player in (MAIN, opponent):
            self._tb_logger.add_scalar(f"league/elo/{player}", self.league.players[player].elo, self.train_iter)
        self._tb_logger.add_scalar("league/seat_advantage", self.league.seat_advantage, self.train_iter)

    # ------------------------------------------------------------------ persistence
    def redis_writes(self, pipe: Any) -> None:
        """Snapshot copies and deletions decided since the last persist, and the payoff / Elo hashes
        when changed."""
        for snapshot, policy_id in self._copies:
            pipe.copy(keys.policy(self._ns, policy_id), keys.league_snapshot(self._ns, snapshot), replace=True)
        if self._deletes:
            pipe.delete(*(keys.league_snapshot(self._ns, s) for s in self._deletes))
        self._copies.clear()
        self._deletes.clear()
        if not self._mirror_due:
            return
        table = self.league.table()
        elo, payoff = keys.league_elo(self._ns), keys.league_payoff(self._ns)
        pipe.delete(elo, payoff)
        pipe.hset(elo, mapping={p: str(v["elo"]) for p, v in table["players"].items()})
        if table["payoff"]:
            pipe.hset(payoff, mapping={o: json.dumps(row) for o, row in table["payoff"].items()})
        self._mirror_due = False

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "league": self.league.state_dict(), "league_tasks": dict(self._opponents),
                "league_failures": dict(self._failures)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        league, running = state.pop("league", None), state.pop("league_tasks", {})
        self._failures = dict(state.pop("league_failures", {}))
        super().load_state_dict(state)
        if league is not None:
            self.league.load_state_dict(league)
        self._opponents = dict(running)
        self._mirror_due = True

    def restore(self, state: dict[str, Any], clock_shift_s: float, train_iter: int, consumed_env_steps: int) -> None:
        """The solo commander's; no task runs, and the snapshots' blobs did not come along: they
        leave the opponent pool (module docstring)."""
        super().restore(state, clock_shift_s, train_iter, consumed_env_steps)
        self._opponents.clear()
        self.league.retire(self.league.snapshots)

    # ------------------------------------------------------------------ inspection
    def players(self, state: Optional[dict[str, Any]] = None) -> list[Player]:
        """Main (the solo commander's one player) first, then the snapshots (role "snapshot",
        no learner: their weights are ``rqrl:{exp}:league:snapshot:{player_id}``)."""
        main = super().players(state)
        league = self.league
        if state is not None and "league" in state:
            league = League(self.league.settings)
            league.load_state_dict(state["league"])
        return main + [Player(s, "", "", "", role="snapshot") for s in league.snapshots]

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "league": self.league.table(self.train_iter)}
