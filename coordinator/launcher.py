"""``rqrl train``: one machine, everything at once, and nothing left behind.

Starts (when no ``--redis-url`` is given) a private redis-server, then ``python -m
coordinator`` and the stock ``rq worker collector`` (N times) and ``rq worker learner``
(``policy.learn.learner_num`` times) as child processes, each in its own session with its output
in the run folder's ``log/{name}.log`` (``./{exp_name}/{run_name}/``, see coordinator/runs.py). Shows
one live progress line from the events stream (XREAD BLOCK), and tears every child and the
private Redis down on success, failure and Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import redis

from common import keys, streams
from easydict import EasyDict
from common.connection import connect, connect_checked, redact, scrub
from common.embedded_redis import EmbeddedRedis
from common.redis_memory import check_memory_settings

_WORKER_CLASS = "workers.worker.PreloadWorker"


def _rq_command() -> list[str]:
    """The ``rq`` console script installed beside this interpreter (falls back to PATH)."""
    beside = Path(sys.executable).with_name("rq")
    return [str(beside)] if beside.exists() else ["rq"]


class _Terminated(KeyboardInterrupt):
    """SIGTERM / SIGHUP, handled like Ctrl-C (``signum`` gives the exit code 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise _Terminated(signum)


class Progress:
    """One progress line: env steps, train iterations, last eval reward vs stop_value, elapsed."""

    def __init__(self, stop_value: float) -> None:
        self.stop_value = stop_value
        self.envstep = 0
        self.train_iter = 0
        self.eval: Optional[float] = None
        self.t0 = time.time()
        self.tty = sys.stderr.isatty()
        self._last_print = 0.0

    def update(self, ev: dict[str, Any]) -> None:
        if ev.get("type") == "learner_info":
            self.envstep = max(self.envstep, int(ev.get("collector_envstep", 0)))
            self.train_iter = max(self.train_iter, int(ev.get("train_iter", 0)))
        elif ev.get("type") == "finished" and ev.get("eval_flag") is True:
            self.eval = float(ev.get("reward_mean", 0.0))

    def from_summary(self, summary: dict[str, Any]) -> None:
        """Take the run's final figures (summary.json) for the closing line."""
        self.envstep = int(summary.get("envstep") or self.envstep)
        self.train_iter = int(summary.get("train_iter") or self.train_iter)
        last = summary.get("last_eval_reward_mean")
        if isinstance(last, (int, float)) and not isinstance(last, bool):
            self.eval = float(last)

    def line(self) -> str:
        ev = "-" if self.eval is None else f"{self.eval:.1f}"
        secs = time.time() - self.t0
        return (f"env steps {self.envstep:>8,} | train iter {self.train_iter:>7,} | "
                f"eval {ev:>6} / {self.stop_value:g} | {secs:6.1f} s")

    def show(self, final: bool = False) -> None:
        now = time.time()
        if self.tty:
            sys.stderr.write("\r" + self.line() + ("\n" if final else ""))
            sys.stderr.flush()
        elif final or now - self._last_print >= 5.0:
            print(self.line(), file=sys.stderr, flush=True)
            self._last_print = now


class Launcher:
    """Runs one experiment on this machine (see module docstring).

    Args:
        cfg: the compiled config (used for exp_name and stop_value; the coordinator reloads the file).
        config_path: the config file handed to the coordinator.
        redis_url: an existing Redis, or None for a private one.
        collectors: number of ``rq worker collector`` processes for training tasks; one more is
            started for evaluation when ``commander.eval_task_space`` > 0. The coordinator sizes
            its collector task space from the live workers (coordinator/daemon.py).
        coordinator_args: extra arguments for ``python -m coordinator`` (``--seed``, ``--set``).
        out_dir: where the run folder ``{exp_name}/{run_name}/`` is.
        run_name: the run's name (its folder exists: coordinator/runs.py reserves it).
    """

    def __init__(self, cfg: EasyDict, config_path: str, redis_url: Optional[str], collectors: int,
                 coordinator_args: list[str], run_name: str, out_dir: str = ".") -> None:
        self.cfg = cfg
        self.config_path = config_path
        self.redis_url = redis_url
        self.collectors = collectors
        self.coordinator_args = coordinator_args
        self.out_dir = Path(out_dir)
        self.run_name = run_name
        self.ns = keys.namespace(cfg.exp_name, run_name)  # the run's keys, and its folder below out_dir
        self.run_dir = self.out_dir / self.ns
        self.log_dir = self.run_dir / "log"
        self.children: dict[str, subprocess.Popen] = {}
        self.embedded: Optional[EmbeddedRedis] = None

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")
        self.children[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               env=env, start_new_session=True, cwd=self.out_dir)
        log.close()

    def run(self) -> int:
        """Launch, follow and tear down; returns the coordinator's exit code (130 on Ctrl-C)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # SIGTERM / SIGHUP (kill, timeout, a closed terminal) stop the run like Ctrl-C does.
        previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            return self._run()
        except KeyboardInterrupt as e:
            print("\ninterrupted: stopping the run ...", file=sys.stderr)
            coord = self.children.get("coordinator")
            if coord is not None and coord.poll() is None:
                coord.send_signal(signal.SIGINT)
                try:
                    coord.wait(timeout=20)
                except (subprocess.TimeoutExpired, KeyboardInterrupt):
                    pass
            return 128 + getattr(e, "signum", signal.SIGINT)
        finally:
            self._teardown()
            for s, h in previous.items():
                signal.signal(s, h)

    def _prepare(self) -> tuple[str, dict[str, str], redis.Redis]:
        """Start the private Redis (when no URL was given) and check it; returns its URL, the
        children's environment and a connection."""
        url = self.redis_url
        if url is None:
            self.embedded = EmbeddedRedis().start()
            url = self.embedded.url
            print(f"started a private redis-server at {url}", file=sys.stderr)
        self.url = url
        env = dict(os.environ, RQRL_REDIS_URL=url, RQ_REDIS_URL=url, PYTHONUNBUFFERED="1")
        # Modules beside the config file or in the cwd (custom envs, env.import_names) import in every child.
        extra = [str(Path(self.config_path).resolve().parent), os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join([*extra, *filter(None, [os.environ.get("PYTHONPATH", "")])])
        env.setdefault("RQRL_TORCH_THREADS", "1")
        conn = connect_checked(url)
        for warning in check_memory_settings(conn, self.cfg, "--allow-eviction" in self.coordinator_args, self.collectors):
            print(f"warning: {warning}", file=sys.stderr)
        return url, env, conn

    def _namespaces(self) -> list[str]:
        """The runs this launcher started (their stop flags are set on the way out)."""
        return [self.ns]

    def _run(self) -> int:
        url, env, conn = self._prepare()
        config_path = str(Path(self.config_path).resolve())
        self._spawn("coordinator", [sys.executable, "-m", "coordinator", config_path, "--out-dir", ".",
                                    "--run-name", self.run_name, *self.coordinator_args], env)
        rq = _rq_command()
        stamp = f"{os.getpid()}"
        # One learner worker per rank of the learner group (policy.learn.learner_num).
        for i in range(int(self.cfg.policy.learn.get("learner_num", 1))):
            name = "learner" if i == 0 else f"learner{i}"
            self._spawn(name, [*rq, "worker", keys.LEARNER_QUEUE, "-w", _WORKER_CLASS,
                               "--name", f"{self.cfg.exp_name}-{name}-{stamp}"], env)
        # One worker more than collector tasks: the coordinator keeps it free, so an eval starts at once.
        for i in range(self.collectors + (1 if self.cfg.commander.eval_task_space > 0 else 0)):
            self._spawn(f"collector{i}", [*rq, "worker", keys.COLLECTOR_QUEUE, "-w", _WORKER_CLASS,
                                          "--name", f"{self.cfg.exp_name}-collector{i}-{stamp}"], env)
        print(f"logs in {self.log_dir}/ ; watch with: rqrl status --redis-url {redact(url)}", file=sys.stderr)
        return self._follow(conn)

    def _follow(self, conn: redis.Redis) -> int:
        progress = Progress(float(self.cfg.env.stop_value))
        stream = keys.events(self.ns)
        last_id = b"0"
        t0 = time.time()
        coord = self.children["coordinator"]
        warned: set[str] = set()
        workers_told = False
        # A stop flag left by an earlier run of this experiment is not ours: the coordinator
        # clears it when it starts a fresh run. Only a flag set after that ends this run.
        stale_stop = bool(conn.exists(keys.stop(self.ns)))
        while coord.poll() is None:
            stop_now = bool(conn.exists(keys.stop(self.ns)))
            stale_stop = stale_stop and stop_now
            if not workers_told and stop_now and not stale_stop:
                # The run is ending: ask each rq worker for a warm shutdown now (it finishes its
                # current job, e.g. the learner's final checkpoint, then exits), overlapping the
                # teardown with the coordinator's wrap-up. The parent only: a signal to the
                # work-horse would cut its job short.
                workers_told = True
                for name, proc in self.children.items():
                    if name != "coordinator" and proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)
            try:
                reply = conn.xread({stream: last_id}, count=500, block=500)
            except redis.RedisError as e:
                print(f"\nredis error while following the run: {scrub(str(e), self.url)}", file=sys.stderr)
                reply = []
            for _, entries in reply or []:
                for entry_id, raw in entries:
                    last_id = entry_id
                    ev = streams.decode_fields(raw)
                    if float(ev.get("ts", 0)) >= t0 - 1:  # ignore what an earlier run left
                        progress.update(ev)
            progress.show()
            for name, proc in self.children.items():
                if workers_told:
                    break  # workers exiting now were asked to
                if name != "coordinator" and proc.poll() is not None and name not in warned:
                    warned.add(name)
                    print(f"\nworker {name} exited with code {proc.returncode}; see {self.log_dir / (name + '.log')}",
                          file=sys.stderr)
        # The closing line shows the figures of summary.json (the learner may report a little more
        # after the coordinator's snapshot at the stop): one set of numbers per run.
        summary_path = self.run_dir / "summary.json"
        if summary_path.is_file():
            progress.from_summary(json.loads(summary_path.read_text()))
        progress.show(final=True)
        code = coord.returncode
        tail = (self.log_dir / "coordinator.log").read_text(errors="replace").splitlines()
        heads = [i for i, ln in enumerate(tail) if ln.startswith(f"rqrl {self.ns}:")]
        if heads:  # the coordinator's closing summary block
            block = [tail[heads[-1]]] + [ln for ln in tail[heads[-1] + 1:] if ln.startswith("  ")]
            print("\n".join(block))
        return code

    def _teardown(self) -> None:
        # Workers end their tasks at the stop flag; set it in case the coordinator could not.
        url = getattr(self, "url", None)
        if url is not None:
            try:
                c = connect(url, socket_timeout=2)
                for ns in self._namespaces():
                    c.set(keys.stop(ns), "rqrl is exiting", nx=True)
            except (redis.RedisError, ValueError):
                pass
        for proc in self.children.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 15
        for proc in self.children.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.children.values():
            # The whole group: the rq parent and any work-horse it forked.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if proc.poll() is None:
                proc.wait(timeout=5)
        if self.embedded is not None:
            self.embedded.stop()
