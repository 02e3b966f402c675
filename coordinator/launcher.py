"""``rqrl train``: one machine, everything at once, and nothing left behind.

Starts (when no ``--redis-url`` is given) a private redis-server, then the coordinator and
RQ's own ``rq worker collector`` (N times) and ``rq worker learner`` (``policy.learn.learner_num``
times) as child processes, each in its own session with its output in the run folder's
``log/{name}.log`` (``./{exp_name}/{run_name}/``, see coordinator/runs.py). Shows one live
progress line from the events stream (XREAD BLOCK), and tears every child and the private Redis
down on success, failure and Ctrl-C.

The children are forked, not executed: this process imports torch, gymnasium, RQ and the job
modules once, and every child (and every work-horse RQ forks from it) inherits them instead
of importing them again on the same few cores. Each worker child runs RQ's ``rq worker``
command line (``rq.cli``: RQ's forking ``Worker`` class, registrations, signals and logging
as a stock worker), so ``rq info``, rq-dashboard and the multi-machine recipe see the same
workers. Nothing runs torch before the forks, so no child inherits a started thread pool.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

import redis

from common import keys, streams
from easydict import EasyDict
from common.connection import connect, connect_checked, redact, scrub
from common.embedded_redis import EmbeddedRedis
from common.redis_memory import check_memory_settings

_WORKER_CLASS = "workers.worker.PreloadWorker"


class _Child:
    """A forked child process, with the part of ``subprocess.Popen``'s interface the launcher uses.

    Waiting with a timeout blocks on a pidfd (Linux >= 5.3); without one it checks every 50 ms.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None
        try:
            self._pidfd: Optional[int] = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                if self._pidfd is not None:
                    os.close(self._pidfd)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """The exit code; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            if self._pidfd is not None:
                select.select([self._pidfd], [], [], left)
            else:
                time.sleep(0.05 if left is None else min(0.05, left))
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def _rq_worker_main(argv: list[str]) -> int:
    """``rq worker ARGV...`` in this process, through RQ's own command line; its exit code."""
    from rq.cli import main as rq_main

    try:
        rq_main.main(args=["worker", *argv], prog_name="rq")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def _coordinator_main(argv: list[str]) -> int:
    """``python -m coordinator ARGV...`` in this process; its exit code.

    matplotlib (curve.png at the end of the run) imports in a thread meanwhile: at the start
    the coordinator mostly waits for its workers, at the end that import would delay the exit.
    """
    from coordinator.__main__ import main

    threading.Thread(target=importlib.import_module, args=("matplotlib.backends.backend_agg",), daemon=True,
                     name="preload-matplotlib").start()
    return main(argv)


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
        self.children: dict[str, _Child] = {}
        self.embedded: Optional[EmbeddedRedis] = None

    def _fork(self, name: str, main: Callable[[list[str]], int], argv: list[str], env: dict[str, str],
              path: list[str]) -> None:
        """Fork a child that runs ``main(argv)`` in its own session, in ``out_dir``, with ``env`` set,
        ``path`` first on ``sys.path`` and stdout/stderr in ``log/{name}.log``; it exits with main's code."""
        log = os.open(self.log_dir / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            os.close(log)
            self.children[name] = _Child(pid)
            return
        code = 1
        try:
            os.setsid()
            for s in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(s, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            sys.stdout.reconfigure(line_buffering=True)
            sys.stderr.reconfigure(line_buffering=True)
            os.chdir(self.out_dir)
            os.environ.update(env)
            sys.path[:0] = path
            code = main(argv)
        except BaseException:  # noqa: BLE001  (the child's only way out is os._exit below)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            # Not sys.exit: the parent's atexit handlers (the private Redis's stop) are not the child's.
            os._exit(code)

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
                    self._print_closing_block()
                except (subprocess.TimeoutExpired, KeyboardInterrupt):
                    pass
            return 128 + getattr(e, "signum", signal.SIGINT)
        finally:
            self._teardown()
            for s, h in previous.items():
                signal.signal(s, h)

    def _prepare(self) -> tuple[str, dict[str, str], list[str], redis.Redis]:
        """Start the private Redis (when no URL was given) and check it; returns its URL, the
        children's environment, the folders first on their ``sys.path`` and a connection."""
        url = self.redis_url
        if url is None:
            self.embedded = EmbeddedRedis().start()
            url = self.embedded.url
            print(f"started a private redis-server at {url}", file=sys.stderr)
        self.url = url
        # RQ's --connection-class: `rq worker` then takes rqrl's URLs (redis+sentinel:// too) and retries.
        env = {"RQRL_REDIS_URL": url, "RQ_REDIS_URL": url, "RQ_CONNECTION_CLASS": "common.connection.RQConnection",
               "PYTHONUNBUFFERED": "1"}
        # Modules beside the config file or in the cwd (custom envs, env.import_names) import in every child.
        extra = [str(Path(self.config_path).resolve().parent), os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join([*extra, *filter(None, [os.environ.get("PYTHONPATH", "")])])
        env["RQRL_TORCH_THREADS"] = os.environ.get("RQRL_TORCH_THREADS", "1")
        conn = connect_checked(url)
        for warning in check_memory_settings(conn, self.cfg, "--allow-eviction" in self.coordinator_args, self.collectors):
            print(f"warning: {warning}", file=sys.stderr)
        return url, env, extra, conn

    def _namespaces(self) -> list[str]:
        """The runs this launcher started (their stop flags are set on the way out)."""
        return [self.ns]

    def _start_workers(self, env: dict[str, str], path: list[str], learners: int, tag: str) -> None:
        """Import torch, gymnasium, the job modules and RQ's CLI here once, then fork ``learners``
        learner workers and the collector workers (one more than collector tasks: the coordinator
        keeps it free, so an eval starts at once), named ``{exp_name}-{tag}{role}{i}-{pid}``."""
        importlib.import_module(_WORKER_CLASS.rpartition(".")[0])
        importlib.import_module("rq.cli")
        stamp = f"{os.getpid()}"
        for i in range(learners):
            name = "learner" if i == 0 else f"learner{i}"
            self._fork(name, _rq_worker_main, [keys.LEARNER_QUEUE, "-w", _WORKER_CLASS,
                                               "--name", f"{self.cfg.exp_name}-{tag}{name}-{stamp}"], env, path)
        for i in range(self.collectors + (1 if self.cfg.commander.eval_task_space > 0 else 0)):
            self._fork(f"collector{i}", _rq_worker_main, [keys.COLLECTOR_QUEUE, "-w", _WORKER_CLASS,
                                                          "--name", f"{self.cfg.exp_name}-{tag}collector{i}-{stamp}"],
                       env, path)

    def _run(self) -> int:
        url, env, extra, conn = self._prepare()
        config_path = str(Path(self.config_path).resolve())
        # The coordinator needs neither torch nor RQ's CLI: it starts while they import here.
        self._fork("coordinator", _coordinator_main, [config_path, "--out-dir", ".", "--run-name", self.run_name,
                                                      *self.coordinator_args], env, extra)
        # One learner worker per rank of the learner group (policy.learn.learner_num).
        self._start_workers(env, extra, int(self.cfg.policy.learn.get("learner_num", 1)), "")
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
            if workers_told:
                # The wrap-up: wake at the coordinator's exit rather than at the next read's timeout.
                try:
                    coord.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
            try:
                reply = conn.xread({stream: last_id}, count=500, block=None if workers_told else 500)
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
        self._print_closing_block()
        return coord.returncode

    def _print_closing_block(self) -> None:
        """Echo the coordinator's closing summary block (why it stopped, figures, final.pt) from its log."""
        try:
            tail = (self.log_dir / "coordinator.log").read_text(errors="replace").splitlines()
        except OSError:
            return
        heads = [i for i, ln in enumerate(tail) if ln.startswith(f"rqrl {self.ns}:")]
        if heads:
            block = [tail[heads[-1]]] + [ln for ln in tail[heads[-1] + 1:] if ln.startswith("  ")]
            print("\n".join(block))

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
                except ProcessLookupError:  # forked a moment ago: not yet the leader of its session
                    proc.send_signal(signal.SIGTERM)
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
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
            if proc.poll() is None:
                proc.wait(timeout=5)
        if self.embedded is not None:
            self.embedded.stop()
