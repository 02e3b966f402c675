"""The benchmark suite: one command, one raw JSON per run, the summary in docs/performance.md.

    nice -n 10 python -m tests.bench.run              # the full run (about 15 minutes on 2 cores)
    python -m tests.bench.run --quick --no-docs       # a short check that every benchmark runs

Runs, in order: launch to exit from fresh processes (``rqrl train``, the single-process loop and
DI-engine's serial pipeline where installed, DQN and PPO on CartPole, alternating; with the
run's phases; tests/bench/bench_start.py), time to solve (``rqrl train``, 5 seeds; 3 with --quick), the single-process
baseline on the same config and seeds, the same two for PPO (CartPole) and SAC (Pendulum, 3
seeds), the learner with and without prioritized replay, the data-parallel learner's samples/s
at ``learner_num`` 1 and 2, the re-evaluation of final.pt on 20
fresh episodes for 20 seeds, SAC on HalfCheetah for a fixed budget, the component benchmarks
(collector vs bare loop, transport vs raw redis-py, policy propagation, per-task overhead,
learner), the coordinator scale test (8 / 64 / 256 / 1,000 simulated collectors, then a
saturation run, then 1,000 on the long-task model) and the image benchmarks on Atari Pong
(collector, transport with and without compression, replay memory per transition, learner;
tests/bench/bench_images.py), and training episodes cut by task ends with envs kept on the
worker against the old life cycle (CartPole, Acrobot, Pong; tests/bench/bench_episodes.py).

Writes ``docs/bench/<UTC date>T<time>-<host>.json``: date, machine, command, git commit and
every repeat of every figure. Unless ``--no-docs``, it then rewrites the generated block of
docs/performance.md from that file (tests/bench/report.py). A benchmark that fails (e.g. the
coordinator does not catch up within its timeout) is recorded as an error in the JSON, gives
no figure, and makes the command exit 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

from tests.bench import (bench_algorithms, bench_components, bench_coordinator, bench_ddp, bench_episodes,
                         bench_images, bench_learner,
                         bench_reeval, bench_serial, bench_solve, bench_start, report)

REPO = Path(__file__).resolve().parents[2]


def _cmd(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=REPO).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine() -> dict[str, Any]:
    """What the figures were measured on (no credentials, no environment variables)."""
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")), None) if Path("/proc/meminfo").exists() else None
    import numpy
    import redis
    import rq
    import torch

    from common.embedded_redis import find_redis_server

    return {"host": socket.gethostname(), "platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "mem_gib": round(int(mem) / 2**20, 1) if mem else None, "python": platform.python_version(),
            "torch": torch.__version__, "numpy": numpy.__version__, "redis_py": redis.__version__,
            "rq": rq.__version__, "redis_server": _cmd([find_redis_server() or "redis-server", "--version"]),
            "redis_server_coordinator_bench": _redis7_version(),
            "loadavg_at_start": list(os.getloadavg())}


def _redis7_version() -> str:
    try:
        return _cmd([bench_coordinator.redis7_server(), "--version"])
    except RuntimeError as e:
        return str(e)


def _part(r: dict, errors: dict, name: str, fn: Callable[[], Any]) -> None:
    print(f"== {name}", flush=True)
    try:
        r[name] = fn()
    except Exception as e:  # recorded, no figure, exit 1 at the end
        errors[name] = f"{type(e).__name__}: {e}"
        traceback.print_exc()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer seeds, repeats and steps")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="solve/serial seeds (default 0-4; 0-2 with --quick)")
    ap.add_argument("--repeats", type=int, default=None, help="component repeats (default 3; 2 with --quick)")
    ap.add_argument("--sims", type=int, nargs="+", default=[8, 64, 256, 1000])
    ap.add_argument("--parts", nargs="+", default=["start", "solve", "serial", "algorithms", "priorities", "ddp", "reeval",
                                                   "halfcheetah", "components", "coordinator", "images", "episodes"])
    ap.add_argument("--di-engine", default=None, help="DI-engine's venv for the start part (bench_start.py)")
    ap.add_argument("--out-dir", default=str(REPO / "docs" / "bench"))
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/performance.md")
    ap.add_argument("--reuse", default=None, metavar="RAW.json",
                    help="take the parts not run now from this earlier raw JSON (recorded as reused, with its file)")
    ap.add_argument("--take", nargs="+", default=[], metavar="PART=FILE.json",
                    help="take a part from the JSON its own benchmark wrote (bench_start.py --json, bench_episodes.py --json)")
    args = ap.parse_args(argv)
    seeds = [str(s) for s in (args.seeds or ([0, 1, 2] if args.quick else [0, 1, 2, 3, 4]))]
    repeats = args.repeats or (2 if args.quick else 3)
    now = dt.datetime.now(dt.timezone.utc)
    raw: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"), "command": " ".join([Path(sys.executable).name, "-m", "tests.bench.run",
                                                                        *(argv if argv is not None else sys.argv[1:])]),
        "git_commit": _cmd(["git", "rev-parse", "HEAD"]), "git_dirty": bool(_cmd(["git", "status", "--porcelain"])),
        "machine": machine(), "settings": {"quick": args.quick, "seeds": seeds, "repeats": repeats, "sims": args.sims},
    }
    r: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if "start" in args.parts:  # launch to exit from fresh processes: rqrl, serial, DI-engine; DQN and PPO
        _part(r, errors, "start", lambda: bench_start.main(
            ["--seeds", *seeds] + (["--di-engine", args.di_engine] if args.di_engine else [])))
    if "solve" in args.parts:
        _part(r, errors, "solve", lambda: bench_solve.main(["--seeds", *seeds]))
    if "serial" in args.parts:
        _part(r, errors, "serial", lambda: bench_serial.main(["--seeds", *seeds]))
    if "algorithms" in args.parts:  # PPO (5 seeds) and SAC (3) against their serial runs; DQN is "solve"
        _part(r, errors, "algorithms", lambda: {
            **bench_algorithms.run(["cartpole_ppo"], [int(x) for x in seeds], [])["results"],
            **bench_algorithms.run(["pendulum_sac"], [int(x) for x in seeds[:3]], [])["results"]})
    if "priorities" in args.parts:
        _part(r, errors, "priorities", lambda: bench_learner.main(
            ["--iters", "500" if args.quick else "2000", "--repeats", str(repeats)]))
    if "ddp" in args.parts:
        _part(r, errors, "ddp", lambda: bench_ddp.main(
            ["--iters", "300" if args.quick else "1000", "--repeats", str(repeats)]))
    if "reeval" in args.parts:
        _part(r, errors, "reeval", lambda: bench_reeval.main(["--seeds", "4" if args.quick else "20"]))
    if "halfcheetah" in args.parts:
        _part(r, errors, "halfcheetah", lambda: bench_algorithms.fixed_budget(
            "halfcheetah_sac", 60.0 if args.quick else 180.0))
    if "components" in args.parts:
        _part(r, errors, "components", lambda: bench_components.main(
            (["--quick"] if args.quick else []) + ["--repeats", str(repeats)]))
    if "coordinator" in args.parts:
        _part(r, errors, "coordinator", lambda: bench_coordinator.main(
            ["--sims", *map(str, args.sims), "--seconds", "5" if args.quick else "10",
             "--burst", "20000" if args.quick else "50000", "--repeats", "1" if args.quick else "3",
             "--long-sims", str(max(args.sims)), "--long-window", "10" if args.quick else "30"]))
    if "images" in args.parts:  # Atari Pong: collector, transport, replay memory, learner (needs the atari extra)
        _part(r, errors, "images", lambda: bench_images.main((["--quick"] if args.quick else []) + ["--repeats", str(repeats)]))
    if "episodes" in args.parts:  # training episodes cut by task ends, env builds per worker (kept vs old life cycle)
        _part(r, errors, "episodes", lambda: bench_episodes.main(["--envs", "cartpole", "acrobot",
                                                                   *([] if args.quick else ["pong"])]))
    raw["machine"]["loadavg_at_end"] = list(os.getloadavg())
    if args.reuse:  # figures of an earlier run, kept with where they came from
        earlier = json.loads(Path(args.reuse).read_text())
        reused = {k: v for k, v in earlier.get("results", {}).items() if k not in r}
        r.update(reused)
        raw["reused"] = {"file": Path(args.reuse).name, "date": earlier.get("date"),
                         "git_commit": earlier.get("git_commit"), "parts": sorted(reused)}
    for spec in args.take:
        part, _, path = spec.partition("=")
        if part in r:
            raise SystemExit(f"--take {spec}: part {part!r} was run now")
        r[part] = json.loads(Path(path).read_text())
        raw.setdefault("taken_from", []).append({"part": part, "file": Path(path).name})
    raw["results"] = r
    raw["errors"] = errors
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{now.strftime('%Y-%m-%dT%H%M%SZ')}-{raw['machine']['host']}.json"
    path.write_text(json.dumps(raw, indent=2) + "\n")
    print(f"\nraw output: {path}")
    print(report.summary_table(raw))
    if not args.no_docs:
        report.update_doc(REPO / "docs" / "performance.md", raw, path)
        print("docs/performance.md: generated block rewritten")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
