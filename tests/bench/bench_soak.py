"""Soak benchmark: does a long run's footprint grow? Redis memory, keys by kind, every process's RSS.

    python -m tests.bench.bench_soak [--minutes 30] [--every 60] [--config deploy/configs/cartpole_dqn.py]
        [--set KEY=VALUE ...] [--json OUT]

Runs ``rqrl train`` against a private redis-server with a stop value it never reaches, so it
trains for ``--minutes``. From the learner's first reported train iteration to ``--end-margin``
seconds before the wall budget it samples, every ``--every`` seconds, Redis's ``used_memory``, the
keys of each kind (``SCAN``; ids in key names replaced by ``*``) and the RSS of every process of
the run (``rqrl train``, its forked coordinator and workers with their work-horses, redis-server).

It prints the series, the first and last samples side by side with the growth projected to a day
((last - first) / elapsed x 86,400 s), and the soak's two checks (issue 36), taken once the first
step-data TTL window (the config's ``policy.collect.collector.data_ttl``, seconds) has passed:
``used_memory`` and the key count flat within 10 % (the mean of the window's last five samples
against its first five; a fall beyond that, which follows the run's rates rather than a leak, is
told apart as "no growth"), and no process's RSS grown more than 5 % over the last 20 minutes. A
2-minute trial shows the table's shape; the figures that matter need the full 30 minutes.
"""

from __future__ import annotations

import argparse
import json
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
from common.config import apply_overrides, load_config
from common.connection import connect
from common.embedded_redis import EmbeddedRedis

REPO = Path(__file__).resolve().parents[2]
# A hex or numeric id inside a key name (task ids, data ids, worker names' pids): one kind.
_ID = re.compile(r"(?<=[_:/-])[0-9a-f]{6,}|(?<=[:_-])\d+(?=$|[:_-])")


def key_kind(key: str, ns: str) -> str:
    """The kind of a key: its name with the run's namespace as ``{exp}`` and ids as ``*``."""
    return _ID.sub("*", key.replace(ns, "{exp}"))


def sample(conn: Any, ns: str, pids: list[int], names: dict[int, str] | None = None) -> dict[str, Any]:
    """Redis ``used_memory``, key counts per kind, and the RSS (bytes) of each process alive in ``pids``,
    keyed ``"{pid} {command line}"``; ``names`` keeps each pid's first command line across samples
    (an rq worker retitles itself with each job: without it one process would read as several)."""
    kinds: Counter[str] = Counter(key_kind(k.decode(), ns) for k in conn.scan_iter(count=1000))
    names = {} if names is None else names
    rss = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            name = names.setdefault(pid, " ".join(p.cmdline()[:4])[:60])
            rss[f"{pid} {name}"] = p.memory_info().rss
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


MB = 2**20


def _drift(values: list[float]) -> float:
    """Relative change from the mean of the first five values to the mean of the last five."""
    k = min(5, len(values))
    first, last = sum(values[:k]) / k, sum(values[-k:]) / k
    return (last - first) / first if first else 0.0


def checks(samples: list[dict[str, Any]], ttl_s: float, rss_window_s: float = 1200.0) -> dict[str, Any]:
    """The soak's verdicts: memory and key counts after the first TTL window, RSS over the last window.

    ``samples`` are :func:`sample` results in time order, with ``t`` in seconds; the memory window
    starts ``ttl_s`` after the first sample (step data written before then may still be alive), the
    RSS window ``rss_window_s`` before the last sample. A process counts if it is in both ends of its
    window (a worker started again has a new pid). Raises ValueError with fewer than two samples in
    the memory window.
    """
    t0, t_end = samples[0]["t"], samples[-1]["t"]
    window = [s for s in samples if s["t"] >= t0 + ttl_s]
    if len(window) < 2:
        raise ValueError(f"{len(window)} sample(s) after the first TTL window of {ttl_s:.0f} s: soak longer")
    memory = _drift([s["used_memory"] for s in window])
    key_count = _drift([sum(s["keys"].values()) for s in window])
    rss_from = min((s for s in samples if s["t"] >= t_end - rss_window_s), key=lambda s: s["t"])
    rss = {proc: (samples[-1]["rss"][proc] - rss_from["rss"][proc]) / rss_from["rss"][proc]
           for proc in rss_from["rss"] if proc in samples[-1]["rss"] and rss_from["rss"][proc]}
    worst = max(rss.items(), key=lambda kv: kv[1], default=(None, 0.0))
    return {"window_s": round(t_end - window[0]["t"], 1), "used_memory_drift": round(memory, 4),
            "key_count_drift": round(key_count, 4), "memory_flat": abs(memory) <= 0.10 and abs(key_count) <= 0.10,
            # A leak grows; a fall follows the run's rates (step data and job records live one TTL
            # each, so their count is the rate of the last TTL window).
            "memory_no_growth": memory <= 0.10 and key_count <= 0.10,
            "rss_window_s": round(t_end - rss_from["t"], 1), "rss_growth": {p: round(g, 4) for p, g in rss.items()},
            "worst_rss_growth": {"process": worst[0], "growth": round(worst[1], 4)}, "rss_flat": worst[1] <= 0.05}


def series(samples: list[dict[str, Any]]) -> str:
    """One line per sample: minutes since the first, used_memory, total keys, the RSS of all processes."""
    t0 = samples[0]["t"]
    lines = [f"{'min':>6} {'used_memory MB':>15} {'keys':>8} {'RSS sum MB':>11}"]
    for s in samples:
        lines.append(f"{(s['t'] - t0) / 60:>6.1f} {s['used_memory'] / MB:>15.2f} {sum(s['keys'].values()):>8}"
                     f" {sum(s['rss'].values()) / MB:>11.1f}")
    return "\n".join(lines)


def _verdicts(c: dict[str, Any]) -> str:
    return (f"after the first TTL window ({c['window_s']:.0f} s): used_memory {c['used_memory_drift']:+.1%}, "
            f"keys {c['key_count_drift']:+.1%} -> {'flat' if c['memory_flat'] else 'NOT flat'} (goal: within 10 %), "
            f"{'no growth' if c['memory_no_growth'] else 'GROWING'} (past +10 %)\n"
            f"RSS over the last {c['rss_window_s']:.0f} s: worst {c['worst_rss_growth']['growth']:+.1%} "
            f"({c['worst_rss_growth']['process']}) -> {'met' if c['rss_flat'] else 'NOT met'} (goal: <= 5 %)")


def _soak(server: EmbeddedRedis, args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    """Run ``rqrl train`` for the budget; the samples from its first train iteration to the end margin."""
    conn = connect(server.url)
    exp_name, run = "soak", "r1"
    ns = keys.namespace(exp_name, run)
    budget = args.minutes * 60
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    train = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "train", args.config, "--redis-url",
                              server.url, "--name", run, "--set", f"exp_name={exp_name}",
                              "--set", "env.stop_value=1e9", "--set", f"commander.max_wall_seconds={budget}",
                              *[a for kv in args.set for a in ("--set", kv)]],
                             cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=open(workdir / "train.log", "wb"))
    t_launch = time.monotonic()
    try:
        last = b"0"
        while True:  # the first sample once the learner trains
            got = conn.xread({keys.events(ns): last}, block=1000) or []
            entries = [e for _, es in got for e in es]
            if entries:
                last = entries[-1][0]
            if any(f.get(b"type") == b"learner_info" for _, f in entries):
                break
            if train.poll() is not None or time.monotonic() - t_launch > 300:
                tail = (workdir / "train.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the run never trained (rqrl train exit {train.returncode}):\n{tail}")
        samples: list[dict[str, Any]] = []
        names: dict[int, str] = {}
        stop_at = t_launch + budget - args.end_margin
        while True:
            samples.append(sample(conn, ns, [*_tree(train.pid), server.proc.pid], names))  # workers restart: read each time
            print(series(samples).splitlines()[-1], flush=True)
            wait = min(args.every, stop_at - time.monotonic())
            if wait <= 0:
                return samples
            try:  # the run ending early ends the soak: its footprint after that says nothing
                train.wait(timeout=wait)
                tail = (workdir / "train.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"rqrl train exited ({train.returncode}) before the soak's budget:\n{tail}")
            except subprocess.TimeoutExpired:
                pass
    finally:
        if train.poll() is None:
            train.send_signal(signal.SIGTERM)
            train.wait(timeout=120)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples")
    ap.add_argument("--config", default=str(REPO / "deploy" / "configs" / "cartpole_dqn.py"))
    ap.add_argument("--end-margin", type=float, default=15.0, help="seconds before the budget of the last sample")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="also write the raw samples, settings and checks here")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for rqrl train (repeatable), e.g. a replay buffer that fills "
                         "within the first TTL window, so that its filling is not read as growth")
    args = ap.parse_args(argv)
    args.config = str(Path(args.config).resolve())  # rqrl train runs in the soak's own folder
    from tests.bench.run import machine

    ttl = float(apply_overrides(load_config(args.config), args.set).policy.collect.collector.data_ttl)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rqrl-soak-"))
    date, host = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), machine()
    # The commit the soak runs (a commit made while it runs is not what it measured).
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    with EmbeddedRedis() as server:
        samples = _soak(server, args, workdir)
    try:
        verdicts = checks(samples, ttl)
        said = _verdicts(verdicts)
    except ValueError as e:  # a trial shorter than the TTL window: the series and growth still say something
        verdicts, said = {"error": str(e)}, f"no verdict: {e}"
    text = "\n\n".join([series(samples), report(samples[0], samples[-1]), said])
    print(text)
    if args.json:
        raw = {"date": date, "machine": dict(host, loadavg_at_end=list(os.getloadavg())),
               "command": "python -m tests.bench.bench_soak " + " ".join(sys.argv[1:] if argv is None else argv),
               "git_commit": commit, "settings": {"minutes": args.minutes, "every_s": args.every,
                                                  "config": os.path.relpath(args.config, REPO), "data_ttl_s": ttl,
                                                  "sets": args.set},
               "checks": verdicts, "samples": samples}
        Path(args.json).write_text(json.dumps(raw, indent=2) + "\n")
    return text


if __name__ == "__main__":
    main()
