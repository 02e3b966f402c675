"""Does the exported policy hold up? ``rqrl train`` per seed, then final.pt re-evaluated on fresh episodes.

    python -m tests.bench.bench_reeval [--config deploy/configs/cartpole_dqn.py] [--seeds 20] [--episodes 20]

For each seed 0..N-1: a fresh ``rqrl train CONFIG --seed S`` (launch to exit), then
``rqrl eval``'s evaluation of its final.pt on ``--episodes`` episodes with seeds no run used
(100000 + 100 * S + i). A seed passes when that mean return reaches the config's stop_value.
Goal: at least 19 of 20 seeds pass. Prints per seed and the pass rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.bench_start import wait_teardown

REPO = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> dict:
    from common.config import load_config
    from coordinator.evaluate import evaluate_checkpoint

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "deploy" / "configs" / "cartpole_dqn.py"))
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--episodes", type=int, default=20)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    stop = float(load_config(args.config).env.stop_value)
    runs = []
    print(f"{'seed':>4} {'exit':>4} {'wall s':>7} {'run eval':>8} {'re-eval mean':>12} {'min':>6} {'pass':>5}", flush=True)
    for seed in range(args.seeds):
        with tempfile.TemporaryDirectory(prefix="rqrl-reeval-") as tmp:
            exp = f"reeval_s{seed}"
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", args.config, "--seed", str(seed),
                                  "--set", f"exp_name={exp}", *[f"--set={o}" for o in args.overrides]],
                                 cwd=tmp, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            final = Path(tmp) / exp / "latest" / "final.pt"
            summary_path = Path(tmp) / exp / "latest" / "summary.json"
            summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
            wait_teardown(Path(tmp) / exp / "latest")  # its processes end before the next run
            r = {"seed": seed, "exit_code": res.returncode, "wall_s": round(wall, 2),
                 "run_eval": summary.get("last_eval_reward_mean"), "reeval_mean": None, "reeval_min": None}
            if final.exists():
                ev = evaluate_checkpoint(final, episodes=args.episodes, seed=100_000 + 100 * seed)
                r["reeval_mean"], r["reeval_min"] = round(ev.mean, 2), min(ev.returns)
            r["passed"] = r["exit_code"] == 0 and r["reeval_mean"] is not None and r["reeval_mean"] >= stop
        runs.append(r)
        print(f"{seed:>4} {r['exit_code']:>4} {r['wall_s']:>7} {r['run_eval'] or '-':>8} {r['reeval_mean'] or '-':>12} "
              f"{r['reeval_min'] if r['reeval_min'] is not None else '-':>6} {str(r['passed']):>5}", flush=True)
    passed = sum(r["passed"] for r in runs)
    out = {"config": args.config, "episodes": args.episodes, "stop_value": stop, "passed": passed, "seeds": len(runs),
           "median_wall_s": statistics.median(r["wall_s"] for r in runs), "runs": runs}
    print(f"final.pt re-evaluated on {args.episodes} fresh episodes: {passed}/{len(runs)} seeds reach {stop:g} "
          f"(goal >= 19/20); median launch-to-exit {out['median_wall_s']} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
