"""Launch to exit: ``rqrl train`` against serial runs, every side timed from a fresh process.

    python -m tests.bench.bench_start [--configs cartpole_dqn cartpole_ppo] [--seeds 0 1 2 3 4]
                                      [--di-engine VENV] [--json out.json]

For each config and seed, in an order that rotates with the seed (no side always runs first):

- ``rqrl train CONFIG --seed S`` (private Redis, coordinator, workers), with the phases the run
  recorded in summary.json (common/phases.py): first train step after launch, exit after the
  confirming eval; the learner's train iterations per second from its first iteration
  (``train_iter / learner_train_s``) and the share of that time its training thread waited,
  runnable, for a CPU (``learner_sched_wait_share``: what the collector and eval processes on
  the same cores cost it);
- the in-process loop of tests/bench/bench_serial.py (same config, policy, adder and replay
  ratio, one process, no Redis) as a process of its own, with its train iterations per second
  (eval time left out) and when its first train iteration ended;
- DI-engine 0.5.3's serial pipeline (``ding -m serial`` for DQN, ``-m serial_onpolicy`` for PPO,
  with dizoo's CartPole config, CartPole-v0, stop_value 195) when a DI-engine venv is found:
  ``--di-engine``, else ``$RQRL_DI_ENGINE_VENV``, else ``/tmp/dibase/venv`` (where
  ../shared/anchors/di_engine_baseline.sh builds it); without one that column is skipped.

Every side's wall time runs from just before its process is started to its exit, so imports,
env and policy building and the exit are in all of them. Before each run the previous
``rqrl train``'s background teardown (curve.png, the workers' exit, the Redis stop) is waited
for, untimed. The load average is recorded with every run. Also measured: building the learner's
policy (its optimizer) in a forked work-horse whose parent did or did not import
``torch._dynamo`` first (workers/worker.py, PreloadWorker).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[2]
DI_CONFIGS = {  # config -> (ding mode, dizoo config)
    "cartpole_dqn": ("serial", "classic_control/cartpole/config/cartpole_dqn_config.py"),
    "cartpole_ppo": ("serial_onpolicy", "classic_control/cartpole/config/cartpole_ppo_config.py"),
}
GOALS = {"rqrl_vs_di_engine": 0.4, "first_train_s": 1.5, "exit_after_confirmation_s": 0.3,
         "learner_vs_serial_it_per_s": 0.9}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("RQRL_REDIS_URL", None)
    return env


def _timed(argv: list[str], cwd: str, timeout: float, env: Optional[dict[str, str]] = None) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run ``argv``; returns the result, its wall seconds (start to exit) and the unix time it started."""
    start_unix, t0 = time.time(), time.perf_counter()
    res = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env or _env())
    return res, time.perf_counter() - t0, start_unix


def wait_teardown(run_dir: Path, timeout: float = 120.0) -> Optional[float]:
    """Wait (untimed) until ``rqrl train``'s background teardown of the run in ``run_dir`` logged its
    end (its processes are gone, so they take no CPU from the next measurement); returns when it
    ended (unix seconds), or None after ``timeout`` seconds."""
    log = run_dir / "log" / "teardown.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"teardown finished in [\d.]+ s \(at ([\d.]+)\)", log.read_text() if log.exists() else "")
        if m:
            return float(m.group(1))
        time.sleep(0.1)  # a file another process writes: nothing to block on
    return None


def rqrl_once(config: str, seed: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rqrl-bench-start-") as tmp:
        exp = f"bench_start_s{seed}"
        res, wall, _ = _timed([sys.executable, "-m", "coordinator.cli", "train", str(REPO / "deploy" / "configs" / f"{config}.py"),
                               "--seed", str(seed), "--name", "r", "--set", f"exp_name={exp}"], tmp, 900)
        run = Path(tmp) / exp / "r"
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
        teardown_end = wait_teardown(run)
    ph = summary.get("phases", {})
    rel = {k: round(v - ph["launch"], 3) for k, v in ph.items()} if "launch" in ph else {}
    train_s, it = summary.get("learner_train_s"), summary.get("train_iter")
    return {
        "seed": seed, "exit_code": res.returncode, "wall_s": round(wall, 2), "loadavg_1min": load,
        "envstep": summary.get("envstep"), "train_iter": it, "phases_s": rel,
        "first_train_s": rel.get("first_train_step"),
        "exit_after_confirmation_s": round(rel["exit"] - rel["confirmation"], 3) if {"exit", "confirmation"} <= set(rel) else None,
        "learner_it_per_s": round(it / train_s, 1) if it and train_s else None,
        "learner_sched_wait_share": summary.get("learner_sched_wait_share"),
        "learner_wait_share": summary.get("learner_wait_share"),
        "teardown_after_exit_s": round(teardown_end - ph["exit"], 2) if teardown_end and "exit" in ph else None,
        "stderr_tail": "" if res.returncode == 0 else res.stderr[-500:],
    }


def serial_once(config: str, seed: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="rqrl-bench-serial-") as tmp:
        out = Path(tmp) / "serial.json"
        res, wall, started = _timed([sys.executable, "-m", "tests.bench.bench_serial", "--config",
                                     str(REPO / "deploy" / "configs" / f"{config}.py"), "--seeds", str(seed),
                                     "--json", str(out)], tmp, 900)
        run = json.loads(out.read_text())["runs"][0] if out.exists() else {}
    return {"seed": seed, "exit_code": res.returncode, "wall_s": round(wall, 2), "loadavg_1min": load,
            "solved": run.get("solved"), "envstep": run.get("envstep"), "train_iter": run.get("train_iter"),
            "train_iter_per_s": run.get("train_iter_per_s"),
            "first_train_s": round(run["first_train_unix"] - started, 3) if run.get("first_train_unix") else None,
            "stderr_tail": "" if res.returncode == 0 else res.stderr[-500:]}


def di_engine_venv(given: Optional[str]) -> Optional[Path]:
    """The DI-engine venv to run (module docstring), or None when there is none."""
    venv = Path(given or os.environ.get("RQRL_DI_ENGINE_VENV") or "/tmp/dibase/venv")
    return venv if (venv / "bin" / "ding").exists() else None


def di_engine_once(venv: Path, config: str, seed: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    mode, cfg = DI_CONFIGS[config]
    site = next((venv / "lib").glob("python3*/site-packages"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    with tempfile.TemporaryDirectory(prefix="rqrl-bench-ding-") as tmp:
        res, wall, _ = _timed([str(venv / "bin" / "ding"), "-m", mode, "-c", str(site / "dizoo" / cfg), "-s", str(seed)],
                              tmp, 1800, env=env)
    text = res.stdout + res.stderr
    return {"seed": seed, "exit_code": res.returncode, "wall_s": round(wall, 2), "loadavg_1min": load,
            "converged": "is greater than stop_value" in text,
            "stderr_tail": "" if res.returncode == 0 else text[-500:]}


_PROBE = textwrap.dedent("""
    import json, os, sys, time
    import fakeredis
    import workers.worker
    from common import spaces
    from common.config import load_config
    from common.policy import create_policy
    cfg = load_config(sys.argv[1])
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    t = time.perf_counter()
    if sys.argv[2] == "preload":  # what a PreloadWorker does when it starts
        workers.worker.PreloadWorker(["learner"], connection=fakeredis.FakeRedis())
    parent_s = time.perf_counter() - t
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the work-horse of a learner task
        t, c = time.perf_counter(), time.process_time()
        create_policy(cfg, spec, modes=("learn",), device="cpu")
        os.write(w, json.dumps({"horse_s": time.perf_counter() - t, "horse_cpu_s": time.process_time() - c}).encode())
        os._exit(0)
    os.close(w)
    out = json.loads(os.read(r, 4096))
    os.waitpid(pid, 0)
    print(json.dumps(dict(out, parent_s=parent_s)))
""")


def optimizer_import(config: str, repeats: int) -> dict[str, Any]:
    """Seconds to build the learner's policy in a forked work-horse, its parent having imported
    ``torch._dynamo`` (``preload``) or not (``plain``), alternating; and the parent's import."""
    out: dict[str, list[dict[str, float]]] = {"plain": [], "preload": []}
    for _ in range(repeats):
        for kind in ("plain", "preload"):
            res = subprocess.run([sys.executable, "-c", _PROBE, str(REPO / "deploy" / "configs" / f"{config}.py"), kind],
                                 cwd=REPO, capture_output=True, text=True, timeout=300, env=_env())
            if res.returncode != 0:
                raise RuntimeError(f"optimizer import probe failed: {res.stderr[-2000:]}")
            out[kind].append(json.loads(res.stdout.strip().splitlines()[-1]))
    med = {kind: {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]} for kind, runs in out.items()}
    return {"config": config, "repeats": repeats, "runs": out, "median": med}


def _median(values: list[Optional[float]]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return round(statistics.median(vals), 3) if vals else None


def _ratios(a: list[dict], b: list[dict], key: str = "wall_s") -> list[float]:
    """``a[key] / b[key]`` per seed both have (and both exited 0)."""
    bb = {r["seed"]: r for r in b if r.get("exit_code") == 0 and r.get(key)}
    return [round(r[key] / bb[r["seed"]][key], 3) for r in a if r.get("exit_code") == 0 and r.get(key) and r["seed"] in bb]


def run(configs: list[str], seeds: list[int], venv: Optional[Path]) -> dict[str, Any]:
    out: dict[str, Any] = {"seeds": seeds, "di_engine": str(venv) if venv else None,
                           "loadavg_at_start": list(os.getloadavg()), "results": {}}
    if venv is None:
        print("no DI-engine venv found (--di-engine, $RQRL_DI_ENGINE_VENV, /tmp/dibase/venv): that column is skipped",
              flush=True)
    for config in configs:
        sides = {"rqrl": lambda s: rqrl_once(config, s), "serial": lambda s: serial_once(config, s)}
        if venv is not None and config in DI_CONFIGS:
            sides["di_engine"] = lambda s: di_engine_once(venv, config, s)
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        names = list(sides)
        for i, seed in enumerate(seeds):
            for name in names[i % len(names):] + names[:i % len(names)]:
                r = sides[name](seed)
                runs[name].append(r)
                print(f"{config} seed {seed} {name:<9} exit {r['exit_code']} wall {r['wall_s']:>7} s "
                      f"(load {r['loadavg_1min']:.2f})"
                      + (f" first train {r.get('first_train_s')} s, exit after confirmation "
                         f"{r.get('exit_after_confirmation_s')} s, learner {r.get('learner_it_per_s')} it/s, "
                         f"sched wait {r.get('learner_sched_wait_share')}" if name == "rqrl" else "")
                      + (f" {r.get('train_iter_per_s')} it/s" if name == "serial" else ""), flush=True)
                if r.get("stderr_tail"):
                    print(r["stderr_tail"], file=sys.stderr)
        rq, se = runs["rqrl"], runs["serial"]
        summary = {
            "rqrl_wall_s": _median([r["wall_s"] for r in rq if r["exit_code"] == 0]),
            "serial_wall_s": _median([r["wall_s"] for r in se if r["exit_code"] == 0]),
            "rqrl_vs_serial": _ratios(rq, se),
            "first_train_s": [r["first_train_s"] for r in rq],
            "serial_first_train_s": [r["first_train_s"] for r in se],
            "exit_after_confirmation_s": [r["exit_after_confirmation_s"] for r in rq],
            "learner_it_per_s": [r["learner_it_per_s"] for r in rq],
            "serial_it_per_s": [r["train_iter_per_s"] for r in se],
            "learner_vs_serial_it_per_s": [round(a["learner_it_per_s"] / b["train_iter_per_s"], 3)
                                           for a, b in zip(rq, se) if a.get("learner_it_per_s") and b.get("train_iter_per_s")],
            "learner_sched_wait_share": [r["learner_sched_wait_share"] for r in rq],
            "envstep": [r["envstep"] for r in rq], "serial_envstep": [r["envstep"] for r in se],
        }
        if "di_engine" in runs:
            summary["di_engine_wall_s"] = _median([r["wall_s"] for r in runs["di_engine"] if r["exit_code"] == 0])
            summary["rqrl_vs_di_engine"] = _ratios(rq, runs["di_engine"])
        out["results"][config] = {"runs": runs, "summary": summary}
        print(f"{config}: " + json.dumps(summary), flush=True)
    out["optimizer_import"] = optimizer_import(configs[0], max(2, min(3, len(seeds))))
    print("optimizer import: " + json.dumps(out["optimizer_import"]["median"]), flush=True)
    out["loadavg_at_end"] = list(os.getloadavg())
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["cartpole_dqn", "cartpole_ppo"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--di-engine", default=None, help="DI-engine's venv (default $RQRL_DI_ENGINE_VENV, /tmp/dibase/venv)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    res = run(args.configs, args.seeds, di_engine_venv(args.di_engine))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
