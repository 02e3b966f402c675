"""Chaos run: train CartPole while killing collectors, the learner and the coordinator.

    python -m tests.chaos.chaos --seed 0 --collector-kills 3 [--duration 240] [--stop-value 195]

Processes (all real): a private redis-server, ``python -m coordinator``, ``rq worker
collector`` x N and ``rq worker learner``. A seeded schedule SIGKILLs, once training runs: the learner's
work-horse once (first, once a checkpoint exists), then in seeded order random collector tasks
(the work-horse, or the horse and its ``rq worker`` parent) and the coordinator once (restarted
with the same command, as a supervisor would). Killed worker parents are restarted too. At the end it prints one table: per kill, the
seconds until the coordinator declared the task dead (its record left ``rqrl:{exp}:tasks``) or,
for the coordinator, until the restarted one resumed; then the chunk accounting of the buffer
(produced = consumed + expired + corrupt + malformed + unconsumed, duplicates).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import keys, streams
from common.connection import connect
from common.embedded_redis import EmbeddedRedis

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


class Chaos:
    def __init__(self, seed: int, collectors: int, collector_kills: int, duration: float, stop_value: float,
                 workdir: Path) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.n_collectors = collectors
        self.collector_kills = collector_kills
        self.duration = duration
        self.stop_value = stop_value
        self.dir = workdir
        self.exp = f"chaos_s{seed}"
        self.redis = EmbeddedRedis().start()
        self.url = self.redis.url
        self.conn = connect(self.url)
        self.env = dict(os.environ, RQRL_REDIS_URL=self.url, RQ_REDIS_URL=self.url, PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self.procs: dict[str, subprocess.Popen] = {}
        self.kills: list[dict[str, Any]] = []
        (self.dir / "log").mkdir(parents=True, exist_ok=True)

    # -- processes ----------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / "log" / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=self.dir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def _coordinator_argv(self) -> list[str]:
        return [sys.executable, "-m", "coordinator", CONFIG, "--seed", str(self.seed),
                "--set", f"exp_name={self.exp}", "--set", f"env.stop_value={self.stop_value}",
                "--set", f"commander.collector_task_space={self.n_collectors}",
                "--set", "policy.collect.collector.task_env_steps=2000",
                "--set", "policy.learn.learner.hook.save_ckpt_after_iter=100",
                "--set", f"commander.max_wall_seconds={self.duration}"]

    def _worker(self, name: str, queue: str) -> None:
        rq = str(Path(sys.executable).with_name("rq"))
        self._start(name, [rq, "worker", queue, "-w", "workers.worker.PreloadWorker", "--name", f"{self.exp}-{name}-{time.time():.0f}"])

    # -- observation -----------------------------------------------------------------------------
    def running_tasks(self) -> dict[str, dict]:
        return {k.decode(): json.loads(v) for k, v in self.conn.hgetall(keys.tasks(self.exp)).items()}

    def started_pid(self, task_id: str) -> int | None:
        for _, f in self.conn.xrange(keys.events(self.exp)):
            ev = streams.decode_fields(f)
            if ev.get("type") == "started" and ev.get("task_id") == task_id:
                return int(ev["pid"])
        return None

    def train_iter(self) -> int:
        raw = self.conn.hget(keys.commander(self.exp), "train_iter")
        return int(raw) if raw else 0

    def _wait(self, pred, timeout: float, step: float = 0.1) -> float | None:
        """Seconds until ``pred()`` holds, or None after ``timeout`` (harness-side observation)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if pred():
                return time.monotonic() - t0
            time.sleep(step)
        return None

    # -- kills -------------------------------------------------------------------------------------
    def _kill_task(self, kind: str, with_parent: bool) -> None:
        tasks = [t for t, e in self.running_tasks().items() if e["kind"] == kind and e["started"]
                 and not e["task"].get("eval_flag")]
        if not tasks:
            return
        tid = self.rng.choice(tasks)
        pid = self.started_pid(tid)
        if pid is None:
            return
        parent = None
        if with_parent:
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                parent = next((n for n, p in self.procs.items() if p.pid == ppid), None)
            except (OSError, ValueError, IndexError):
                parent = None
        ckpt = self.conn.hget(keys.ckpt(self.exp, "latest"), "version") if kind == "learner" else None
        t_kill = time.monotonic()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if parent is not None:
            self.procs[parent].kill()
            self.procs[parent].wait()
        what = f"{kind} work-horse" + (" + rq worker parent" if parent else "")
        ended = lambda: bool(self.conn.exists(keys.stop(self.exp)))  # noqa: E731
        detected = self._wait(lambda: tid not in self.running_tasks() or ended(), 30)
        run_ended = tid in self.running_tasks() and ended()
        record = {"what": what, "task_id": tid, "run_ended_first": run_ended,
                  "detect_s": None if detected is None or run_ended else round(time.monotonic() - t_kill, 2)}
        if kind == "learner":
            # The learner's last checkpoint before the kill, read before SIGKILL: it may save another
            # between the read and the kill, so a replacement resumes at or after this iteration.
            record["ckpt_iter_before_kill"] = int(ckpt) if ckpt is not None else None
            record["resumed_from_iter"] = self._first_iter_after(tid)
        self.kills.append(record)
        if parent is not None:  # a supervisor restarts the worker
            self._worker(parent, keys.COLLECTOR_QUEUE if parent.startswith("collector") else keys.LEARNER_QUEUE)

    def _first_iter_after(self, dead_task: str) -> int | None:
        """train_iter of the first report of the learner that replaced ``dead_task``."""
        def first() -> int | None:
            seen_dead = False
            for _, f in self.conn.xrange(keys.events(self.exp)):
                ev = streams.decode_fields(f)
                if ev.get("task_id") == dead_task:
                    seen_dead = True
                elif seen_dead and ev.get("type") == "learner_info":
                    return int(ev["train_iter"])
            return None
        found: list[int | None] = [None]
        self._wait(lambda: (found.__setitem__(0, first()) or found[0] is not None), 60, step=0.5)
        return found[0]

    def _kill_coordinator(self) -> None:
        before = self.conn.get(keys.run(self.exp))
        t_kill = time.monotonic()
        self.procs["coordinator"].kill()
        self.procs["coordinator"].wait()
        self._start("coordinator", self._coordinator_argv())
        log = self.dir / "log" / "coordinator.log"
        resumed = self._wait(lambda: "resuming run" in log.read_text(errors="replace"), 30)
        same_run = self.conn.get(keys.run(self.exp)) == before
        self.kills.append({"what": "coordinator (restarted)", "task_id": "-",
                           "detect_s": None if resumed is None else round(time.monotonic() - t_kill, 2),
                           "same_run": same_run})

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self._start("coordinator", self._coordinator_argv())
        self._worker("learner", keys.LEARNER_QUEUE)
        for i in range(self.n_collectors):
            self._worker(f"collector{i}", keys.COLLECTOR_QUEUE)
        # The learner goes first, right after its first checkpoint: killed later, the run may converge
        # before its death is detected, and its resume would go unchecked. The rest in seeded order.
        rest = ["collector"] * self.collector_kills + ["coordinator"]
        self.rng.shuffle(rest)
        plan = ["learner", *rest]
        try:
            self._wait(lambda: self.train_iter() >= 200, 120)  # a checkpoint exists before any kill
            for step in plan:
                # Let training progress a little between kills (bounded); no kills once the run stops.
                target = self.train_iter() + 50
                self._wait(lambda: self.train_iter() >= target or self.conn.exists(keys.stop(self.exp)), 30)
                if self.conn.exists(keys.stop(self.exp)) or self.procs["coordinator"].poll() is not None:
                    break
                if step == "collector":
                    self._kill_task("collector", with_parent=self.rng.random() < 0.5)
                elif step == "learner":
                    self._kill_task("learner", with_parent=False)
                else:
                    self._kill_coordinator()
            code = self.procs["coordinator"].wait(timeout=max(10.0, self.duration - (time.monotonic() - t0) + 60))
        finally:
            self._teardown()
        return self._report(code, time.monotonic() - t0)

    def _teardown(self) -> None:
        try:
            self.conn.set(keys.stop(self.exp), "chaos harness teardown", nx=True)
        except Exception:
            pass
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    def _report(self, code: int, wall: float) -> dict[str, Any]:
        summary_path = self.dir / self.exp / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        buffer_id = summary.get("buffer_id", "")
        acc: dict[str, int] = {}
        if buffer_id:
            raw = {k.decode(): int(v) for k, v in self.conn.hgetall(keys.buffer_stats(self.exp, buffer_id)).items()}
            stream = keys.buffer_meta(self.exp, buffer_id)
            group = next(g for g in self.conn.xinfo_groups(stream) if g["name"] == keys.LEARNER_GROUP.encode())
            last = group["last-delivered-id"]
            undelivered = len(self.conn.xrange(stream, min=f"({last.decode()}", max="+"))
            acc = {k: raw.get(k, 0) for k in ("produced", "consumed", "expired", "corrupt", "malformed", "duplicate")}
            acc["unconsumed"] = undelivered + int(group["pending"])
        self.redis.stop()
        result = {"exit_code": code, "wall_s": round(wall, 1), "converged": code == 0,
                  "last_eval": summary.get("last_eval_reward_mean"), "kills": self.kills, "chunks": acc}
        print(render(result))
        return result


def render(r: dict[str, Any]) -> str:
    lines = [f"chaos: exit {r['exit_code']} ({'converged' if r['converged'] else 'NOT converged'}), "
             f"last eval {r['last_eval']}, wall {r['wall_s']} s", "",
             f"{'kill':<40} {'task':<34} {'detected after s':>16}"]
    for k in r["kills"]:
        extra = (f"  (checkpoint at train iter {k['ckpt_iter_before_kill']} before the kill; replacement's first "
                 f"report at train iter {k['resumed_from_iter']})") if "resumed_from_iter" in k else ""
        if k.get("run_ended_first"):
            extra = "  (the run converged before the task's heartbeat expired)"
        lines.append(f"{k['what']:<40} {k['task_id']:<34} {k['detect_s'] if k['detect_s'] is not None else ('-' if k.get('run_ended_first') else 'NEVER'):>16}"
                     + extra)
    c = r["chunks"]
    if c:
        lines += ["", "chunks: produced {produced} = consumed {consumed} + expired {expired} + corrupt {corrupt} "
                      "+ malformed {malformed} + unconsumed {unconsumed}; duplicates {duplicate}".format(**c)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--collectors", type=int, default=2)
    ap.add_argument("--collector-kills", type=int, default=3)
    ap.add_argument("--duration", type=float, default=240.0, help="max_wall_seconds of the run")
    ap.add_argument("--stop-value", type=float, default=195.0)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rqrl-chaos-"))
    return Chaos(args.seed, args.collectors, args.collector_kills, args.duration, args.stop_value, workdir).run()


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res["converged"] else 1)
