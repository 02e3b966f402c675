"""The league: its players, the payoff table, Elo ratings and the choice of opponents.

One learning player, ``main``, plays against itself (its current weights) and against frozen
snapshots of itself, taken every ``snapshot_every`` train iterations (AlphaStar's league, Vinyals
et al. 2019, without its exploiters; DI-engine's OneVsOneCommander plays the same game with a
list of players). Each training collector task plays one opponent::

    opponent = "main"                              with probability self_play_share (self-play)
             = a snapshot s, with probability      w(s) / sum w    otherwise (PFSP)
    w(s)     = (1 - p(s)) ** 2   "hard"            p(s) = (wins + draws / 2 + 1) / (games + 2):
               p(s) * (1 - p(s))  "variance"       main's score against s, smoothed towards 1/2
               1                  "uniform"        so an opponent never played is an even match

so main mostly meets the snapshots it still loses to (prioritised fictitious self-play). The
payoff table counts main's wins, draws and losses against each opponent; a task's games move
both players' Elo (400-point logistic scale, ``elo_k`` per game, one game at a time at the
task's mean score). A snapshot starts at main's Elo of the moment.

The opponent's seat is not main's: it may look a move ahead (``opponent_lookahead``) or play as
evals do (``opponent_acts``), so an even match between equal policies is not a score of 1/2.
Self-play games measure what the seat is worth, as sports Elo systems rate a home advantage:
they rate nobody, but move ``self_play_score``, main's score against itself in the opponent's
seat (the mean of all self-play games up to :data:`SEAT_HORIZON` of them, then a moving
average over about the last :data:`SEAT_HORIZON`, so the first snapshots are rated against
the early games' own measure rather than a prior of 1/2), and a rated game
expects main to score against an opponent rated ``elo`` as against one rated ``elo + A``::

    A = 400 * log10((1 - s) / s),   s = self_play_score clipped to [0.02, 0.98]

Without it every rated game the seat wins is read as the snapshot being better than main, each
new snapshot enters that much below the ones before it, and ratings fall while play improves.

The league is state of the commander (coordinator/league_commander.py): it is persisted with the
commander's state, so a restarted coordinator resumes it and a task's result, acked in the same
transaction, counts once.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

from common.games import LOOKAHEADS

MAIN = "main"
WEIGHTINGS = ("hard", "variance", "uniform")
OPPONENT_ACTS = ("sample", "eval")  # an opponent's moves: as its collectors act, or as its evals
SEAT_HORIZON = 1000  # self-play games: the span of self_play_score's moving average
SEAT_CLIP = 0.02  # self_play_score's bound away from 0 and 1: the seat advantage stays within ±676 Elo


class LeagueError(ValueError):
    """A bad ``commander.league`` setting, or an opponent that is not a player (named)."""


@dataclass
class LeaguePlayer:
    """A player of the league.

    Attributes:
        player_id: ``main`` or ``main@{train_iter}`` (a snapshot).
        train_iter: the learner's train iteration when the snapshot was taken (main: 0).
        elo: its rating (400-point logistic scale).
        games: games rated (self-play not counted).
        active: whether main may meet it (False: retired, its weights are gone).
    """

    player_id: str
    train_iter: int = 0
    elo: float = 1000.0
    games: int = 0
    active: bool = True


@dataclass
class LeagueSettings:
    """``commander.league``: ``snapshot_every`` (train iterations, > 0), ``self_play_share`` in
    [0, 1], ``weighting`` (one of :data:`WEIGHTINGS`), ``max_snapshots`` (the oldest beyond it
    leave the opponent pool; 0 = all stay), ``elo_k`` (> 0), ``initial_elo``, ``opponent_acts``
    (one of :data:`OPPONENT_ACTS`: how the collector's opponent seat plays, workers/opponents.py),
    ``opponent_lookahead`` (one of ``common.games.LOOKAHEADS``: a move the opponent seat plays
    before its policy acts, when a one-move lookahead finds one; workers/opponents.py)."""

    snapshot_every: int = 20
    self_play_share: float = 0.2
    weighting: str = "hard"
    max_snapshots: int = 0
    elo_k: float = 16.0
    initial_elo: float = 1000.0
    opponent_acts: str = "sample"
    opponent_lookahead: str = "none"

    @classmethod
    def of(cls, section: Any) -> "LeagueSettings":
        """Raises: LeagueError naming the key ``commander.league.<key>``."""
        section = dict(section or {})
        unknown = set(section) - set(cls.__dataclass_fields__)
        if unknown:
            raise LeagueError(f"config key 'commander.league.{sorted(unknown)[0]}' is unknown; "
                              f"known: {sorted(cls.__dataclass_fields__)}")
        s = cls(**section)
        number = lambda v, kind: isinstance(v, kind) and not isinstance(v, bool)  # noqa: E731
        checks = (("snapshot_every", number(s.snapshot_every, int) and s.snapshot_every > 0,
                   "must be an int > 0 (train iterations)"),
                  ("self_play_share", number(s.self_play_share, (int, float)) and 0 <= s.self_play_share <= 1,
                   "must be a number in [0, 1]"),
                  ("weighting", s.weighting in WEIGHTINGS, f"must be one of {WEIGHTINGS}"),
                  ("max_snapshots", number(s.max_snapshots, int) and s.max_snapshots >= 0,
                   "must be an int >= 0 (0 = keep all)"),
                  ("elo_k", number(s.elo_k, (int, float)) and s.elo_k > 0, "must be a number > 0"),
                  ("initial_elo", number(s.initial_elo, (int, float)), "must be a number"),
                  ("opponent_acts", s.opponent_acts in OPPONENT_ACTS, f"must be one of {OPPONENT_ACTS}"),
                  ("opponent_lookahead", s.opponent_lookahead in LOOKAHEADS, f"must be one of {LOOKAHEADS}"))
        for key, ok, why in checks:
            if not ok:
                raise LeagueError(f"config key 'commander.league.{key}' = {getattr(s, key)!r} {why}")
        return s


def expected_score(elo: float, other: float) -> float:
    """Elo's expected score of a player rated ``elo`` against one rated ``other``."""
    return 1.0 / (1.0 + 10.0 ** ((other - elo) / 400.0))


@dataclass
class League:
    """Players, payoff table and Elo (module docstring); ``state_dict`` / ``load_state_dict`` round-trip."""

    settings: LeagueSettings
    players: dict[str, LeaguePlayer] = field(default_factory=dict)
    # opponent -> [wins, draws, losses] of main against it
    payoff: dict[str, list[int]] = field(default_factory=dict)
    next_snapshot: int = 0  # the train iteration at or after which the next snapshot is due
    # main's score in [0, 1] (win 1, draw 1/2) against itself in the opponent's seat, over
    # self_play_games games so far (module docstring)
    self_play_score: float = 0.5
    self_play_games: int = 0

    def __post_init__(self) -> None:
        self.players.setdefault(MAIN, LeaguePlayer(MAIN, elo=float(self.settings.initial_elo)))
        self.next_snapshot = self.next_snapshot or int(self.settings.snapshot_every)

    # -- snapshots ------------------------------------------------------------------------
    def snapshot_due(self, train_iter: int) -> Optional[str]:
        """The id of the snapshot to take now, at ``train_iter``, or None when none is due; taking
        it (:meth:`add_snapshot`) is the caller's, once the weights are copied."""
        return f"{MAIN}@{train_iter}" if train_iter >= self.next_snapshot else None

    def add_snapshot(self, player_id: str, train_iter: int) -> None:
        """Add a frozen copy of main taken at ``train_iter``, rated as main is now."""
        self.players[player_id] = LeaguePlayer(player_id, train_iter, self.players[MAIN].elo)
        every = int(self.settings.snapshot_every)
        self.next_snapshot = (train_iter // every + 1) * every

    @property
    def snapshots(self) -> list[str]:
        """Snapshot ids, oldest first."""
        return sorted((p for p in self.players if p != MAIN), key=lambda p: self.players[p].train_iter)

    def pool(self) -> list[str]:
        """The snapshots main may meet: the newest ``max_snapshots`` active ones (all when 0)."""
        snaps = [s for s in self.snapshots if self.players[s].active]
        keep = int(self.settings.max_snapshots)
        return snaps[-keep:] if keep else snaps

    def retire(self, player_ids: list[str]) -> None:
        """Take snapshots out of the pool for good; their ratings and payoff rows stay."""
        for p in player_ids:
            self.players[p].active = False

    # -- opponents ------------------------------------------------------------------------
    def score(self, opponent: str) -> float:
        """Main's smoothed score against ``opponent`` (module docstring), in (0, 1)."""
        w, d, lo = self.payoff.get(opponent, [0, 0, 0])
        return (w + d / 2 + 1) / (w + d + lo + 2)

    def weights(self, pool: list[str]) -> np.ndarray:
        """PFSP weights of ``pool`` (float64, summing to 1)."""
        p = np.array([self.score(s) for s in pool])
        raw = {"hard": (1 - p) ** 2, "variance": p * (1 - p), "uniform": np.ones_like(p)}[self.settings.weighting]
        return raw / raw.sum()

    def pick_opponent(self, rng: np.random.Generator) -> str:
        """Main's opponent for a training task: itself or a snapshot by PFSP (module docstring)."""
        pool = self.pool()
        if not pool or rng.random() < float(self.settings.self_play_share):
            return MAIN
        return pool[int(rng.choice(len(pool), p=self.weights(pool)))]

    # -- results --------------------------------------------------------------------------
    @property
    def seat_advantage(self) -> float:
        """What the opponent's seat is worth, in Elo points (module docstring); 0 while
        ``self_play_score`` is 1/2."""
        s = min(max(self.self_play_score, SEAT_CLIP), 1.0 - SEAT_CLIP)
        return 400.0 * float(np.log10((1.0 - s) / s))

    def record(self, opponent: str, wins: int, draws: int, losses: int) -> None:
        """Count main's games against ``opponent`` and move both ratings; games against ``main``
        itself move ``self_play_score`` instead (module docstring).

        Raises:
            LeagueError: ``opponent`` is not a player, or a count is negative.
        """
        if opponent not in self.players:
            raise LeagueError(f"opponent {opponent!r} is not a player of the league (players: {sorted(self.players)})")
        if min(wins, draws, losses) < 0:
            raise LeagueError(f"negative game counts against {opponent!r}: {wins}, {draws}, {losses}")
        row = self.payoff.setdefault(opponent, [0, 0, 0])
        for i, n in enumerate((wins, draws, losses)):
            row[i] += int(n)
        games = wins + draws + losses
        if games == 0:
            return
        mean = (wins + draws / 2) / games
        if opponent == MAIN:
            self._measure_seat(games, mean)
            return
        me, them = self.players[MAIN], self.players[opponent]
        k, seat = float(self.settings.elo_k), self.seat_advantage
        for _ in range(games):
            delta = k * (mean - expected_score(me.elo, them.elo + seat))
            me.elo += delta
            them.elo -= delta
        me.games += games
        them.games += games

    def _measure_seat(self, games: int, mean: float) -> None:
        """Fold ``games`` self-play games scoring ``mean`` into ``self_play_score``: a running mean
        while fewer than SEAT_HORIZON games are in it, then per game ``s += (mean - s) / SEAT_HORIZON``."""
        averaged = min(games, max(0, SEAT_HORIZON - self.self_play_games))
        if averaged:
            n = self.self_play_games + averaged
            self.self_play_score += averaged / n * (mean - self.self_play_score)
        rest = games - averaged
        self.self_play_score += (1.0 - (1.0 - 1.0 / SEAT_HORIZON) ** rest) * (mean - self.self_play_score)
        self.self_play_games += games

    def win_rate(self, opponent: str) -> Optional[float]:
        """Main's share of games won against ``opponent``; None before a game."""
        w, d, lo = self.payoff.get(opponent, [0, 0, 0])
        return w / (w + d + lo) if w + d + lo else None

    # -- records --------------------------------------------------------------------------
    def table(self, train_iter: int = 0) -> dict[str, Any]:
        """summary.json's ``league``: players (the train iteration a snapshot was taken at, main's
        ``train_iter`` now; Elo; ``rated_games``, self-play not counted; ``active``), main's
        payoff rows (its self-play games under ``main``) and ``seat_advantage`` (Elo points)."""
        return {"seat_advantage": round(self.seat_advantage, 1),
                "players": {p.player_id: {"train_iter": train_iter if p.player_id == MAIN else p.train_iter,
                                          "elo": round(p.elo, 1), "rated_games": p.games, "active": p.active}
                            for p in self.players.values()},
                "payoff": {o: {"wins": r[0], "draws": r[1], "losses": r[2]} for o, r in sorted(self.payoff.items())}}

    def state_dict(self) -> dict[str, Any]:
        return {"players": [asdict(p) for p in self.players.values()],
                "payoff": {k: list(v) for k, v in self.payoff.items()}, "next_snapshot": self.next_snapshot,
                "self_play_score": self.self_play_score, "self_play_games": self.self_play_games}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.players = {p["player_id"]: LeaguePlayer(**p) for p in state["players"]}
        self.payoff = {k: [int(x) for x in v] for k, v in state["payoff"].items()}
        self.next_snapshot = int(state["next_snapshot"])
        if "self_play_games" in state:
            self.self_play_score, self.self_play_games = float(state["self_play_score"]), int(state["self_play_games"])
        else:  # a state saved before the seat was measured: its self-play payoff row is the measure
            w, d, lo = self.payoff.get(MAIN, [0, 0, 0])
            self.self_play_games = w + d + lo
            self.self_play_score = (w + d / 2) / self.self_play_games if self.self_play_games else 0.5


def table_snapshots(players: dict[str, Any]) -> list[str]:
    """The snapshot ids of :meth:`League.table`'s ``players`` (or its JSON's), oldest first."""
    return sorted((p for p in players if p != MAIN), key=lambda p: players[p]["train_iter"])


def status_lines(table: Any, newest: int = 3) -> list[str]:
    """``rqrl status``'s lines for a run's summary field ``league`` (:meth:`League.table`, or its
    JSON as the summary hash holds it): main's Elo, the snapshots, main's record against itself
    (self-play) and the ``newest`` snapshots; [] for a run without a league."""
    table = json.loads(table) if isinstance(table, str) else table
    if not table:
        return []
    players, payoff = table["players"], table["payoff"]
    snaps = table_snapshots(players)
    pool = sum(1 for p in snaps if players[p].get("active", True))
    seat = f", opponent's seat worth {table['seat_advantage']:+.0f} Elo" if "seat_advantage" in table else ""
    lines = [f"  league: main Elo {players[MAIN]['elo']:.0f}, {len(snaps)} snapshots ({pool} in the pool){seat}"]
    for p in [MAIN, *snaps[-newest:][::-1]]:
        row = payoff.get(p, {"wins": 0, "draws": 0, "losses": 0})
        games = row["wins"] + row["draws"] + row["losses"]
        record = f"main won {row['wins'] / games:.0%} of {games:,} games" if games else "not met yet"
        name = "itself" if p == MAIN else p
        lines.append(f"    vs {name:<14} Elo {players[p]['elo']:>6.0f}  {record}")
    return lines
