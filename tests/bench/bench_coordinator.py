"""Coordinator scale: one real coordinator and one Redis against simulated collectors.

    python -m tests.bench.bench_coordinator [--sims 8 64 256 1000] [--seconds 10] [--burst 50000]

Each simulated collector is a thread with its own connection, registered in RQ's worker
registry like an ``rq worker collector`` (the coordinator sizes its collector task space from
the live workers, with no cap and no eval slot here): it pops a task from
``rq:queue:collector`` (BLPOP), sets the task's heartbeat, reports ``started``, "works" for
``--task-seconds``, reports ``finished`` with a full finish info, and pops again. A simulated
learner reports ``learner_info`` 20 times a second. Figures:

* dispatch latency: from a simulated collector's ``finished`` XADD to the replacement task
  popped from the queue by that (then only idle) collector — p50 / p99, milliseconds;
* steady events/s sent by the simulators and handled by the coordinator over the window:
  handled = the coordinator group's ``entries-read`` minus its pending entries (XINFO GROUPS;
  the coordinator acks each batch with the state it produced), so an event counts once acked;
* backlog: events not yet acked (the group's ``lag`` plus pending) at the window's start and
  end. The loop is closed (a simulator sends again only once it got a task), so a coordinator
  that cannot keep up shows as simulators sending under 90 % of what instant dispatch would
  give (``offered``: 2 events per task-second per simulator, plus the learner's 20/s) or as a
  growing backlog: either is reported as saturated;
* Redis CPU share (``INFO cpu`` delta / wall) and the coordinator's (``/proc/{pid}/stat``), and
  the coordinator's CPU time per handled event (all its work: dispatch, events, liveness, logs);
* events/s at saturation: the largest simulation once more with tasks of 0 s, so simulators
  report and ask again as fast as the coordinator dispatches (row ``mode: saturation``);
* burst events/s: once the backlog is drained, ``--burst`` learner_info events XADDed at
  once, and the time until the coordinator has acked them all (stream ids compared as
  (ms, seq) integers). A drain or burst that does not finish within ``--timeout`` seconds
  fails the benchmark (:class:`BenchTimeout`) instead of reporting a rate.

* the long-task model (``--long-sims``): collector tasks last ``--long-task-seconds`` (rqrl's tasks
  run for up to a minute, their envs kept on the worker) and, while a task works, each simulator
  reads ``rqrl:{exp}:collect_setting`` every ``--chunk-seconds`` as the chunk script does; the
  learner's reports move the env steps so the setting (epsilon) changes with every report. Rows
  (mode ``long tasks``) add the setting's propagation p50 / p99: from the coordinator's write (the
  ``ts`` it stores) to the first read that saw it.

Needs Redis >= 7.0 (``entries-read`` / ``lag`` in XINFO GROUPS).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rq import Worker

from common import events, keys
from common.connection import connect
from common.embedded_redis import EmbeddedRedis, find_redis_server

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
EXP = "bench_coord/b"  # the run's key namespace: exp_name bench_coord, run name b


def _finish_info(i: int) -> dict:
    return {"real_episode_count": 40, "env_steps": 1000, "avg_time_per_episode": 0.1, "avg_step_per_episode": 25.0,
            "avg_time_per_step": 0.0004, "reward_mean": 25.0, "reward_std": 5.0, "train_iter": i, "policy_version": i,
            "eval_flag": False,
            "duration": 1.0, "buffer_id": "sim"}


class BenchTimeout(RuntimeError):
    """The coordinator did not catch up within the benchmark's timeout: no rate is reported."""


def stream_id(raw: bytes | str) -> tuple[int, int]:
    """A stream id as (ms, seq) integers, so ids compare numerically (b"9-0" < b"10-0")."""
    ms, _, seq = (raw.decode() if isinstance(raw, bytes) else raw).partition("-")
    return int(ms), int(seq or 0)


def group_state(conn, stream: str) -> dict:
    """The coordinator group's ``handled`` (entries read and acked), ``backlog`` (lag + pending) and
    ``last_delivered`` id; raises when the server is older than Redis 7.0."""
    g = next(g for g in conn.xinfo_groups(stream) if g["name"] == keys.COORDINATOR_GROUP.encode())
    if g.get("entries-read") is None or g.get("lag") is None:
        raise RuntimeError("the coordinator benchmark needs Redis >= 7.0 (XINFO GROUPS entries-read / lag)")
    return {"handled": int(g["entries-read"]) - int(g["pending"]), "backlog": int(g["lag"]) + int(g["pending"]),
            "last_delivered": stream_id(g["last-delivered-id"]), "pending": int(g["pending"])}


def redis7_server() -> str:
    """A redis-server binary of version >= 7.0: ``find_redis_server()`` or a system one.

    Raises:
        RuntimeError: none found (names the ones tried).
    """
    tried = []
    for exe in (find_redis_server(), shutil.which("redis-server", path="/usr/local/bin:/usr/bin")):
        if not exe:
            continue
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20).stdout
        version = next((w[2:] for w in out.split() if w.startswith("v=")), "0")
        tried.append(f"{exe} ({version})")
        if int(version.split(".")[0]) >= 7:
            return exe
    raise RuntimeError(f"the coordinator benchmark needs redis-server >= 7.0; found {', '.join(tried) or 'none'}")


def _cpu(conn) -> float:
    info = conn.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_scale(n_sims: int, seconds: float, task_seconds: float, burst: int, timeout: float = 120.0,
              profile: str | None = None, chunk_seconds: float = 0.0) -> dict:
    """One simulation of ``n_sims`` collectors (see module docstring); ``task_seconds`` 0 is the
    saturation run. ``profile``: write the coordinator's cProfile statistics to this file (it
    slows the coordinator: figures of a profiled run are not comparable). ``chunk_seconds`` > 0:
    while a task works, each simulator reads ``rqrl:{exp}:collect_setting`` every that many
    seconds, as a collector's chunk script does, and records how long each new setting took to
    reach it (the coordinator's write time in the setting to the read that first saw it)."""
    os.environ["RQRL_REDIS_SERVER"] = redis7_server()  # read by EmbeddedRedis
    server = EmbeddedRedis().start()
    url = server.url
    conn = connect(url)
    workdir = tempfile.mkdtemp(prefix="rqrl-bench-coord-")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    profiler = ["-m", "cProfile", "-o", str(Path(profile).resolve())] if profile else []
    coord = subprocess.Popen([sys.executable, *profiler, "-m", "coordinator", CONFIG, "--redis-url", url,
                              "--set", "exp_name=bench_coord", "--run-name", "b", "--set", "commander.eval_task_space=0",
                              "--set", "commander.eval_interval=0.0", "--set", "commander.eval_every_train_iter=0",
                              "--set", "commander.heartbeat_timeout=60.0", "--set", "env.stop_value=1e9",
                              "--set", "policy.other.eps.decay=1000000000000",
                              "--set", f"commander.max_wall_seconds={seconds + 120}"],
                             cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    latencies: list[float] = []
    propagation: list[float] = []
    counts = {"events": 0}
    lock = threading.Lock()

    def learner() -> None:
        c = connect(url)
        _, job = c.blpop([f"rq:queue:{keys.LEARNER_QUEUE}"], timeout=60)
        tid = job.decode()
        c.set(keys.heartbeat(EXP, tid), "sim", px=600_000)
        events.emit(c, EXP, "started", tid, "learner")
        it = 0
        while not stop.wait(0.05):
            it += 10
            # Env steps well ahead of the finished tasks' count, so the collect setting (epsilon of
            # the env steps, decaying over 1e12 of them here) changes with every report.
            events.emit(c, EXP, "learner_info", tid, "learner", train_iter=it, consumed_env_steps=it * 1000)
            with lock:
                counts["events"] += 1

    def collector(i: int) -> None:
        c = connect(url)
        # In RQ's worker registry, as an `rq worker collector` (its key lives while the bench runs).
        Worker([keys.COLLECTOR_QUEUE], name=f"bench-sim-{i}", connection=c).register_birth()
        finished_at = None
        while not stop.is_set():
            got = c.blpop([f"rq:queue:{keys.COLLECTOR_QUEUE}"], timeout=1)
            if got is None:
                continue
            if finished_at is not None:
                with lock:
                    latencies.append(time.perf_counter() - finished_at)
            tid = got[1].decode()
            pipe = c.pipeline(transaction=False)
            pipe.set(keys.heartbeat(EXP, tid), "sim", px=600_000)
            pipe.execute()
            events.emit(c, EXP, "started", tid, "collector")
            if chunk_seconds > 0:
                seen = None
                end = time.time() + task_seconds
                while time.time() < end:
                    raw = c.get(keys.collect_setting(EXP))
                    if raw is not None and raw != seen:
                        if seen is not None:  # the first read of a task may find an old setting
                            with lock:
                                propagation.append(time.time() - json.loads(raw)["ts"])
                        seen = raw
                    if stop.wait(chunk_seconds):
                        return
            elif stop.wait(task_seconds):
                return
            finished_at = time.perf_counter()
            events.emit(c, EXP, "finished", tid, "collector", **_finish_info(0))
            with lock:
                counts["events"] += 2

    threads = [threading.Thread(target=learner, daemon=True)] + \
              [threading.Thread(target=collector, args=(i,), daemon=True) for i in range(n_sims)]
    for t in threads:
        t.start()
    stream = keys.events(EXP)
    try:
        # Coordinator start-up, the simulators' registration (~2 ms each) and the first wave.
        time.sleep(3 + task_seconds + n_sims / 500)
        with lock:
            latencies.clear()
            propagation.clear()
            e0 = counts["events"]
        g0, cpu0, t0 = group_state(conn, stream), _cpu(conn), time.perf_counter()
        ccpu0 = _proc_cpu(coord.pid)
        time.sleep(seconds)
        wall = time.perf_counter() - t0
        g1 = group_state(conn, stream)
        coord_cpu = _proc_cpu(coord.pid) - ccpu0
        with lock:
            sent = (counts["events"] - e0) / wall
            lat = sorted(latencies)
            prop = sorted(propagation)
        redis_cpu = (_cpu(conn) - cpu0) / wall
        stop.set()
        handled = (g1["handled"] - g0["handled"]) / wall
        # The loop is closed (a simulator sends its next events only once it got a task), so a slow
        # coordinator shows first as simulators sending less than they would with instant
        # dispatch, then as a growing backlog. Either one is saturation; tasks of 0 s saturate.
        offered = 2 * n_sims / task_seconds + 20 if task_seconds > 0 else None
        saturated = offered is None or sent < 0.9 * offered or g1["backlog"] - g0["backlog"] > max(10, 0.05 * sent)
        # Drain what the simulators left, then the burst: learner_info events far faster than any
        # real learner sends them.
        td = time.perf_counter()
        while group_state(conn, stream)["backlog"] > 0:
            if time.perf_counter() - td > timeout:
                raise BenchTimeout(f"{n_sims} sims: backlog of {group_state(conn, stream)['backlog']} events "
                                   f"not drained within {timeout:g} s")
            time.sleep(0.05)
        drain_s = time.perf_counter() - td
        tid = next((k.decode() for k in conn.hkeys(keys.tasks(EXP)) if k.startswith(b"learner")), "learner_task_x")
        pipe = conn.pipeline(transaction=False)
        for i in range(burst):
            pipe.xadd(stream, {"type": "learner_info", "task_id": tid, "task_type": "learner", "ts": "0",
                               "train_iter": str(i), "consumed_env_steps": str(i)})
        tb = time.perf_counter()
        ids = pipe.execute()
        last = stream_id(ids[-1])
        while True:
            g = group_state(conn, stream)
            if g["last_delivered"] >= last and g["pending"] == 0:
                break
            if time.perf_counter() - tb > timeout:
                raise BenchTimeout(f"{n_sims} sims: burst of {burst} events not acked within {timeout:g} s "
                                   f"(backlog {g['backlog']})")
            time.sleep(0.01)
        burst_rate = burst / (time.perf_counter() - tb)
    finally:
        stop.set()
        coord.terminate()
        try:
            coord.wait(timeout=20)
        except subprocess.TimeoutExpired:
            coord.kill()
        server.stop()

    def pct(p: float, xs: list[float] = lat) -> float | None:
        return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 2) if xs else None

    mode = "long tasks" if chunk_seconds > 0 else "curve" if task_seconds > 0 else "saturation"
    return {"sims": n_sims, "mode": mode, "task_seconds": task_seconds,
            "window_s": round(wall, 2), "offered_events_per_s": None if offered is None else round(offered, 1),
            "sent_events_per_s": round(sent, 1),
            "handled_events_per_s": round(handled, 1), "backlog_start": g0["backlog"], "backlog_end": g1["backlog"],
            "saturated": bool(saturated), "drain_s": round(drain_s, 2), "dispatches": len(lat),
            "dispatch_p50_ms": pct(0.5), "dispatch_p99_ms": pct(0.99), "redis_cpu_share": round(redis_cpu, 3),
            "coordinator_cpu_share": round(coord_cpu / wall, 3),
            "coordinator_cpu_us_per_event": round(1e6 * coord_cpu / max(1.0, handled * wall), 1),
            "burst_events": burst, "burst_events_per_s": round(burst_rate),
            **({"chunk_seconds": chunk_seconds, "settings_seen": len(prop), "setting_propagation_p50_ms": pct(0.5, prop),
                "setting_propagation_p99_ms": pct(0.99, prop)} if chunk_seconds > 0 else {})}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sims", type=int, nargs="+", default=[8, 64, 256, 1000])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--task-seconds", type=float, default=1.0)
    ap.add_argument("--long-sims", type=int, nargs="*", default=[],
                    help="also run these many simulators on the long-task model: tasks of --long-task-seconds, the "
                         "collect setting read every --chunk-seconds while a task works (rows with mode 'long tasks')")
    ap.add_argument("--long-task-seconds", type=float, default=30.0)
    ap.add_argument("--long-window", type=float, default=30.0, help="seconds measured in a long-task run")
    ap.add_argument("--chunk-seconds", type=float, default=0.1)
    ap.add_argument("--burst", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds to drain or ack a burst before failing")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-saturation", action="store_true",
                    help="skip the saturation run (the largest simulation with tasks of 0 s)")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="run the coordinator under cProfile, statistics in DIR/coordinator-{sims}.prof")
    args = ap.parse_args(argv)
    rows = []
    for n in args.sims:
        for _ in range(args.repeats):
            prof = str(Path(args.profile) / f"coordinator-{n}.prof") if args.profile else None
            r = run_scale(n, args.seconds, args.task_seconds, args.burst, args.timeout, prof)
            rows.append(r)
            print(json.dumps(r), flush=True)
    for n in args.long_sims:
        r = run_scale(n, args.long_window, args.long_task_seconds, args.burst, args.timeout,
                      chunk_seconds=args.chunk_seconds)
        rows.append(r)
        print(json.dumps(r), flush=True)
    for _ in range(0 if args.no_saturation else args.repeats):
        r = run_scale(max(args.sims), args.seconds, 0.0, args.burst, args.timeout)
        rows.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
