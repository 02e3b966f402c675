"""Per algorithm: time to solve on the full stack against an in-process serial run of the same config.

    python -m tests.bench.bench_algorithms [--seeds 0 1 2 3 4] [--configs cartpole_dqn cartpole_ppo pendulum_sac]
                                           [--json out.json]

For each config: ``rqrl train`` per seed (launch to exit, private Redis and teardown included;
tests/bench/bench_solve.py) and the serial loop of tests/bench/bench_serial.py with the same
seeds. Printed per config: median time to solve, median env steps at the policy version that
passed (the env steps the learner had consumed when it made it) and at the stop, the same
median of the serial run and the ratio (goal <= 1.2), and stale chunks dropped (on-policy data
of an older version, never trained on).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from tests.bench import bench_serial, bench_solve

REPO = Path(__file__).resolve().parents[2]
GOAL_ENVSTEP_RATIO = 1.2


def run(configs: list[str], seeds: list[int], extra: list[str]) -> dict:
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": platform.node(),
                 "cpus": __import__("os").cpu_count(), "seeds": seeds, "results": {}}
    for name in configs:
        path = str(REPO / "deploy" / "configs" / f"{name}.py")
        print(f"== {name}: rqrl train", flush=True)
        dist = bench_solve.main(["--config", path, "--seeds", *map(str, seeds), *[f"--set={o}" for o in extra]])
        print(f"== {name}: serial", flush=True)
        ser = bench_serial.main(["--config", path, "--seeds", *map(str, seeds)])
        ratio = (round(dist["median_policy_envstep"] / ser["median_envstep"], 2)
                 if dist.get("median_policy_envstep") and ser.get("median_envstep") else None)
        out["results"][name] = {"distributed": dist, "serial": ser, "envstep_ratio": ratio}
    print(f"\n{'config':<16} {'solved':>6} {'time s':>7} {'env steps (policy/stop)':>24} {'serial':>8} "
          f"{'ratio':>6} {'goal':>5} {'stale':>6}")
    for name, r in out["results"].items():
        d, s = r["distributed"], r["serial"]
        steps = f"{d.get('median_policy_envstep')}/{d.get('median_envstep')}"
        print(f"{name:<16} {d['solved']:>6} {d['median_wall_s']:>7} {steps:>24} {s.get('median_envstep') or '-':>8} "
              f"{r['envstep_ratio'] or '-':>6} {GOAL_ENVSTEP_RATIO:>5} {d['stale_chunks']:>6}")
    return out


def fixed_budget(name: str, seconds: float, seed: int = 0) -> dict:
    """``rqrl train`` of config ``name`` for ``seconds`` (``commander.max_wall_seconds``): env steps/s,
    train iterations/s and the eval return it reached (no convergence expected)."""
    path = str(REPO / "deploy" / "configs" / f"{name}.py")
    r = bench_solve.solve_once(path, seed, 2, [f"--set=commander.max_wall_seconds={seconds}",
                                               "--set=commander.eval_every_train_iter=1000"])
    wall = r.get("coordinator_wall_s") or r["wall_s"]
    out = dict(r, config=name, budget_s=seconds,
               env_steps_per_s=round((r["envstep"] or 0) / wall, 1) if wall else None,
               train_iter_per_s=round((r["train_iter"] or 0) / wall, 1) if wall else None)
    print(f"{name}: {seconds:g} s budget, exit {r['exit_code']}, {r['envstep']} env steps "
          f"({out['env_steps_per_s']}/s), {r['train_iter']} train iters ({out['train_iter_per_s']}/s), "
          f"last eval {r['eval_reward']}", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["cartpole_dqn", "cartpole_ppo", "pendulum_sac"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    res = run(args.configs, args.seeds, args.overrides)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
