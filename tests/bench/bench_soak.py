"""Soak benchmark: does a long run's footprint grow? Redis memory, keys by kind, every process's RSS.

    python -m tests.bench.bench_soak [--minutes 30] [--config deploy/configs/cartpole_dqn.py]

Runs ``rqrl train`` against a private redis-server with a stop value it never reaches, so it
trains for ``--minutes``. Once the learner has reported a train iteration (the start sample) and
again ``--end-margin`` seconds before the wall budget (the end sample) it reads Redis's
``used_memory``, counts the keys of each kind (``SCAN``; ids in key names replaced by ``*``) and
reads the RSS of every process of the run (``rqrl train``, its forked coordinator and workers with
their work-horses, redis-server). It prints both samples and the growth projected to a day
((end - start) / elapsed x 86,400 s). A 2-minute trial shows the table's shape; the figures that
matter need the full 30 minutes.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from common import keys
from common.connection import connect
from common.embedded_redis import EmbeddedRedis

REPO = Path(__file__).resolve().parents[2]
# A hex or numeric id inside a key name (task ids, data ids, worker names' pids): one kind.
_ID = re.compile(r"(?<=[_:/-])[0-9a-f]{6,}|(?<=[:_-])\d+(?=$|[:_-])")


def key_kind(key: str, ns: str) -> str:
    """The kind of a key: its name with the run's namespace as ``{exp}`` and ids as ``*``."""
    return _ID.sub("*", key.replace(ns, "{exp}"))


def sample(conn: Any, ns: str, pids: list[int]) -> dict[str, Any]:
    """Redis ``used_memory``, key counts per kind, and the RSS (bytes) of each process alive in ``pids``."""
    kinds: Counter[str] = Counter(key_kind(k.decode(), ns) for k in conn.scan_iter(count=1000))
    rss = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            rss[f"{pid} {' '.join(p.cmdline()[:4])[:60]}"] = p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return {"t": time.monotonic(), "used_memory": int(conn.info("memory")["used_memory"]), "keys": dict(kinds),
            "rss": rss}


def _tree(pid: int) -> list[int]:
    try:
        root = psutil.Process(pid)
        return [root.pid, *(c.pid for c in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []


def report(start: dict[str, Any], end: dict[str, Any]) -> str:
    """The two samples side by side and the growth projected to a day."""
    elapsed = max(1e-9, end["t"] - start["t"])
    per_day = 86400.0 / elapsed
    mb = 2**20
    lines = [f"soak: {elapsed:.0f} s between samples",
             f"{'redis used_memory':<56} {start['used_memory'] / mb:>10.2f} MB {end['used_memory'] / mb:>10.2f} MB"
             f" {(end['used_memory'] - start['used_memory']) * per_day / mb:>+12.1f} MB/day", "",
             f"{'keys by kind':<56} {'start':>13} {'end':>13} {'per day':>13}"]
    for kind in sorted(set(start["keys"]) | set(end["keys"])):
        a, b = start["keys"].get(kind, 0), end["keys"].get(kind, 0)
        lines.append(f"{kind[:56]:<56} {a:>13} {b:>13} {(b - a) * per_day:>+13.0f}")
    lines += ["", f"{'process RSS':<56} {'start':>13} {'end':>13} {'per day':>13}"]
    for proc in sorted(set(start["rss"]) | set(end["rss"])):
        a, b = start["rss"].get(proc), end["rss"].get(proc)
        growth = f"{(b - a) * per_day / mb:+10.1f} MB" if a is not None and b is not None else "-"
        lines.append(f"{proc[:56]:<56} {(a or 0) / mb:>10.1f} MB {(b or 0) / mb:>10.1f} MB {growth:>13}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--config", default=str(REPO / "deploy" / "configs" / "cartpole_dqn.py"))
    ap.add_argument("--end-margin", type=float, default=15.0, help="seconds before the budget of the end sample")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rqrl-soak-"))
    budget = args.minutes * 60
    with EmbeddedRedis() as server:
        conn = connect(server.url)
        exp_name, run = "soak", "r1"
        ns = keys.namespace(exp_name, run)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        train = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "train", args.config, "--redis-url",
                                  server.url, "--name", run, "--set", f"exp_name={exp_name}",
                                  "--set", "env.stop_value=1e9", "--set", f"commander.max_wall_seconds={budget}"],
                                 cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t_launch = time.monotonic()
        try:
            last = b"0"
            while True:  # the start sample once the learner trains
                got = conn.xread({keys.events(ns): last}, block=1000) or []
                entries = [e for _, es in got for e in es]
                if entries:
                    last = entries[-1][0]
                if any(f.get(b"type") == b"learner_info" for _, f in entries):
                    break
                if train.poll() is not None or time.monotonic() - t_launch > 300:
                    raise RuntimeError(f"the run never trained (rqrl train exit {train.returncode})")
            pids = lambda: [*_tree(train.pid), server.proc.pid]  # noqa: E731 - workers restart: read each time
            start = sample(conn, ns, pids())
            # The soak's length is the benchmark's definition: nothing to wait on but time.
            time.sleep(max(0.0, budget - args.end_margin - (time.monotonic() - t_launch)))
            end = sample(conn, ns, pids())
        finally:
            train.send_signal(signal.SIGTERM)
            train.wait(timeout=120)
    text = report(start, end)
    print(text)
    return text


if __name__ == "__main__":
    main()
