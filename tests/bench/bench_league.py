"""Connect Four self-play: each seed's win rate against the heuristic and its league's Elo.

    python -m tests.bench.bench_league RUN_FOLDER [RUN_FOLDER ...]    # rqrl train / sweep run folders
    python -m tests.bench.bench_league docs/results/connect_four_ppo/seed*

Reads each folder's summary.json (``league``: players, Elo, payoff) and evals.jsonl (eval return
= win rate against the heuristic: the preset's evals use the win-only reward) and prints one
line per run: the last and best eval win rates, the env steps of the best, main's Elo, what
the opponent's seat is worth (``seat``, Elo points: coordinator/league.py), and the Elo of the
league's first and last snapshots (issue 33 asks the last above the first in every
seed), then the same as JSON. Runs nothing itself: the runs come from ``rqrl train
deploy/configs/connect_four_ppo.py --seed N`` or ``python -m tests.bench.results --run
connect_four_ppo``.

``--games N`` also plays each folder's final.pt (greedy, as evals act) N games against the
heuristic and says where its games are lost (:func:`tactics`): of main's moves, how often it had
a winning move and took one, how often the heuristic threatened a win and main blocked it; of
its lost games, the last move main made before the loss: an illegal column (``illegal move``: a
policy without the action mask), a win of its own left (``missed win``),
one threat not blocked (``missed block``), two or more threats (``two threats``: none can block
them all), or a move right under the square the heuristic then won on (``opened``: a block that
lifts the column to a second threat of the heuristic's above it counts here). Works on any
Connect Four final.pt, solo runs against the heuristic included.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from coordinator.league import table_snapshots


def league_figures(folder: Path) -> dict[str, Any]:
    """One run's figures (module docstring).

    Raises:
        FileNotFoundError: the folder has no summary.json.
        KeyError: the run had no league (not the league commander).
    """
    summary = json.loads((folder / "summary.json").read_text())
    players = summary["league"]["players"]
    snaps = table_snapshots(players)
    evals = [json.loads(line) for line in (folder / "evals.jsonl").read_text().splitlines() if line.strip()]
    scored = [e for e in evals if e.get("reward_mean") is not None]
    best = max(scored, key=lambda e: e["reward_mean"], default={})
    return {"run": str(folder), "envstep": summary.get("envstep"), "converged": summary.get("converged"),
            "last_win_rate": scored[-1]["reward_mean"] if scored else None,
            "best_win_rate": best.get("reward_mean"), "best_at_envstep": best.get("envstep"),
            "main_elo": players["main"]["elo"], "seat_advantage": summary["league"].get("seat_advantage"),
            "snapshots": len(snaps),
            "first_snapshot_elo": players[snaps[0]]["elo"] if snaps else None,
            "last_snapshot_elo": players[snaps[-1]]["elo"] if snaps else None}


LOSS_KINDS = ("illegal move", "missed win", "two threats", "missed block", "opened")


def loss_kind(obs: Any, action: int) -> str:
    """Why a game was lost, from main's last move: ``action`` (a column) played in ``obs`` (float32
    (84 + 7,), main to move), after which the heuristic won or the move itself was illegal. One of
    :data:`LOSS_KINDS` (module docstring): main's move makes only the square above it playable, so
    a loss with no threat open before it, or after it blocked the only one, was ``opened``."""
    from common import games as cf

    if obs[84 + action] < 0.5:
        return "illegal move"
    mine, theirs = cf.winning_moves(obs, 0), cf.winning_moves(obs, 1)
    if mine:
        return "missed win"
    if len(theirs) > 1:
        return "two threats"
    return "missed block" if theirs and action not in theirs else "opened"


def tactics(final_pt: Path, games: int, seed: int = 0) -> dict[str, Any]:
    """``final_pt`` (a Connect Four run's) against the heuristic over ``games`` games, seeded
    ``seed``, ``seed + 1``, ...: outcomes, main's tactical moves and its lost games by
    :func:`loss_kind` (module docstring).

    Raises:
        ValueError: final.pt was not trained on rqrl/ConnectFour-v0.
    """
    import gymnasium as gym

    import rqrl
    from common import games as cf

    agent = rqrl.load(final_pt)
    if agent.env_id != "rqrl/ConnectFour-v0":
        raise ValueError(f"{final_pt}: trained on {agent.env_id!r}, not rqrl/ConnectFour-v0")
    cf.register()
    env = gym.make("rqrl/ConnectFour-v0", opponent="heuristic")
    n = dict(win=0, draw=0, loss=0, wins_open=0, wins_taken=0, threats=0, blocked=0)
    lost = dict.fromkeys(LOSS_KINDS, 0)
    for g in range(games):
        obs, _ = env.reset(seed=seed + g)
        while True:
            mine, theirs = cf.winning_moves(obs, 0), cf.winning_moves(obs, 1)
            action = int(agent.act(obs))
            n["wins_open"] += bool(mine)
            n["wins_taken"] += action in mine
            threatened = bool(theirs) and not mine
            n["threats"] += threatened
            n["blocked"] += threatened and action in theirs
            before = obs
            obs, _, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        outcome = {1: "win", 0: "draw", -1: "loss"}[int(info.get("outcome", 0))]
        n[outcome] += 1
        if outcome == "loss":
            lost[loss_kind(before, action)] += 1
    env.close()
    return {"games": games, **n, "lost_by": lost, "win_rate": n["win"] / games,
            "wins_taken_share": n["wins_taken"] / n["wins_open"] if n["wins_open"] else None,
            "blocked_share": n["blocked"] / n["threats"] if n["threats"] else None}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--games", type=int, default=0, help="also play each final.pt this many games (tactics)")
    args = ap.parse_args(argv)
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    rows = []
    for folder in args.runs:
        summary = folder / "summary.json"
        league = summary.is_file() and "league" in json.loads(summary.read_text())
        row = league_figures(folder) if league or not args.games else {"run": str(folder)}
        if args.games:
            t = row["tactics"] = tactics(folder / "final.pt", args.games)
            print(f"{str(folder)[-40:]:<40} {args.games} games: won {t['win']}, drew {t['draw']}, lost {t['loss']} "
                  f"({', '.join(f'{k} {v}' for k, v in t['lost_by'].items())}); wins taken "
                  f"{fmt(t['wins_taken_share'], '.2f')} of {t['wins_open']}, threats blocked "
                  f"{fmt(t['blocked_share'], '.2f')} of {t['threats']}")
        rows.append(row)
    print(f"{'run':<40} {'env steps':>10} {'last':>5} {'best':>5} {'at':>10} {'main Elo':>8} {'seat':>5} "
          f"{'snaps':>5} {'first':>6} {'last':>6}")
    for r in (r for r in rows if "main_elo" in r):
        print(f"{r['run'][-40:]:<40} {r['envstep'] or 0:>10,} {fmt(r['last_win_rate'], '.2f'):>5} "
              f"{fmt(r['best_win_rate'], '.2f'):>5} {fmt(r['best_at_envstep'], ','):>10} {r['main_elo']:>8.0f} "
              f"{fmt(r['seat_advantage'], '+.0f'):>5} {r['snapshots']:>5} {fmt(r['first_snapshot_elo'], '.0f'):>6} {fmt(r['last_snapshot_elo'], '.0f'):>6}")
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
