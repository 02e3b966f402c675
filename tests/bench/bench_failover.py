"""What a Redis failover costs a run: CartPole DQN through Sentinel, with and without the primary
killed (SIGKILL) right after the first eval.

    nice -n 10 python -m tests.bench.bench_failover            # 5 runs of each, alternating
    python -m tests.bench.bench_failover --runs 1 --out /tmp   # a short check

Each run gets a fresh Sentinel set (tests/fixtures/sentinel.py: one primary, one replica, three
sentinels on loopback, ``down-after-milliseconds`` 1000 as in the tests; the shipped
deploy/redis/sentinel.conf says 5000) and ``rqrl train deploy/configs/cartpole_dqn.py
--redis-url redis+sentinel://...`` with the seed of its pair. Per failover run:

* ``death_to_first_chunk_s``: from the SIGKILL to the first step-data chunk the new primary
  accepted (the first entry of the buffer stream with a later timestamp; entry ids are the
  server's milliseconds, same machine);
* ``death_to_promotion_s``: from the SIGKILL until all three sentinels name the new primary
  (polled every 50 ms);
* ``env_steps_lost``: env steps of chunks the old primary had accepted and the replica never
  got: the primary's env-step counter read just before the SIGKILL minus the replica's just after
  (a lower bound: writes in the ~1 ms between the read and the kill are not seen), and the
  replication bytes behind (``master_repl_offset`` minus the replica's offset);
* the run's wall time (launch to exit, and split at summary.json's writing: the run, then the
  teardown), env steps and train iterations, as for the run without.

Writes ``<out>/<UTC time>-failover.json`` with every run's figures and their spread
(tests/bench/stats.py); docs/performance.md ("Redis failover") quotes it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


from common import keys, streams
from common.connection import connect
from tests.bench.stats import spread
from tests.fixtures.sentinel import SentinelSet, stop_launcher

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _counter(client: Any, key: str) -> int:
    return int(client.get(key) or 0)


def one_run(seed: int, failover: bool, workdir: Path) -> dict[str, Any]:
    """One ``rqrl train`` through a fresh Sentinel set; with ``failover`` the primary is killed
    after the first eval. Returns the run's figures (module docstring)."""
    name, exp = f"fo{int(failover)}s{seed}", ""
    out: dict[str, Any] = {"seed": seed, "failover": failover}
    with SentinelSet() as s:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                   PYTHONUNBUFFERED="1")
        env.pop("RQRL_REDIS_URL", None)
        t0, launched = time.monotonic(), time.time()
        proc = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", s.url,
                                 "--name", "r", "--seed", str(seed), "--set", f"exp_name={name}",
                                 "--set", "commander.max_wall_seconds=300"], cwd=workdir, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        exp = f"{name}/r"
        try:
            if failover:
                conn = connect(s.url)
                last, seen = b"0", False
                while not seen and proc.poll() is None:  # the first eval's result
                    for _, entries in conn.xread({keys.events(exp): last}, block=500) or []:
                        for eid, raw in entries:
                            last = eid
                            ev = streams.decode_fields(raw)
                            seen = seen or (ev.get("type") == "finished" and bool(ev.get("eval_flag")))
                if proc.poll() is not None:
                    raise RuntimeError(f"run {exp} ended before its first eval (exit {proc.returncode})")
                old = s.primary_port()
                primary, replica = s.client(old), s.client(s.replica.port)
                offset = int(primary.info("replication")["master_repl_offset"])
                before = _counter(primary, keys.envstep(exp))
                killed_at = time.time()
                s.kill_primary()
                after = _counter(replica, keys.envstep(exp))
                behind = offset - int(replica.info("replication")["slave_repl_offset"])
                new = s.wait_failover(old)
                promoted = time.time() - killed_at
                out.update(env_steps_lost=max(0, before - after), repl_bytes_behind=max(0, behind),
                           death_to_promotion_s=round(promoted, 3))
            proc.wait(timeout=600)
            out["wall_s"] = round(time.monotonic() - t0, 2)
            out["exit_code"] = proc.returncode
            summary_path = workdir / name / "r" / "summary.json"
            summary = json.loads(summary_path.read_text())
            # Where the time went: the run (launch to summary.json) and the teardown after it.
            out["launch_to_summary_s"] = round(summary_path.stat().st_mtime - launched, 2)
            out["summary_to_exit_s"] = round(out["wall_s"] - out["launch_to_summary_s"], 2)
            out.update(envstep=summary.get("envstep"), train_iter=summary.get("train_iter"),
                       run_wall_seconds=summary.get("wall_seconds"), redis_failovers=summary.get("redis_failovers", 0),
                       learner_redelivered=summary.get("learner_redelivered"))
            if failover:
                stream = keys.buffer_meta(exp, summary["buffer_id"])
                after_kill = s.client(new).xrange(stream, min=str(int(killed_at * 1000) + 1), max="+", count=1)
                out["death_to_first_chunk_s"] = (round(int(after_kill[0][0].decode().split("-")[0]) / 1000 - killed_at, 3)
                                                 if after_kill else None)
        finally:
            stop_launcher(proc)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs with and without the failover (seeds 0..runs-1)")
    ap.add_argument("--out", default=str(REPO / "docs" / "bench"))
    args = ap.parse_args(argv)
    from tests.bench.run import machine  # noqa: PLC0415 (heavy imports only when run)

    started = dt.datetime.now(dt.timezone.utc)
    raw: dict[str, Any] = {"date": started.isoformat(timespec="seconds"), "machine": machine(),
                           "command": "python -m tests.bench.bench_failover " + " ".join(argv or sys.argv[1:]),
                           "commit": subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO,
                                                    capture_output=True, text=True).stdout.strip(),
                           "runs": []}
    with tempfile.TemporaryDirectory(prefix="rqrl-bench-failover-") as tmp:
        for seed in range(args.runs):
            for failover in (False, True):  # alternating, so load drifts hit both alike
                print(f"== seed {seed}, failover {failover}", flush=True)
                r = one_run(seed, failover, Path(tmp))
                print(json.dumps(r), flush=True)
                raw["runs"].append(r)
    runs = raw["runs"]
    plain = [r for r in runs if not r["failover"]]
    hit = [r for r in runs if r["failover"]]
    raw["summary"] = {
        "wall_s_no_failover": spread([r["wall_s"] for r in plain], 2),
        "wall_s_failover": spread([r["wall_s"] for r in hit], 2),
        "wall_s_extra_per_pair": spread([b["wall_s"] - a["wall_s"] for a, b in zip(plain, hit)], 2),
        "death_to_promotion_s": spread([r["death_to_promotion_s"] for r in hit]),
        "death_to_first_chunk_s": spread([r["death_to_first_chunk_s"] for r in hit]),
        "env_steps_lost": spread([r["env_steps_lost"] for r in hit], 0),
        "repl_bytes_behind": spread([r["repl_bytes_behind"] for r in hit], 0),
        "envstep_no_failover": spread([r["envstep"] for r in plain], 0),
        "envstep_failover": spread([r["envstep"] for r in hit], 0),
        "all_converged": all(r["exit_code"] == 0 for r in runs),
    }
    raw["machine"]["loadavg_at_end"] = list(os.getloadavg())
    path = Path(args.out) / f"{started.strftime('%Y-%m-%dT%H%M%SZ')}-failover.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(raw, indent=1) + "\n")
    print(json.dumps(raw["summary"], indent=1))
    print(f"raw output: {path}")
    return 0 if raw["summary"]["all_converged"] else 1


if __name__ == "__main__":
    sys.exit(main())
