"""Connect Four self-play: each seed's win rate against the heuristic and its league's Elo.

    python -m tests.bench.bench_league RUN_FOLDER [RUN_FOLDER ...]    # rqrl train / sweep run folders
    python -m tests.bench.bench_league docs/results/connect_four_ppo/seed*

Reads each folder's summary.json (``league``: players, Elo, payoff) and evals.jsonl (eval return
= win rate against the heuristic: the preset's evals use the win-only reward) and prints one
line per run: the last and best eval win rates, the env steps of the best, main's Elo, and the
Elo of the league's first and last snapshots (issue 33 asks the last above the first in every
seed), then the same as JSON. Runs nothing itself: the runs come from ``rqrl train
deploy/configs/connect_four_ppo.py --seed N`` or ``python -m tests.bench.results --run
connect_four_ppo``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def league_figures(folder: Path) -> dict[str, Any]:
    """One run's figures (module docstring).

    Raises:
        FileNotFoundError: the folder has no summary.json.
        KeyError: the run had no league (not the league commander).
    """
    summary = json.loads((folder / "summary.json").read_text())
    players = summary["league"]["players"]
    snaps = sorted((p for p in players if p != "main"), key=lambda p: players[p]["train_iter"])
    evals = [json.loads(line) for line in (folder / "evals.jsonl").read_text().splitlines() if line.strip()]
    scored = [e for e in evals if e.get("reward_mean") is not None]
    best = max(scored, key=lambda e: e["reward_mean"], default={})
    return {"run": str(folder), "envstep": summary.get("envstep"), "converged": summary.get("converged"),
            "last_win_rate": scored[-1]["reward_mean"] if scored else None,
            "best_win_rate": best.get("reward_mean"), "best_at_envstep": best.get("envstep"),
            "main_elo": players["main"]["elo"], "snapshots": len(snaps),
            "first_snapshot_elo": players[snaps[0]]["elo"] if snaps else None,
            "last_snapshot_elo": players[snaps[-1]]["elo"] if snaps else None}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    rows = [league_figures(p) for p in ap.parse_args(argv).runs]
    print(f"{'run':<40} {'env steps':>10} {'last':>5} {'best':>5} {'at':>10} {'main Elo':>8} "
          f"{'snaps':>5} {'first':>6} {'last':>6}")
    for r in rows:
        fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
        print(f"{r['run'][-40:]:<40} {r['envstep'] or 0:>10,} {fmt(r['last_win_rate'], '.2f'):>5} "
              f"{fmt(r['best_win_rate'], '.2f'):>5} {fmt(r['best_at_envstep'], ','):>10} {r['main_elo']:>8.0f} "
              f"{r['snapshots']:>5} {fmt(r['first_snapshot_elo'], '.0f'):>6} {fmt(r['last_snapshot_elo'], '.0f'):>6}")
    print(json.dumps(rows))
    return rows


if __name__ == "__main__":
    main()
