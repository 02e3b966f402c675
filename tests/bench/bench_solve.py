"""Time to solve: ``rqrl train`` on CartPole from launch to exit, per seed, with the median.

    python -m tests.bench.bench_solve --seeds 0 1 2 [--config deploy/configs/cartpole_dqn.py] [--json out.json]

Each run is a fresh ``rqrl train`` process (private Redis, coordinator, workers, teardown all
included in the wall time). Figures per seed: wall seconds, exit code, env steps and train
iterations at the solve, and the eval reward that solved it.
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


def solve_once(config: str, seed: int, collectors: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="rqrl-bench-") as tmp:
        exp = f"bench_solve_s{seed}"
        argv = [sys.executable, "-m", "coordinator.cli", "train", config, "--seed", str(seed),
                "--collectors", str(collectors), "--set", f"exp_name={exp}", *extra]
        t0 = time.perf_counter()
        res = subprocess.run(argv, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        summary_path = Path(tmp) / exp / "latest" / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        wait_teardown(Path(tmp) / exp / "latest")  # untimed: its processes end before the next run
        return {"seed": seed, "exit_code": res.returncode, "wall_s": round(wall, 2),
                "coordinator_wall_s": summary.get("wall_seconds"), "envstep": summary.get("envstep"),
                "train_iter": summary.get("train_iter"), "eval_reward": summary.get("last_eval_reward_mean"),
                "policy_envstep": summary.get("last_eval_policy_envstep"),
                "stale_chunks": summary.get("learner_stale_chunks", 0),
                "learner_wait_share": summary.get("learner_wait_share"),
                "stderr_tail": "" if res.returncode == 0 else res.stderr[-500:]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "deploy" / "configs" / "cartpole_dqn.py"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--collectors", type=int, default=2)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    extra = [f"--set={o}" for o in args.overrides]
    runs = []
    print(f"{'seed':>4} {'exit':>4} {'wall s':>7} {'coord s':>7} {'env steps':>9} {'at policy':>9} {'train it':>8} "
          f"{'eval':>6} {'stale':>5}")
    for seed in args.seeds:
        r = solve_once(args.config, seed, args.collectors, extra)
        runs.append(r)
        print(f"{r['seed']:>4} {r['exit_code']:>4} {r['wall_s']:>7} {r['coordinator_wall_s'] or '-':>7} "
              f"{r['envstep'] or '-':>9} {r['policy_envstep'] or '-':>9} {r['train_iter'] or '-':>8} "
              f"{r['eval_reward'] or '-':>6} {r['stale_chunks']:>5}", flush=True)
        if r["stderr_tail"]:
            print(r["stderr_tail"], file=sys.stderr)
    ok = [r for r in runs if r["exit_code"] == 0]
    result = {
        "solved": f"{len(ok)}/{len(runs)}",
        "median_wall_s": statistics.median(r["wall_s"] for r in runs),
        "median_envstep": statistics.median(r["envstep"] for r in ok) if ok else None,
        # Env steps consumed when the policy version that passed was made (sample efficiency,
        # without the time the asynchronous eval itself took).
        "median_policy_envstep": statistics.median(r["policy_envstep"] for r in ok) if ok else None,
        "stale_chunks": sum(r["stale_chunks"] or 0 for r in runs),
        "median_train_iter": statistics.median(r["train_iter"] for r in ok) if ok else None,
        "runs": runs,
    }
    print(f"solved {result['solved']}, median wall {result['median_wall_s']} s, "
          f"median env steps {result['median_envstep']} (at the passing policy {result['median_policy_envstep']}), "
          f"median train iters {result['median_train_iter']}, stale chunks dropped {result['stale_chunks']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
