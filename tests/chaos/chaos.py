"""Chaos run: train CartPole while killing collectors, the learner, the coordinator and Redis.

    python -m tests.chaos.chaos --seed 0 --collector-kills 3 [--duration 240] [--stop-value 195]
        [--redis-restart] [--oom [--oom-hold 45]] [--stall] [--wipe]

Processes (all real): a private redis-server, ``python -m coordinator``, ``rq worker
collector`` x N and ``rq worker learner``. A seeded schedule SIGKILLs, once training runs: the
learner's work-horse once (first, once a checkpoint exists), the coordinator once (restarted
with the same command, as a supervisor would), Redis out of memory (``--oom``, below), then in
seeded order random collector tasks (the work-horse, or the horse and its ``rq worker`` parent)
and the Redis restart. Killed worker parents are restarted too. With ``--redis-restart`` Redis
runs with AOF (``appendfsync everysec``, as deploy/redis/redis.conf) and is restarted once mid-
run (SIGTERM, then the same command on the same port and data dir); with ``--oom`` Redis's
``maxmemory`` is lowered to what it uses plus 256 KB early in the schedule, which must stop the
run cleanly ("Redis out of memory", summary.json, rq workers alive, ``rqrl status`` answering);
the harness raises the limit again and starts the coordinator anew, as an operator would, and
that run must converge; ``--oom-hold S`` keeps Redis full for S seconds after that stop, and the rq
workers must still be alive at its end (stock RQ quit 31-42 s into a full Redis). ``--stall``
pauses the whole Redis (``DEBUG SLEEP``) longer than the heartbeat timeout: no task may be
declared dead, and training goes on. ``--wipe`` restarts Redis without persistence (an empty
server on the same port): the coordinator must stop with the reason and write summary.json
(evals.jsonl, ckpt/latest.pth and resume.json kept), and the run resumed from its folder
(``--resume``) must go on from that checkpoint's train iteration. At the end it prints one table: per kill, the seconds until the
coordinator declared the task dead (its record left ``rqrl:{exp}:tasks``), for the coordinator
until the restarted one resumed, for Redis until training went on (or the run stopped); then
the chunk accounting of each run's buffer (produced = consumed + expired + corrupt + malformed
+ unconsumed, duplicates).
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

from rq import Worker

from common import keys, streams
from common.connection import connect
from common.embedded_redis import EmbeddedRedis, binary_version, find_redis_server

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


class Chaos:
    def __init__(self, seed: int, collectors: int, collector_kills: int, duration: float, stop_value: float,
                 workdir: Path, redis_restart: bool = False, oom: bool = False, oom_hold: float = 0.0,
                 stall: bool = False, wipe: bool = False, process_kills: bool = True) -> None:
        self.rng = random.Random(seed)
        self.seed = seed
        self.n_collectors = collectors
        self.collector_kills = collector_kills
        self.duration = duration
        self.stop_value = stop_value
        self.dir = workdir
        self.exp_name = f"chaos_s{seed}"
        self.exp = f"{self.exp_name}/chaos"  # the run's namespace (--run-name chaos): keys and folder
        self.redis_restart, self.oom, self.oom_hold, self.stall, self.wipe = redis_restart, oom, oom_hold, stall, wipe
        self.oom_done = False  # the OOM stopped the first run: the rerun has the real stop value
        self.process_kills = process_kills
        aof = ["--appendonly", "yes", "--appendfsync", "everysec"] if redis_restart else []
        exe = find_redis_server()
        # DEBUG SLEEP (the stall) needs this switch on Redis 7; 6.2 has no such switch.
        debug = ["--enable-debug-command", "local"] if stall and exe and int(
            (binary_version(exe) or "0").split(".")[0]) >= 7 else []
        self.redis = EmbeddedRedis(aof + debug, exe=exe).start()
        self.url = self.redis.url
        self.conn = connect(self.url)
        self.env = dict(os.environ, RQRL_REDIS_URL=self.url, RQ_REDIS_URL=self.url, PYTHONUNBUFFERED="1",
                        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        self.procs: dict[str, subprocess.Popen] = {}
        self.kills: list[dict[str, Any]] = []
        self.accounting: list[dict[str, Any]] = []  # chunk accounting of runs ended mid-chaos (OOM)
        (self.dir / "log").mkdir(parents=True, exist_ok=True)

    # -- processes ----------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / "log" / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, cwd=self.dir, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()

    def _coordinator_argv(self) -> list[str]:
        # A run the OOM will stop cannot converge first (its faults would go untried): its stop
        # value is out of reach; the operator's rerun has the real one.
        stop_value = 1e9 if self.oom and not self.oom_done else self.stop_value
        return [sys.executable, "-m", "coordinator", CONFIG, "--seed", str(self.seed),
                "--run-name", "chaos", "--set", f"exp_name={self.exp_name}", "--set", f"env.stop_value={stop_value}",
                # A cap: a killed worker counts in RQ's registry until its key expires (~90 s).
                "--set", f"commander.collector_task_space={self.n_collectors}",
                "--set", "policy.collect.collector.task_env_steps=2000",
                "--set", "policy.learn.learner.hook.save_ckpt_after_iter=100",
                "--set", f"commander.max_wall_seconds={self.duration}"]

    def _worker(self, name: str, queue: str) -> str:
        """Start an rq worker as ``name``; returns its RQ worker name."""
        rq = str(Path(sys.executable).with_name("rq"))
        cls = "CollectorWorker" if queue == keys.COLLECTOR_QUEUE else "PreloadWorker"
        rq_name = f"{self.exp_name}-{name}-{time.time():.0f}"
        self._start(name, [rq, "worker", queue, "-w", f"workers.worker.{cls}", "--name", rq_name])
        return rq_name

    def _registered(self, rq_name: str) -> bool:
        """The worker reached RQ's loop (its registration is RQ's own record)."""
        return Worker.find_by_key(Worker.redis_worker_namespace_prefix + rq_name, connection=self.conn) is not None

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
        # A CollectorWorker runs its tasks in its own process: killing the task kills the worker.
        parent = next((n for n, p in self.procs.items() if p.pid == pid), None)
        if with_parent and parent is None:
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
        what = f"{kind} work-horse" + (" + rq worker parent" if parent and with_parent else "")
        if parent and self.procs[parent].pid == pid:
            what = f"{kind} rq worker (runs its tasks in-process)"
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
            rq_name = self._worker(parent, keys.COLLECTOR_QUEUE if parent.startswith("collector") else keys.LEARNER_QUEUE)
            # The next fault waits for it: a worker still starting when Redis fills up quits in
            # rq's own start-up (its suspension check), before any of rqrl's code runs.
            self._wait(lambda: self._registered(rq_name), 60)

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

    def _alive(self) -> bool:
        try:
            return bool(self.conn.ping())
        except Exception:  # noqa: BLE001 - restarting: any client error means "not yet"
            return False

    def _restart_redis(self) -> None:
        """SIGTERM redis-server (it writes its AOF), start it again on the same port and data dir."""
        before, argv = self.train_iter(), self.redis.proc.args
        t_kill = time.monotonic()
        self.redis.proc.terminate()
        self.redis.proc.wait(timeout=30)
        self.redis.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True)
        self._wait(self._alive, 30)
        went_on = self._wait(lambda: self._safe(lambda: self.train_iter() > before + 20
                                                or self.conn.exists(keys.stop(self.exp))), 90)
        stop = self._safe(lambda: self.conn.get(keys.stop(self.exp)))
        outcome = f"stopped: {stop.decode()}" if stop else ("training went on" if went_on is not None else "STUCK")
        self.kills.append({"what": "redis-server restart (AOF)", "task_id": "-", "outcome": outcome,
                           "detect_s": None if went_on is None else round(time.monotonic() - t_kill, 2)})

    def _coordinator_log(self) -> str:
        path = self.dir / "log" / "coordinator.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _stall(self) -> None:
        """The whole Redis sleeps 8 s (heartbeats live 6 s): no task may be declared dead."""
        before_iter, before_log = self.train_iter(), self._coordinator_log().count("heartbeat lost")
        t0 = time.monotonic()
        connect(self.url, socket_timeout=60).execute_command("DEBUG", "SLEEP", 8)
        went_on = self._wait(lambda: self._safe(lambda: self.train_iter() > before_iter + 20
                                                or self.conn.exists(keys.stop(self.exp))), 90)
        declared = self._coordinator_log().count("heartbeat lost") - before_log
        self.kills.append({"what": "redis stall (DEBUG SLEEP 8 s > heartbeat 6 s)", "task_id": "-",
                           "detect_s": None if went_on is None else round(time.monotonic() - t0, 2),
                           "outcome": f"training {'went on' if went_on is not None else 'STUCK'}; "
                                      f"{declared} tasks declared dead", "declared_dead": declared})

    def _wipe(self) -> None:
        """Redis restarted without persistence: an empty server on the same port. The run stops
        naming the loss and keeps its folder; resumed from it, it trains on from its checkpoint."""
        run_dir = self.dir / self.exp
        evals_before = len((run_dir / "evals.jsonl").read_text().splitlines()) if (run_dir / "evals.jsonl").exists() else 0
        port = self.redis.port
        self.redis.stop()
        t0 = time.monotonic()
        self.redis = EmbeddedRedis(exe=self.redis.exe).start(port=port)
        coord = self.procs["coordinator"]
        stopped = self._wait(lambda: coord.poll() is not None, 60)
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        evals_after = len((run_dir / "evals.jsonl").read_text().splitlines()) if (run_dir / "evals.jsonl").exists() else 0
        point = json.loads((run_dir / "resume.json").read_text()) if (run_dir / "resume.json").exists() else {}
        row = {"what": "redis restart without persistence", "task_id": "-",
               "detect_s": None if stopped is None else round(time.monotonic() - t0, 2),
               "outcome": f"exit {coord.returncode}: {summary.get('status', 'no summary.json')}",
               "state_lost_named": "Redis lost the state of run" in str(summary.get("status", "")),
               "evals_kept": evals_after >= evals_before, "ckpt_iter": point.get("ckpt_train_iter"),
               "summary_train_iter": summary.get("train_iter")}
        # The operator resumes the run from its folder.
        self._start("coordinator", self._coordinator_argv() + ["--resume"])
        self.rerun_t0 = time.monotonic()
        first = self._wait(lambda: self._safe(lambda: self.train_iter() > 0), 120)
        row["resumed_at_iter"] = self._safe(self.train_iter) if first is not None else None
        self.kills.append(row)

    def _safe(self, fn):
        try:
            return fn()
        except Exception:  # noqa: BLE001 - Redis restarting
            return None

    def _out_of_memory(self) -> None:
        """Lower maxmemory until the run hits OOM; it must stop cleanly; then (after ``oom_hold``
        seconds of a full Redis) rerun with room."""
        used = int(self.conn.info("memory")["used_memory"])
        t0 = time.monotonic()
        self.conn.config_set("maxmemory", used + 256 * 1024)
        coord = self.procs["coordinator"]
        stopped = self._wait(lambda: coord.poll() is not None, 120)
        stop_s = None if stopped is None else round(time.monotonic() - t0, 2)
        summary_path = self.dir / self.exp / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        if self.oom_hold:  # a Redis that stays full: the workers must outlive it
            time.sleep(max(0.0, self.oom_hold - (time.monotonic() - t0)))  # the fault's length, not a poll
        workers = {n: p.poll() is None for n, p in self.procs.items() if n != "coordinator"}
        status = subprocess.run([sys.executable, "-m", "coordinator.cli", "status", "--exp", self.exp], env=self.env,
                                capture_output=True, text=True, timeout=60)
        what = "redis out of memory (max = used+256K)" + (f", full {self.oom_hold:g} s" if self.oom_hold else "")
        self.kills.append({"what": what, "task_id": "-",
                           "detect_s": stop_s,
                           "outcome": f"exit {coord.returncode}: {summary.get('status', 'no summary.json')}",
                           "oom_stop": str(summary.get("status", "")).startswith("Redis out of memory"),
                           "workers_alive": all(workers.values()), "status_ok": status.returncode == 0})
        self.accounting.append(self._chunks(summary.get("buffer_id", "")))
        # The operator raises the limit and starts the run again.
        self.conn.config_set("maxmemory", 0)
        self.oom_done = True
        self._start("coordinator", self._coordinator_argv())
        self.rerun_t0 = time.monotonic()
        # The rerun is under way once its coordinator cleared the stopped run's keys (the stop flag).
        self._wait(lambda: not self.conn.exists(keys.stop(self.exp)), 60)
        self._wait(lambda: self.train_iter() >= 200, 120)  # and it has a checkpoint before the next kill

    def _chunks(self, buffer_id: str) -> dict[str, int]:
        """Chunk accounting of one buffer (empty when its stream is gone)."""
        if not buffer_id:
            return {}
        stream = keys.buffer_meta(self.exp, buffer_id)
        groups = [g for g in self._safe(lambda: self.conn.xinfo_groups(stream)) or []
                  if g["name"] == keys.LEARNER_GROUP.encode()]
        if not groups:
            return {}
        raw = {k.decode(): int(v) for k, v in self.conn.hgetall(keys.buffer_stats(self.exp, buffer_id)).items()}
        last = groups[0]["last-delivered-id"]
        undelivered = len(self.conn.xrange(stream, min=f"({last.decode()}", max="+"))
        acc = {k: raw.get(k, 0) for k in ("produced", "consumed", "expired", "corrupt", "malformed", "duplicate", "trimmed")}
        acc["unconsumed"] = undelivered + int(groups[0]["pending"])
        return acc

    # -- the run -----------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self._start("coordinator", self._coordinator_argv())
        self._worker("learner", keys.LEARNER_QUEUE)
        for i in range(self.n_collectors + 1):  # one more, kept free for evals
            self._worker(f"collector{i}", keys.COLLECTOR_QUEUE)
        # The learner goes first, right after its first checkpoint: killed later, the run may converge
        # before its death is detected, and its resume would go unchecked. The coordinator next, the
        # stall, then the collector kills and the Redis restart in seeded order. Redis out of memory
        # comes after them: it stops a run that could not converge before it (_coordinator_argv),
        # and the operator's rerun from scratch is what must converge; the wipe last (it ends that
        # rerun, which resumes).
        rest = ["collector"] * self.collector_kills + (["redis"] if self.redis_restart else [])
        self.rng.shuffle(rest)
        plan = [*(["learner", "coordinator"] if self.process_kills else []), *(["stall"] if self.stall else []),
                *rest, *(["oom"] if self.oom else []), *(["wipe"] if self.wipe else [])]
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
                elif step == "redis":
                    self._restart_redis()
                elif step == "oom":
                    self._out_of_memory()
                elif step == "stall":
                    self._stall()
                elif step == "wipe":
                    self._wipe()
                else:
                    self._kill_coordinator()
            started = getattr(self, "rerun_t0", t0)
            code = self.procs["coordinator"].wait(timeout=max(10.0, self.duration - (time.monotonic() - started) + 60))
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
        acc = self._chunks(summary.get("buffer_id", ""))
        self.redis.stop()
        result = {"exit_code": code, "wall_s": round(wall, 1), "converged": code == 0,
                  "last_eval": summary.get("last_eval_reward_mean"), "kills": self.kills, "chunks": acc,
                  "earlier_runs_chunks": self.accounting}
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
        if "outcome" in k:
            extra = f"  ({k['outcome']}"
            if "workers_alive" in k:
                extra += f"; rq workers {'alive' if k['workers_alive'] else 'DEAD'}, rqrl status " \
                         f"{'answered' if k['status_ok'] else 'FAILED'}; rerun with room"
            extra += ")"
        lines.append(f"{k['what']:<40} {k['task_id']:<34} {k['detect_s'] if k['detect_s'] is not None else ('-' if k.get('run_ended_first') else 'NEVER'):>16}"
                     + extra)
    fmt = ("produced {produced} = consumed {consumed} + expired {expired} + corrupt {corrupt} "
           "+ malformed {malformed} + unconsumed {unconsumed}; duplicates {duplicate}")
    for c in r.get("earlier_runs_chunks", []):
        lines += ["", "chunks of the run stopped by OOM: " + (fmt.format(**c) if c else "buffer stream dropped to make room")]
    c = r["chunks"]
    if c:
        lines += ["", "chunks: " + fmt.format(**c)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--collectors", type=int, default=2, help="collector tasks at once (one worker more is started)")
    ap.add_argument("--collector-kills", type=int, default=3)
    ap.add_argument("--duration", type=float, default=240.0, help="max_wall_seconds of the run")
    ap.add_argument("--stop-value", type=float, default=195.0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--redis-restart", action="store_true", help="restart Redis (AOF on) once mid-run")
    ap.add_argument("--oom", action="store_true", help="then make Redis run out of memory (ends that run; a rerun follows)")
    ap.add_argument("--oom-hold", type=float, default=0.0, help="seconds Redis stays full before the rerun")
    ap.add_argument("--stall", action="store_true", help="pause the whole Redis 8 s (DEBUG SLEEP) mid-run")
    ap.add_argument("--wipe", action="store_true", help="restart Redis without persistence (the run resumes from its folder)")
    ap.add_argument("--redis-only", action="store_true", help="no learner or coordinator kill: Redis faults only")
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rqrl-chaos-"))
    return Chaos(args.seed, args.collectors, args.collector_kills, args.duration, args.stop_value, workdir,
                 args.redis_restart, args.oom, args.oom_hold, args.stall, args.wipe, not args.redis_only).run()


if __name__ == "__main__":
    res = main()
    sys.exit(0 if res["converged"] else 1)
