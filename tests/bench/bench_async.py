"""IMPALA against PPO on one box: env steps/s with the same net and the same collectors (issue 32).

    python -m tests.bench.bench_async [--collectors 2] [--env-steps 60000] [--repeats 1] [--json OUT]

Each side is a fresh ``rqrl train --collectors N`` on a private Redis, MinAtar Breakout with the
MinAtar preset's net (``deploy/configs/minatar_breakout_impala.py``; PPO is
``deploy/configs/minatar_space_invaders_ppo.py`` on ``MinAtar/Breakout-v1``: the same conv torso,
128-unit layer and 64-unit heads), ``commander.max_env_step`` = ``--env-steps``, no evals, so a
run ends at its budget (exit 2). Rates come from the run's records as in
tests/bench/bench_scaling.py (:func:`tests.bench.bench_scaling._figures`): env steps/s between
10 % and 90 % of the run's env steps of ``episodes.jsonl``; the learner's idle share
(``learner_wait_share``: the share of its time it waited for data) and the collectors' wait share
(``limiter_wait_share``: their time waiting for the learner, PPO's wait for each new policy
version and IMPALA's back-pressure alike). The sides alternate within each repeat.

Issue 32's goal: IMPALA env steps/s / PPO's >= 1.5.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from common import keys
from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from tests.bench.bench_episodes import _until_tasks_end
from tests.bench.bench_scaling import EXIT_BUDGET, ProcSampler, _figures
from tests.bench.bench_start import wait_teardown

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "deploy" / "configs"
GOAL = 1.5
SIDES: dict[str, tuple[Path, list[str]]] = {
    "impala": (CONFIGS / "minatar_breakout_impala.py", []),
    "ppo": (CONFIGS / "minatar_space_invaders_ppo.py", ["env.env_id=MinAtar/Breakout-v1"]),
}
COMMON = ["env.stop_value=1e9", "commander.eval_every_env_step=0", "commander.eval_every_train_iter=0",
          "commander.eval_interval=0.0", "commander.eval_task_space=0", "commander.closing_eval_timeout=0.0",
          "commander.confirm_eval_episodes=0", "commander.max_wall_seconds=1800.0",
          "policy.learn.learner.send_info_freq=2"]


def run_side(side: str, collectors: int, env_steps: int, timeout: float = 1800.0) -> dict[str, Any]:
    """One ``rqrl train`` of ``side`` to ``env_steps``; its figures (module docstring).

    Raises:
        RuntimeError: the run did not end at its budget (the end of its output attached).
    """
    config, sets = SIDES[side]
    exp, name = f"bench_async_{side}", "r"
    load = round(os.getloadavg()[0], 2)
    server = EmbeddedRedis().start()
    workdir = Path(tempfile.mkdtemp(prefix=f"rqrl-bench-async-{side}-"))
    run_dir = workdir / exp / name
    argv = [sys.executable, "-m", "coordinator.cli", "train", str(config), "--redis-url", server.url,
            "--collectors", str(collectors), "--name", name,
            *[f"--set={s}" for s in [*COMMON, *sets, f"exp_name={exp}", f"commander.max_env_step={env_steps}"]]]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    try:
        with open(workdir / "train.log", "w") as log:
            proc = subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        with ProcSampler(proc.pid, connect(server.url)) as sampler:
            code = proc.wait(timeout=timeout)
        if code != EXIT_BUDGET:
            tail = (workdir / "train.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{side}: rqrl train exited {code}, not {EXIT_BUDGET} (its budget): {tail}")
        evs = _until_tasks_end(connect(server.url), keys.events(keys.namespace(exp, name)))
        wait_teardown(run_dir)
        return {"side": side, "collectors": collectors, "loadavg_at_start": load,
                **_figures(run_dir, evs, sampler, "episodes")}
    finally:
        server.stop()


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collectors", type=int, default=2, help="collector workers of each side")
    ap.add_argument("--env-steps", type=int, default=60_000, help="each run's env-step budget")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    records = []
    for r in range(args.repeats):
        for side in (["impala", "ppo"] if r % 2 == 0 else ["ppo", "impala"]):
            rec = run_side(side, args.collectors, args.env_steps)
            records.append(rec)
            print(json.dumps({k: rec.get(k) for k in ("side", "env_steps_per_s", "learner_wait_share",
                                                      "limiter_wait_share", "train_iter", "wall_s",
                                                      "loadavg_at_start")}), flush=True)
    rate = {s: statistics.median([r["env_steps_per_s"] for r in records if r["side"] == s and r["env_steps_per_s"]])
            for s in SIDES}
    share = {s: {k: statistics.median([r[k] or 0 for r in records if r["side"] == s])
                 for k in ("learner_wait_share", "limiter_wait_share")} for s in SIDES}
    ratio = rate["impala"] / rate["ppo"]
    print("\n| side | env steps/s (median) | learner idle share | collector wait share |\n|---|---|---|---|")
    for s in SIDES:
        print(f"| {s} | {rate[s]:.1f} | {share[s]['learner_wait_share']:.2f} | {share[s]['limiter_wait_share']:.2f} |")
    print(f"\nimpala / ppo env steps/s: {ratio:.2f} (goal >= {GOAL}: {'met' if ratio >= GOAL else 'not met'})")
    out = {"collectors": args.collectors, "env_steps": args.env_steps, "records": records, "ratio": ratio}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
