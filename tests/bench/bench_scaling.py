"""Scaling curve: env steps/s of real ``rqrl train`` runs against the number of collector workers.

    python -m tests.bench.bench_scaling [--workers 1 2 4 8 16 32 64] [--steps-per-worker 4000]
        [--env slow|cartpole|pong] [--rate-from episodes|learner] [--set KEY=VALUE ...]
        [--json OUT] [--markdown OUT]

Each point is a fresh ``rqrl train --collectors N`` (coordinator, N collector ``rq worker``
processes, one learner) on a private Redis this benchmark starts (so it can read ``INFO cpu`` and
the events stream), DQN with a small net, ``env.stop_value`` out of reach and
``commander.max_env_step`` = N x ``--steps-per-worker``, so a run ends at its budget (exit 2).
No evals run. The replay-ratio limiter's lead is out of reach, so collectors never wait for the
learner unless it falls that far behind (their ``limiter_wait_s`` is reported).

Envs (``--env``): ``slow`` is ``rqrl/SlowCartPole-v1`` (tests/bench/slow_envs.py: each step
sleeps 5 ms, as a remote simulator; many workers fit on 2 cores), ``cartpole`` the CPU-bound
CartPole-v1, ``pong`` ALE Pong with ``deploy/configs/pong_dqn.py`` (the ``atari`` extra).

Rates come from the run's own records, never from this process's clock around the launch:
env steps/s collected = the cumulative episode lengths of ``episodes.jsonl`` against the
coordinator's receipt times, between the records at 10 % and 90 % of the run's env steps (the
start-up and the stop are outside); env steps/s consumed = the learner's ``consumed_env_steps``
in its ``learner_info`` events over the same fractions. The curve's rate is the first, or the
second with ``--rate-from learner`` (envs whose episodes outlast a point, as Pong's); the CPU
window is that rate's. Efficiency = rate(N) / (N x rate(1)).
Over the same window: the CPU share (of one core) of the coordinator, the learner (its
work-horse included), all collector workers together and per worker, the launcher, and Redis
(``INFO cpu``); the collectors' own CPU per env step; and each collector worker's PSS and RSS
(``/proc``), which decides whether the next point fits in memory. Where efficiency falls below
0.9 the record says which of these binds (:func:`what_binds`). Before the curve, the points'
vector env alone in this process (:func:`env_alone`): its CPU per env step, what a collector
pays before any work of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

from common import events, keys
from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from tests.bench.bench_episodes import _until_tasks_end
from tests.bench.bench_start import wait_teardown

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "configs" / "cartpole_dqn.py"
EXP = "bench_scaling"
EXIT_BUDGET = 2  # rqrl train's exit code for a run that ended at its budget
EFFICIENCY_GOAL = 0.9
STEADY = (0.1, 0.9)  # fractions of the run's env steps between which rates are taken
SAMPLE_EVERY_S = 0.5
# The learner is kept light (a small net, a low replay ratio) so that the curve is the
# collectors'; the limiter's lead is out of reach so collectors do not wait on it.
COMMON_SETS = [
    "env.stop_value=1e9", "commander.eval_every_train_iter=0", "commander.eval_interval=0.0",
    "commander.eval_task_space=0", "commander.closing_eval_timeout=0.0", "commander.max_wall_seconds=900.0",
    "commander.confirm_eval_episodes=0", "policy.learn.train_iter_per_env_step=0.02",
    "policy.learn.max_env_step_lead=100000000", "policy.learn.batch_size=32",
    "policy.learn.learner.send_info_freq=2",
]
ENVS: dict[str, tuple[Path, list[str]]] = {
    "slow": (CONFIG, ["env.import_names=['tests.bench.slow_envs']", "env.env_id='rqrl/SlowCartPole-v1'",
                      "env.collector_env_num=8", "policy.model.hidden_size_list=[64,64]"]),
    "cartpole": (CONFIG, ["env.collector_env_num=8", "policy.model.hidden_size_list=[64,64]"]),
    "pong": (REPO / "deploy" / "configs" / "pong_dqn.py", ["policy.other.replay_buffer.replay_start_size=500"]),
}


def efficiency(rates: dict[int, float]) -> dict[int, Optional[float]]:
    """``rate(N) / (N x rate(1))`` for each N of ``rates`` (env steps/s by collector workers);
    None for every N when rate(1) is missing or not positive."""
    base = rates.get(1)
    return {n: (round(r / (n * base), 3) if base and base > 0 else None) for n, r in rates.items()}


def steady_rate(points: list[tuple[float, float]], lo: float = STEADY[0], hi: float = STEADY[1]) -> Optional[float]:
    """Units per second between the first point at or past ``lo`` of the last point's count and
    the last point at or below ``hi`` of it (``points``: (unix seconds, cumulative count), in
    time order); None when fewer than two points fall in that window or no time passed."""
    if not points:
        return None
    total = points[-1][1]
    inside = [(t, c) for t, c in points if lo * total <= c <= hi * total]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    (t0, c0), (t1, c1) = inside[0], inside[-1]
    return (c1 - c0) / (t1 - t0)


def window(points: list[tuple[float, float]], lo: float = STEADY[0], hi: float = STEADY[1]) -> Optional[tuple[float, float]]:
    """The unix seconds (start, end) of the window :func:`steady_rate` uses, or None."""
    total = points[-1][1] if points else 0
    inside = [t for t, c in points if lo * total <= c <= hi * total]
    return (inside[0], inside[-1]) if len(inside) >= 2 and inside[-1] > inside[0] else None


def episode_points(path: Path) -> list[tuple[float, float]]:
    """(coordinator receipt time, cumulative env steps of finished training episodes) from a
    run's ``episodes.jsonl``, one point per receipt time."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    rows.sort(key=lambda r: float(r["time"]))
    points: list[tuple[float, float]] = []
    total = 0
    for r in rows:
        total += int(r["length"])
        if points and points[-1][0] == float(r["time"]):
            points[-1] = (points[-1][0], total)
        else:
            points.append((float(r["time"]), total))
    return points


def role(title: str) -> str:
    """A ``rqrl train`` child's role from its process title: ``rqrl {name} {run}`` as the launcher
    names it, or ``rq:worker:{exp}-{name}{i}-{pid}: ...`` once RQ renamed it; ``other`` if neither."""
    m = re.match(r"rqrl (coordinator|learner|collector)\d* ", title) or re.match(
        r"rq:worker:.*-(learner|collector)\d*-\d+(?:-r\d+)?:", title)
    return m.group(1) if m else "other"


def what_binds(rec: dict[str, Any], cores: int) -> str:
    """One line on what limits a point (``rec`` as :func:`run_point` returns it): the machine's
    cores when they are nearly all busy (the whole machine's share, else the processes' sum), else the busiest single process
    when it is near one core, else the collectors' waits on the limiter, else the env's own time."""
    shares = rec.get("cpu_share") or {}
    cpu = {k: v for k, v in shares.items() if k not in ("per_collector", "machine") and v is not None}
    total = shares.get("machine") or sum(cpu.values())
    singles = {k: v for k, v in cpu.items() if k in ("coordinator", "learner", "redis", "launcher") and v is not None}
    busiest = max(singles, key=singles.get) if singles else None
    if total >= 0.9 * cores:
        top = ", ".join(f"{k} {v:.2f}" for k, v in sorted(cpu.items(), key=lambda kv: -(kv[1] or 0)))
        return f"the CPU: {total:.2f} of {cores} cores busy ({top})"
    if busiest is not None and singles[busiest] >= 0.9:
        return f"the {busiest}: {singles[busiest]:.2f} of one core, the other processes {total - singles[busiest]:.2f}"
    if (rec.get("limiter_wait_share") or 0) > 0.05:
        return f"the replay-ratio limiter: collectors waited {rec['limiter_wait_share']:.0%} of their time"
    return f"none measured: {total:.2f} of {cores} cores busy, no process near one core, collectors rarely waiting"


class ProcSampler:
    """Samples, every ``every`` seconds, the CPU seconds of the launcher and its descendants
    (by role: the launcher's direct child each descends from) and of Redis (``INFO cpu``).

    Args:
        root: the ``rqrl train`` process id.
        conn: a connection to the run's Redis.
        every: seconds between samples.
    """

    def __init__(self, root: int, conn: Any, every: float = SAMPLE_EVERY_S) -> None:
        self.root, self.conn, self.every = root, conn, every
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.memory: dict[int, tuple[int, int]] = {}  # collector worker pid -> (PSS, RSS) bytes, latest
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> "ProcSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append(self.sample())
            except Exception as e:  # a sample lost to a process that just exited, or Redis going down
                print(f"bench_scaling: a CPU sample failed ({type(e).__name__}: {e})", file=sys.stderr)
            self._stop.wait(self.every)

    def _tree(self) -> dict[int, tuple[int, str, float]]:
        """pid -> (parent pid, command line, CPU seconds) of the launcher and its descendants
        (``/proc/{pid}/task/*/children``: no scan of every process on a loaded machine)."""
        out: dict[int, tuple[int, str, float]] = {}
        todo = [(self.root, 0)]
        while todo:
            pid, ppid = todo.pop()
            d = Path(f"/proc/{pid}")
            try:
                stat = (d / "stat").read_text().rpartition(")")[2].split()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                threads = list((d / "task").iterdir())
            except OSError:
                continue  # it exited meanwhile
            out[pid] = (ppid, cmd, (int(stat[11]) + int(stat[12])) / self._tick)
            for t in threads:
                try:
                    todo.extend((int(k), pid) for k in (t / "children").read_text().split())
                except OSError:
                    pass  # a thread that ended meanwhile: its process's other threads still count
        return out

    def _machine(self) -> float:
        """CPU seconds the whole machine has been busy (``/proc/stat``: all but idle and iowait)."""
        ticks = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return (sum(ticks) - ticks[3] - ticks[4]) / self._tick

    def sample(self) -> tuple[float, dict[str, float]]:
        """(unix seconds, CPU seconds so far by role: ``launcher``, ``coordinator``, ``learner``,
        ``redis``, each collector worker as ``collector:{pid}``, and the whole ``machine``). The
        time and the machine's figure are the means of readings before and after the others."""
        t_a, m_a = time.time(), self._machine()
        tree = self._tree()
        role_of: dict[int, str] = {self.root: "launcher"}
        for pid, (ppid, cmd, _) in sorted(tree.items()):
            if ppid == self.root:
                name = role(cmd)
                role_of[pid] = f"collector:{pid}" if name == "collector" else name
        for pid, (ppid, _, _) in sorted(tree.items()):  # grandchildren (the learner's work-horse)
            if pid not in role_of and ppid in role_of and role_of[ppid] != "launcher":
                role_of[pid] = role_of[ppid]
        out: dict[str, float] = {}
        for pid, name in role_of.items():
            if pid in tree:
                out[name] = out.get(name, 0.0) + tree[pid][2]
                if name.startswith("collector:") and tree[pid][0] == self.root:
                    self.memory[pid] = _memory(pid)
        info = self.conn.info("cpu")
        out["redis"] = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        out["machine"] = (m_a + self._machine()) / 2
        return (t_a + time.time()) / 2, out

    def shares(self, t0: float, t1: float) -> dict[str, Any]:
        """CPU share of one core by role over [t0, t1] (the samples nearest inside it), collector
        workers summed (``collectors``) and their median (``per_collector``), the whole machine's
        (``machine``) and what processes outside the run used (``outside_run``: the machine's less
        the run's)."""
        # Samples that found the launcher's children (one taken as the run ends may not).
        inside = [s for s in self.samples if t0 <= s[0] <= t1 and any(k.startswith("collector:") for k in s[1])]
        if len(inside) < 2:
            return {}
        (a_t, a), (b_t, b) = inside[0], inside[-1]
        dt = b_t - a_t
        each = {k: (b[k] - a.get(k, 0.0)) / dt for k in b if k in a}
        workers = sorted(v for k, v in each.items() if k.startswith("collector:"))
        out = {k: round(v, 3) for k, v in each.items() if not k.startswith("collector:")}
        out["collectors"] = round(sum(workers), 3)
        out["outside_run"] = round(out["machine"] - sum(v for k, v in each.items() if k != "machine"), 3)
        out["per_collector"] = round(workers[len(workers) // 2], 4) if workers else None
        return out


def _memory(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of process ``pid`` in bytes (``/proc/{pid}/smaps_rollup``); (0, 0) once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    kb = {ln.split(":")[0]: int(ln.split()[1]) for ln in text.splitlines() if ln.split(":")[0] in ("Pss", "Rss")}
    return kb.get("Pss", 0) * 1024, kb.get("Rss", 0) * 1024


def _collector_figures(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """From the collectors' ``finished`` training events: their tasks, CPU seconds per env step
    (microseconds) and the share of their time spent waiting on the replay-ratio limiter."""
    done = [e for e in evs if e["type"] == "finished" and e.get("task_type") == "collector" and not e.get("eval_flag")]
    steps = sum(int(e.get("env_steps") or 0) for e in done)
    seconds = sum(float(e.get("duration") or 0) for e in done)
    return {"collector_tasks": len(done),
            "collector_cpu_us_per_env_step": round(sum(float(e.get("cpu_s") or 0) for e in done) / steps * 1e6, 1)
            if steps else None,
            "limiter_wait_share": round(sum(float(e.get("limiter_wait_s") or 0) for e in done) / seconds, 4)
            if seconds else None}


def _learner_points(evs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(report time, env steps the learner had consumed) from its ``learner_info`` events."""
    return [(float(e["ts"]), float(events.consumed_env_steps(e))) for e in evs if e["type"] == "learner_info"]


def _launch(n: int, steps_per_worker: int, env_name: str, sets: list[str], workdir: Path, url: str) -> subprocess.Popen:
    """Start ``rqrl train`` for point ``n`` (output in ``workdir/train.log``)."""
    config, env_sets = ENVS[env_name]
    budget = [f"commander.max_env_step={n * steps_per_worker}", f"exp_name={EXP}"]
    argv = [sys.executable, "-m", "coordinator.cli", "train", str(config), "--redis-url", url, "--collectors", str(n),
            "--name", f"n{n}", *[f"--set={s}" for s in [*COMMON_SETS, *env_sets, *budget, *sets]]]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    log = open(workdir / "train.log", "w")
    try:
        return subprocess.Popen(argv, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def run_point(n: int, steps_per_worker: int, env_name: str, sets: list[str], rate_from: str = "episodes",
              timeout: float = 900.0) -> dict[str, Any]:
    """One ``rqrl train`` with ``n`` collector workers to ``n * steps_per_worker`` env steps, on a
    private Redis; its figures (module docstring, :func:`_figures`). Raises RuntimeError when the run did not end
    at its budget (the end of its output attached)."""
    load = round(os.getloadavg()[0], 2)
    server = EmbeddedRedis().start()
    workdir = Path(tempfile.mkdtemp(prefix=f"rqrl-bench-scaling-n{n}-"))
    run_dir = workdir / EXP / f"n{n}"
    try:
        conn = connect(server.url)
        proc = _launch(n, steps_per_worker, env_name, sets, workdir, server.url)
        with ProcSampler(proc.pid, connect(server.url)) as sampler:
            code = proc.wait(timeout=timeout)
        if code != EXIT_BUDGET:
            tail = (workdir / "train.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"n={n}: rqrl train exited {code}, not {EXIT_BUDGET} (its budget): {tail}")
        evs = _until_tasks_end(conn, keys.events(keys.namespace(EXP, f"n{n}")))
        wait_teardown(run_dir)
    finally:
        server.stop()
    return {"workers": n, "env": env_name, "loadavg_at_start": load, "env_step_budget": n * steps_per_worker,
            **_figures(run_dir, evs, sampler, rate_from)}


def _figures(run_dir: Path, evs: list[dict[str, Any]], sampler: ProcSampler, rate_from: str) -> dict[str, Any]:
    """A finished point's figures from its run folder, its events and the CPU samples; the
    steady window (and so ``env_steps_per_s`` and the CPU shares) comes from ``rate_from``:
    ``episodes`` (episodes.jsonl) or ``learner`` (its consumed env steps)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    points = {"episodes": episode_points(run_dir / "episodes.jsonl"), "learner": _learner_points(evs)}
    win = window(points[rate_from])
    rec: dict[str, Any] = {
        "rate_from": rate_from, "envstep": summary.get("envstep"), "env_steps_per_s": _round(steady_rate(points[rate_from])),
        "collected_env_steps_per_s": _round(steady_rate(points["episodes"])),
        "consumed_env_steps_per_s": _round(steady_rate(points["learner"])),
        "window_s": round(win[1] - win[0], 2) if win else None, "wall_s": summary.get("wall_seconds"),
        "learner_wait_share": summary.get("learner_wait_share"), "train_iter": summary.get("train_iter"),
        "cpu_share": sampler.shares(*win) if win else {}, **_collector_figures(evs)}
    busy = rec["cpu_share"].get("collectors")
    if busy is not None and rec["env_steps_per_s"]:
        rec["collectors_cpu_us_per_env_step_window"] = round(busy / rec["env_steps_per_s"] * 1e6, 1)
    mem = sorted(sampler.memory.values())
    rec["collector_pss_mib"] = round(mem[len(mem) // 2][0] / 2**20, 1) if mem else None
    rec["collector_rss_mib"] = round(sorted(r for _, r in mem)[len(mem) // 2] / 2**20, 1) if mem else None
    return rec


def _round(x: Optional[float]) -> Optional[float]:
    return round(x, 1) if x is not None else None


def available_bytes() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes."""
    line = next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemAvailable"))
    return int(line.split()[1]) * 1024


def fits(n: int, pss_mib: Optional[float], available: int, reserve_gib: float = 4.0) -> Optional[str]:
    """None when ``n`` collector workers of ``pss_mib`` MiB each (measured at a smaller point)
    fit in ``available`` bytes with ``reserve_gib`` GiB left for everything else; else why not."""
    if pss_mib is None:
        return None
    need = n * pss_mib * 2**20 + reserve_gib * 2**30
    if need <= available:
        return None
    return (f"{n} collector workers need about {n * pss_mib / 1024:.1f} GiB ({pss_mib:g} MiB PSS each, measured) "
            f"+ {reserve_gib:g} GiB reserve, and {available / 2**30:.1f} GiB is available")


def table(records: list[dict[str, Any]]) -> str:
    """The markdown table of the curve: workers, env steps/s (collected, consumed), efficiency,
    CPU shares of one core (processes outside the run too) and each worker's memory."""
    head = ("| collector workers | env steps/s | consumed by the learner/s | efficiency | collectors CPU "
            "| coordinator CPU | learner CPU | Redis CPU | outside the run | PSS per worker | what binds |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    lines = [head]
    for r in records:
        c = r.get("cpu_share") or {}
        lines.append(f"| {r['workers']} | {_cell(r.get('env_steps_per_s'))} | {_cell(r.get('consumed_env_steps_per_s'))} "
                     f"| {_cell(r.get('efficiency'))} | {_cell(c.get('collectors'))} | {_cell(c.get('coordinator'))} "
                     f"| {_cell(c.get('learner'))} | {_cell(c.get('redis'))} | {_cell(c.get('outside_run'))} "
                     f"| {_cell(r.get('collector_pss_mib'), ' MiB')} "
                     f"| {r.get('binds') or r.get('skipped') or '-'} |")
    return "\n".join(lines)


def _cell(x: Any, unit: str = "") -> str:
    return "-" if x is None else f"{x:g}{unit}" if isinstance(x, (int, float)) else str(x)


def env_alone(env_name: str, sets: list[str], vector_steps: int = 100) -> dict[str, Any]:
    """The points' vector env alone in this process (the same ``env`` section; action 0 in every
    env, no policy, no Redis, autoreset): CPU microseconds per env step (``time.process_time``)
    and env steps/s, what a collector costs before any of its own work."""
    from common import spaces
    from common.config import apply_overrides, load_config
    from workers.envs import make_vector_env

    config, env_sets = ENVS[env_name]
    cfg = apply_overrides(load_config(config), [*COMMON_SETS, *env_sets, *sets])
    spaces.import_env_modules(list(cfg.env.import_names))
    env = make_vector_env(cfg.env, int(cfg.env.collector_env_num))
    try:
        env.reset(seed=0)
        actions = np.zeros(env.num_envs, dtype=np.int64)
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(vector_steps):
            env.step(actions)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    finally:
        env.close()
    steps = vector_steps * env.num_envs
    return {"env_steps": steps, "cpu_us_per_env_step": round(cpu / steps * 1e6, 1), "env_steps_per_s": round(steps / wall, 1)}


def curve(workers: list[int], steps_per_worker: int, env_name: str, sets: list[str],
          rate_from: str = "episodes") -> list[dict[str, Any]]:
    """Every point of ``workers`` in order, each printed as a JSON line when done; a point that
    would not fit in memory (from the largest measured worker's PSS) is skipped with the reason."""
    records: list[dict[str, Any]] = []
    cores = os.cpu_count() or 1
    for n in workers:
        pss = next((r["collector_pss_mib"] for r in reversed(records) if r.get("collector_pss_mib")), None)
        reason = fits(n, pss, available_bytes())
        if reason:
            records.append({"workers": n, "env": env_name, "skipped": reason})
        else:
            try:
                records.append(run_point(n, steps_per_worker, env_name, sets, rate_from))
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                text = str(e)  # its head names the exit code, its tail the run's last words
                records.append({"workers": n, "env": env_name,
                                "error": text if len(text) <= 2000 else f"{text[:200]} ... {text[-1800:]}"})
        eff = efficiency({r["workers"]: r["env_steps_per_s"] for r in records if r.get("env_steps_per_s")})
        for r in records:
            r["efficiency"] = eff.get(r["workers"])
            if r["efficiency"] is not None and r["efficiency"] < EFFICIENCY_GOAL:
                r["binds"] = what_binds(r, cores)
        print(json.dumps(records[-1]), flush=True)
    return records


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line (module docstring); ``--workers`` must start at 1 (efficiency's base).

    Raises:
        SystemExit: a bad command line (argparse's message).
    """
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--steps-per-worker", type=int, default=4000, help="env steps per collector worker per point")
    ap.add_argument("--env", choices=list(ENVS), default="slow")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="another config override, KEY=VALUE")
    ap.add_argument("--rate-from", choices=["episodes", "learner"], default="episodes",
                    help="the records env steps/s come from: episodes.jsonl, or the learner's consumed env steps "
                         "(for envs whose episodes outlast a point, as Pong's)")
    ap.add_argument("--json", default=None, help="also write the raw output (machine, command, records) here")
    ap.add_argument("--markdown", default=None, help="also write the table here")
    args = ap.parse_args(argv)
    if args.workers[0] != 1 or any(n < 1 for n in args.workers) or args.workers != sorted(set(args.workers)):
        ap.error(f"--workers must be distinct, increasing and start at 1 (efficiency is against 1), got {args.workers}")
    if args.steps_per_worker < 500:
        ap.error(f"--steps-per-worker must be at least 500 (a steady window needs several episode batches), "
                 f"got {args.steps_per_worker}")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Run the curve; print JSON lines and the table; 0 when every point gave a figure, else 1."""
    args = parse_args(argv)
    from tests.bench.run import machine

    started = time.time()
    alone = env_alone(args.env, args.sets)
    print(json.dumps({"env_alone": alone}), flush=True)
    records = curve(args.workers, args.steps_per_worker, args.env, args.sets, args.rate_from)
    print(table(records))
    raw = {"date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(started)), "machine": machine(),
           "command": "python -m tests.bench.bench_scaling " + " ".join(sys.argv[1:] if argv is None else argv),
           "git_commit": _git("rev-parse", "HEAD"), "git_dirty": bool(_git("status", "--porcelain")),
           "settings": {"steps_per_worker": args.steps_per_worker, "env": args.env, "sets": [*COMMON_SETS, *ENVS[args.env][1], *args.sets],
                        "steady_window": STEADY, "rate_from": args.rate_from},
           "env_alone": alone, "records": records}
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(table(records) + "\n")
    return 0 if all(r.get("env_steps_per_s") for r in records if not r.get("skipped")) else 1


def _git(*argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
