"""Two-player games as single-agent gymnasium envs: the learning player's seat, the opponent inside.

PettingZoo's AEC games (the ``league`` extra: ``pettingzoo[classic]``) are played from one seat,
drawn per episode from the env's seeded ``np_random``; the other seat is the *opponent*, who
moves inside :meth:`TwoPlayerEnv.step` (and in ``reset`` when it moves first)::

    obs, info = env.reset(seed=s)           the learning player to move
    obs, reward, terminated, truncated, info = env.step(a)
                                            a, then the opponent's replies until the learning
                                            player is to move again or the game is over

Ids registered here (:func:`register`; ``common.envs`` calls it for every ``rqrl/`` id):

    rqrl/ConnectFour-v0         pettingzoo.classic.connect_four_v3 (6x7 board, Discrete(7))
    rqrl/RockPaperScissors-v0   pettingzoo.classic.rps_v2 with max_cycles=1: a one-shot matrix
                                game whose one Nash equilibrium is uniform (1/3 each)

Observation: float32 Box(0, 1) of shape ``(F + A,)``: the game's own observation of the seat
flattened (Connect Four's (6, 7, 2) planes: the mover's pieces, the other's) or one-hot
(a Discrete observation), followed by the ``A`` legal-action flags (1 legal, 0 not; all 1 in a
game without masks). A policy with ``policy.model.action_mask`` True reads the flags there.

Reward: the learning player's game reward since its last move (+1 win, -1 loss, 0 draw or
game going on); ``info["outcome"]`` is +1 / 0 / -1 at the game's end. The wrapper
:class:`WinReward` (an eval-only wrapper: ``env.wrappers`` entry with ``eval_only=True``) makes
an eval's mean return the win rate.

Opponents (``set_opponent``, or the ``opponent`` kwarg): ``"random"`` (a uniform legal move),
``"heuristic"`` (Connect Four: win if it can, block if it must, else a random legal move; other
games: random), or a callable ``obs float32 (F + A,) -> action int`` (a league snapshot's
policy, set by the collector, workers/opponents.py).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional, Union

import gymnasium as gym
import numpy as np

# id -> (game name, PettingZoo module, keyword arguments of its ``env()``, the most moves one
# seat makes in a game: Connect Four's 42 cells shared by two; registered as the id's
# max_episode_steps, so evals know their length: it ends no game early)
GAMES: dict[str, tuple[str, str, dict[str, Any], int]] = {
    "rqrl/ConnectFour-v0": ("connect_four", "pettingzoo.classic.connect_four_v3", {}, 21),
    "rqrl/RockPaperScissors-v0": ("rps", "pettingzoo.classic.rps_v2", {"max_cycles": 1}, 1),
}
FIXED_OPPONENTS = ("random", "heuristic")
# One-move lookaheads (:func:`lookahead_move`): "none", a move that wins at once, or that one
# else a move that blocks the other side's win at once (the heuristic's two rules)
LOOKAHEADS = ("none", "win", "win_or_block")
LOOKAHEAD_GAMES = ("connect_four",)  # games with those lookaheads
ENTRY_POINT = "common.games:TwoPlayerEnv"

Opponent = Union[str, Callable[[np.ndarray], int]]


class GameError(ValueError):
    """A game that cannot be built (the ``league`` extra missing, an unknown game or opponent)."""


def register() -> None:
    """Register the ids of :data:`GAMES` with gymnasium (idempotent)."""
    for env_id, (game, _, kwargs, moves) in GAMES.items():
        if env_id not in gym.registry:
            gym.register(env_id, entry_point=ENTRY_POINT, kwargs={"game": game, **kwargs}, max_episode_steps=moves)


def game_of(env_id: str) -> str:
    """The game name of a two-player ``env_id`` of :data:`GAMES` (``connect_four``, ``rps``).

    Raises:
        GameError: ``env_id`` is not a game of this module.
    """
    if env_id not in GAMES:
        raise GameError(f"env {env_id!r} is not a two-player game of rqrl ({', '.join(GAMES)})")
    return GAMES[env_id][0]


def is_two_player(env_id: str) -> bool:
    """Whether ``env_id`` is a game of this module (what the league commander plays)."""
    register()
    return env_id in gym.registry and gym.spec(env_id).entry_point == ENTRY_POINT


def _connect_four_line(board: np.ndarray, row: int, col: int) -> bool:
    """Whether the piece at (row, col) of ``board`` (bool (6, 7)) completes four in a row."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        run = 1
        for sign in (1, -1):
            r, c = row + sign * dr, col + sign * dc
            while 0 <= r < 6 and 0 <= c < 7 and board[r, c]:
                run += 1
                r, c = r + sign * dr, c + sign * dc
        if run >= 4:
            return True
    return False


def winning_moves(obs: np.ndarray, plane: int) -> list[int]:
    """The legal Connect Four columns where a piece of ``plane`` (0: the mover's, 1: the other's)
    completes four in a row, ascending.

    Args:
        obs: float32 (84 + 7,) as :class:`TwoPlayerEnv` gives it (the mover's planes first).
    """
    planes = obs[:84].reshape(6, 7, 2) > 0.5
    filled = planes[..., 0] | planes[..., 1]
    wins = []
    for col in np.flatnonzero(obs[84:] > 0.5):
        row = int(np.flatnonzero(~filled[:, col])[-1])  # pieces fall to the lowest free row
        board = planes[..., plane].copy()
        board[row, col] = True
        if _connect_four_line(board, row, col):
            wins.append(int(col))
    return wins


def check_lookahead(game: str, lookahead: str) -> None:
    """Whether ``game`` has the one-move ``lookahead`` (:func:`lookahead_move`).

    Raises:
        GameError: an unknown ``lookahead``, or one other than "none" for a game without
            lookaheads (only :data:`LOOKAHEAD_GAMES` have them).
    """
    if lookahead not in LOOKAHEADS:
        raise GameError(f"unknown lookahead {lookahead!r}; known: {LOOKAHEADS}")
    if lookahead != "none" and game not in LOOKAHEAD_GAMES:
        raise GameError(f"game {game!r} has no one-move lookahead; games with one: {LOOKAHEAD_GAMES}")


def lookahead_move(game: str, obs: np.ndarray, lookahead: str) -> Optional[int]:
    """The move a one-move ``lookahead`` (one of :data:`LOOKAHEADS`) finds for the mover of
    ``obs`` in ``game``, or None: "win" a move that wins at once (the lowest such column),
    "win_or_block" that, else one where the other side's piece would win at once; "none" never
    one. The league's opponent seats run it before their policy acts (``commander.league.
    opponent_lookahead``).

    Args:
        game: a game name of :data:`GAMES` (``connect_four``).
        obs: float32 (84 + 7,) as :class:`TwoPlayerEnv` gives it (the mover's planes first).
        lookahead: one of :data:`LOOKAHEADS`.

    Returns:
        A legal column (int in [0, 7)), or None when the lookahead finds no move.

    Raises:
        GameError: see :func:`check_lookahead`.
    """
    check_lookahead(game, lookahead)
    if lookahead == "none":
        return None
    for plane in (0, 1)[: 1 if lookahead == "win" else 2]:
        moves = winning_moves(obs, plane)
        if moves:
            return moves[0]
    return None


def connect_four_heuristic(obs: np.ndarray, rng: np.random.Generator) -> int:
    """Win if a move wins, else block the opponent's winning move, else a random legal move.

    Args:
        obs: float32 (84 + 7,) as :class:`TwoPlayerEnv` gives it (the mover's planes first).
    """
    move = lookahead_move("connect_four", obs, "win_or_block")
    return random_move(obs, 7, rng) if move is None else move


def random_move(obs: np.ndarray, n_actions: int, rng: np.random.Generator) -> int:
    """A uniform legal action of ``obs`` (flags in its last ``n_actions`` entries)."""
    return int(rng.choice(np.flatnonzero(obs[-n_actions:] > 0.5)))


def board_text(obs: np.ndarray, game: str, n_actions: int, mover_first: bool = True) -> str:
    """The position of ``obs`` (flags in its last ``n_actions`` entries) as text for a terminal:
    Connect Four's board with the mover's pieces ``X`` (the other's with ``mover_first`` False),
    the other player's ``O`` and the column numbers below; other games: the legal moves."""
    if game != "connect_four":
        return f"legal moves: {np.flatnonzero(obs[-n_actions:] > 0.5).tolist()}"
    planes = obs[:84].reshape(6, 7, 2) > 0.5
    x, o = (0, 1) if mover_first else (1, 0)
    rows = ["".join("X" if planes[r, c, x] else "O" if planes[r, c, o] else "." for c in range(7)) for r in range(6)]
    return "\n".join([*(" ".join(row) for row in rows), " ".join(str(c) for c in range(7))])


class TwoPlayerEnv(gym.Env):
    """A PettingZoo two-player AEC game from the learning player's seat (module docstring).

    Args:
        game: a game name of :data:`GAMES` (``connect_four``, ``rps``).
        opponent: ``"random"``, ``"heuristic"`` or a callable (module docstring); evals keep it.
        **game_kwargs: passed to the PettingZoo module's ``env()``.

    Raises:
        GameError: pettingzoo is not installed, or an unknown game or opponent (named).
    """

    metadata = {"render_modes": []}

    def __init__(self, game: str, opponent: Opponent = "heuristic", **game_kwargs: Any) -> None:
        modules = {name: module for name, module, _, _ in GAMES.values()}
        if game not in modules:
            raise GameError(f"env kwarg 'game' is {game!r}; known games: {sorted(modules)}")
        try:
            module = importlib.import_module(modules[game])
        except ImportError as e:
            raise GameError(f"game {game!r} needs PettingZoo's classic games ({e}); pip install 'rqrl[league]'") from None
        self.game = game
        self._aec = module.env(**game_kwargs)
        seats = self._aec.possible_agents
        self._seats = list(seats)
        space = self._aec.observation_space(seats[0])
        self._masked = isinstance(space, gym.spaces.Dict)
        inner = space["observation"] if self._masked else space
        self._one_hot = isinstance(inner, gym.spaces.Discrete)
        self._features = int(inner.n) if self._one_hot else int(np.prod(inner.shape))
        self.action_space = gym.spaces.Discrete(int(self._aec.action_space(seats[0]).n))
        self.observation_space = gym.spaces.Box(0.0, 1.0, (self._features + int(self.action_space.n),), np.float32)
        self._me = seats[0]
        self._forfeit = False
        self.set_opponent(opponent)

    def set_opponent(self, opponent: Opponent) -> None:
        """Play the next moves of the other seat with ``opponent`` (module docstring).

        Raises:
            GameError: a name that is not one of :data:`FIXED_OPPONENTS`.
        """
        if isinstance(opponent, str) and opponent not in FIXED_OPPONENTS:
            raise GameError(f"unknown opponent {opponent!r}: a fixed opponent is one of {FIXED_OPPONENTS}")
        self._opponent = opponent

    def _obs(self, seat: str) -> np.ndarray:
        raw = self._aec.observe(seat)
        inner = raw["observation"] if self._masked else raw
        if self._one_hot:
            feats = np.zeros(self._features, np.float32)
            feats[int(inner)] = 1.0
        else:
            feats = np.asarray(inner, np.float32).reshape(-1)
        mask = (np.asarray(raw["action_mask"], np.float32) if self._masked
                else np.ones(int(self.action_space.n), np.float32))
        return np.concatenate([feats, mask])

    def _opponent_move(self, obs: np.ndarray) -> int:
        if callable(self._opponent):
            return int(self._opponent(obs))
        if self._opponent == "heuristic" and self.game == "connect_four":
            return connect_four_heuristic(obs, self.np_random)
        return random_move(obs, int(self.action_space.n), self.np_random)

    def _over(self) -> bool:
        return bool(self._aec.terminations[self._me] or self._aec.truncations[self._me])

    def _play_opponent(self) -> None:
        """The opponent's moves until the learning player is to move or the game is over. An
        illegal move forfeits the game: the learning player wins it (PettingZoo scores it 0 for
        the player who did not move)."""
        while not self._over() and self._aec.agent_selection != self._me:
            obs = self._obs(self._aec.agent_selection)
            move = self._opponent_move(obs)
            self._forfeit = obs[-int(self.action_space.n):][move] < 0.5
            self._aec.step(move)

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._aec.reset(seed=int(self.np_random.integers(2**31)))
        self._me = self._seats[int(self.np_random.integers(2))]
        self._forfeit = False
        self._play_opponent()
        return self._obs(self._me), {"seat": self._seats.index(self._me)}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """The learning player's move and the opponent's replies. A game's end is ``terminated``
        (a game's own move limit too, as Rock-Paper-Scissors' one cycle: nothing follows it).

        Raises:
            GameError: the game is already over (reset first).
        """
        if self._over():
            raise GameError(f"game {self.game!r} is over: reset before stepping")
        self._aec.step(int(action))
        self._play_opponent()
        # PettingZoo sums a seat's rewards since its own last move: the move and the replies.
        reward = 1.0 if self._forfeit else float(self._aec._cumulative_rewards[self._me])
        over = self._over()
        info = {"outcome": int(np.sign(reward))} if over else {}
        return self._obs(self._me), reward, over, False, info


class WinReward(gym.Wrapper):
    """Reward 1.0 at the end of a won game, else 0.0: an eval's mean return is the win rate."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float(info.get("outcome", 0) == 1), terminated, truncated, info
