"""How long a refused launch takes to say why: wall seconds from starting the process to its exit,
interpreter start and imports included (what a user waits at the prompt).

Cases (tests/integration/test_run_records.py checks what each says and that nothing is made):
the DQN config on Pendulum's Box actions, a stateful env wrapper, ``rqrl train`` and ``rqrl sweep``
given a Redis URL nobody answers, ``rqrl eval`` of a missing file (goal for each: < 3 s), and the
coordinator given that URL (``common.connection.PATIENCE_S``: about 10 s by design).

    python -m tests.bench.bench_refusals [--repeats 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench.stats import spread, verdict

REPO = Path(__file__).resolve().parents[2]
DQN = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"redis://127.0.0.1:{s.getsockname()[1]}/0"


def _cases() -> dict[str, tuple[list[str], str]]:
    """Each case's command line and a piece of the one line it must refuse with."""
    cli = [sys.executable, "-m", "coordinator.cli"]
    return {
        "train: DQN on Box actions": ([*cli, "train", DQN, "--set", "env.env_id=Pendulum-v1"],
                                      "'dqn' needs Discrete actions"),
        "train: stateful wrapper": ([*cli, "train", DQN, "--set",
                                     "env.wrappers=[{'type': 'gymnasium.wrappers:NormalizeObservation'}]"],
                                    "running statistics"),
        "train: unreachable Redis": ([*cli, "train", DQN, "--redis-url", _dead_url()], "cannot reach Redis"),
        "sweep: unreachable Redis": ([*cli, "sweep", DQN, "--seeds", "0-1", "--redis-url", _dead_url()],
                                     "cannot reach Redis"),
        "eval: missing file": ([*cli, "eval", "/missing.pt"], "does not exist"),
        "coordinator: unreachable Redis": ([sys.executable, "-m", "coordinator", DQN, "--redis-url", _dead_url()],
                                           "cannot reach Redis"),
    }


def _time(argv: list[str], expected: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RQRL_REDIS_URL": "", "RQ_REDIS_URL": ""}
    with tempfile.TemporaryDirectory() as cwd:
        t0 = time.monotonic()
        res = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - t0
    if res.returncode != 1 or expected not in res.stderr:
        raise RuntimeError(f"{argv[2:]} exited {res.returncode} without {expected!r}: {res.stderr[-500:]}")
    return seconds


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the figures as JSON here")
    args = ap.parse_args(argv)
    out = {"load_avg_1m": os.getloadavg()[0], "cases": {}}
    for name, (cmd, expected) in _cases().items():
        fig = spread([_time(cmd, expected) for _ in range(args.repeats)], 2)
        goal = "<= 13" if name.startswith("coordinator") else "<= 3"
        out["cases"][name] = {**fig, "goal_s": goal, "verdict": verdict(fig, goal)}
        print(f"{name:<34} median {fig['median']:>6.2f} s  (min {fig['min']:.2f}, max {fig['max']:.2f}; "
              f"goal {goal} s: {out['cases'][name]['verdict']})", flush=True)
    out["load_avg_1m_end"] = os.getloadavg()[0]
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
