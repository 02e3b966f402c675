"""League opponents on the collector: who plays the other seat of a two-player game's envs.

A training task of the league commander names its ``opponent`` (common/messages.py
``CollectorTask``): ``main`` is the task's own policy (self-play: it acts with the weights the
task holds, refreshed with them), any other id a frozen snapshot, read once from its versioned
blob (``rqrl:{exp}:league:snapshot:{player_id}``, common/keys.py) into a policy of its own and
kept (a snapshot never changes) among the worker's last :data:`KEPT` per run. The envs get it
through ``set_opponent`` (common/games.py), called on every env of the vector env::

    seat = opponents.seat_for(live, task["opponent"], own_policy, cfg, conn, ns, setting, rng)
    env.call("set_opponent", seat)         # seat(obs float32 (F + A,)) -> action int

The opponent acts as a collector of its version does (``Policy.act`` with the task's collect
setting: sampled, so a snapshot is a mixed strategy, as in fictitious play), or with
``commander.league.opponent_acts="eval"`` as an eval does (``Policy.act_eval``). With
``commander.league.opponent_lookahead`` it first looks one move ahead
(``common.games.lookahead_move``) and plays what that finds: a move that wins at once ("win"), or
else one that blocks main's win at once ("win_or_block"; one block a move). Main then meets
opponents that take every win in one it leaves them and block its single threats, as the
heuristic its evals play does, rather than only as often as its own past policy happens to
(docs/performance.md, the Connect Four league).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Optional

import numpy as np
import redis

from common import blobstore, games, keys
from common.policy import Policy, create_policy
from workers.comm_collector import WEIGHT_ERRORS, decode_weights

KEPT = 8  # snapshot policies a worker keeps per run (each a copy of the model)
SELF = "main"


class OpponentError(RuntimeError):
    """A task's opponent cannot play: no such snapshot, or its blob is unreadable (one line, naming both)."""


def load_snapshot(conn: redis.Redis, ns: str, player_id: str) -> tuple[int, dict[str, np.ndarray]]:
    """``(version, weights)`` of the snapshot ``player_id`` of run ``ns``.

    Raises:
        OpponentError: the snapshot does not exist, or its blob is corrupt or holds NaN / inf.
    """
    key = keys.league_snapshot(ns, player_id)
    try:
        got = blobstore.get_versioned(conn, key)
        if got is None:
            raise OpponentError(f"opponent {player_id!r} does not exist: no league snapshot at {key}")
        meta, payload = got
        return int(meta["version"]), decode_weights(payload, key)
    except WEIGHT_ERRORS as e:
        raise OpponentError(f"opponent {player_id!r}: league snapshot {key} is unreadable "
                            f"({type(e).__name__}: {e})") from None


class Seat:
    """The opponent's seat: ``policy`` acting on one observation at a time.

    Args:
        policy: a collect-mode policy (the task's own, or a snapshot's).
        spec: the env's spaces (common/spaces.py), for the stored form of observations.
        setting: the task's collect setting (the dict the task keeps current).
        rng: the task's generator (the policy's exploration draws from it).
        as_eval: act as an eval does (``Policy.act_eval``: PPO's most likely action) instead.
        lookahead: ``(game, lookahead)``: play the move ``common.games.lookahead_move`` finds,
            the policy's when it finds none; None: the policy always.
    """

    def __init__(self, policy: Policy, spec: Any, setting: dict[str, Any], rng: np.random.Generator,
                 as_eval: bool = False, lookahead: Optional[tuple[str, str]] = None) -> None:
        self.policy, self._spec, self._setting, self._rng, self._as_eval = policy, spec, setting, rng, as_eval
        self._lookahead = lookahead

    def __call__(self, obs: np.ndarray) -> int:
        if self._lookahead is not None:
            game, rule = self._lookahead
            move = games.lookahead_move(game, np.asarray(obs), rule)
            if move is not None:
                return move
        batch = self._spec.obs_batch(np.asarray(obs)[None])
        if self._as_eval:
            action = self.policy.act_eval(batch, self._rng)
        else:
            action, _ = self.policy.act(batch, self._setting, self._rng)
        return int(np.asarray(action).reshape(-1)[0])


def seat_for(live: Any, player_id: str, own: Policy, cfg: Any, conn: redis.Redis, ns: str,
             setting: dict[str, Any], rng: np.random.Generator) -> Seat:
    """The seat for ``player_id``: ``own`` for ``main``, else the snapshot's policy (loaded once
    per worker and run, the last :data:`KEPT` kept in ``live.opponents``), with the lookahead of
    ``commander.league.opponent_lookahead`` when it is not "none".

    Raises:
        OpponentError: see :func:`load_snapshot`; also weights that do not fit the model.
        common.games.GameError: a lookahead for an env that is not a game of common/games.py
            (the league commander refuses such a config before any task: its check_config).
    """
    league = cfg.commander.league
    as_eval = league.opponent_acts == "eval"
    rule = league.get("opponent_lookahead", "none")
    lookahead = None if rule == "none" else (games.game_of(cfg.env.env_id), rule)
    if player_id == SELF:
        return Seat(own, live.spec, setting, rng, as_eval, lookahead)
    kept: OrderedDict[str, Policy] = live.opponents
    policy = kept.get(player_id)
    if policy is None:
        _, weights = load_snapshot(conn, ns, player_id)
        policy = create_policy(cfg, live.spec, modes=("collect",), device="cpu")
        try:
            policy.set_weights(weights)
        except (ValueError, TypeError) as e:
            raise OpponentError(f"opponent {player_id!r}: league snapshot {keys.league_snapshot(ns, player_id)} "
                                f"does not fit the model ({e})") from None
        kept[player_id] = policy
        while len(kept) > KEPT:
            kept.popitem(last=False)
    kept.move_to_end(player_id)
    return Seat(policy, live.spec, setting, rng, as_eval, lookahead)
