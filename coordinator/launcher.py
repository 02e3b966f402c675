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
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import redis

from common import keys, phases, server_limits, streams
from easydict import EasyDict
from common.connection import connect, connect_checked, redact, scrub
from common.data_shards import ENV_DATA_URL
from common.embedded_redis import EmbeddedRedis
from common.redis_memory import check_memory_settings
from coordinator import closing
from coordinator.children import Child, fork_child, run_detached, stop_children, unblock_stop_signals
from coordinator.eval_judge import closing_eval_seconds
from coordinator.lifeline import Lifeline
from coordinator.progress import Progress, budgets_of

# The learner runs in a forked work-horse (PreloadWorker); collectors in the worker process
# itself, which keeps each run's envs between tasks (CollectorWorker, workers/worker.py).
_WORKER_CLASS = {keys.LEARNER_QUEUE: "workers.worker.PreloadWorker", keys.COLLECTOR_QUEUE: "workers.worker.CollectorWorker"}


# A collector worker that dies (it runs its tasks, and their envs, in its own process) is forked
# again, as a supervisor would, at most this many times per worker.
_MAX_RESTARTS = 5
# Lines of the coordinator's log shown when it ended without its closing summary.
_LAST_WORDS = 5
# How long the background teardown lets the coordinator draw curve.png before stopping it.
_CURVE_GRACE_S = 60.0


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

    matplotlib is imported only for curve.png, after the summary: an import at the start would
    take CPU from the workers' start-up, and nothing waits for the plot at the end.
    """
    from coordinator.__main__ import main

    return main(argv)


def _collector_nice() -> int:
    """How much nicer than the learner the collector workers run (``$RQRL_COLLECTOR_NICE``, default
    5; 0: as nice as the learner). The learner keeps a core while collectors, paced by the replay
    ratio, fill the rest: on a small machine a starved learner slows the whole run."""
    return int(os.environ.get("RQRL_COLLECTOR_NICE", "5"))


class _Terminated(KeyboardInterrupt):
    """SIGTERM / SIGHUP, handled like Ctrl-C (``signum`` gives the exit code 128 + signum)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise _Terminated(signum)


def _drop_if_empty(run_dir: Path) -> None:
    """Remove a run folder in which nothing was written (a launch refused before any process
    logged a line), and its experiment folder if that is empty then."""
    if run_dir.is_dir() and not any(p.is_file() or p.is_symlink() for p in run_dir.rglob("*")):
        shutil.rmtree(run_dir, ignore_errors=True)
        try:
            run_dir.parent.rmdir()
        except OSError:  # other runs of the experiment are there
            pass


class _Phases:
    """The phases this process passes (common/phases.py: launch, redis_up, workers_up, exit), written
    to the run's hash once the coordinator has claimed the run (its claim clears what an earlier run
    of the name left)."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.at: dict[str, float] = {"launch": phases.process_start_time()}  # name -> unix seconds
        self._written: set[str] = set()

    def note(self, conn: redis.Redis, worker_names: list[str], stale_run_id: Optional[bytes]) -> None:
        """Write this process's phases (launch, redis_up, workers_up: the last of its workers' RQ
        registrations) to the run's phases hash, once the coordinator has claimed the run (a run id
        other than the one found at the start: the claim first clears the keys of an earlier run)."""
        if "workers_up" not in self.at and worker_names:
            from rq import Worker  # imported by now (the workers' modules), not before the coordinator's fork

            worker_keys = [Worker.redis_worker_namespace_prefix + n for n in worker_names]
            if conn.exists(*worker_keys) == len(worker_keys):
                born = [Worker.find_by_key(k, connection=conn) for k in worker_keys]
                dates = [w.birth_date for w in born if w is not None and w.birth_date is not None]
                if len(dates) == len(worker_keys):
                    self.at["workers_up"] = max(d.timestamp() for d in dates)
        todo = [name for name in self.at if name not in self._written]
        run_id = conn.get(keys.run(self.ns)) if todo else None
        if run_id is None or run_id == stale_run_id:
            return
        pipe = conn.pipeline(transaction=False)
        for name in todo:
            phases.record(pipe, self.ns, name, self.at[name], first_only=False)
        pipe.execute()
        self._written.update(todo)

    def record_exit(self, conn: redis.Redis, summary_path: Path, summary: dict[str, Any]) -> None:
        """Phase ``exit`` (now: the closing lines and the return are next) into summary.json, with this
        process's other phases should Redis not have them, and into Redis."""
        self.at["exit"] = time.time()
        merged = {**summary.get("phases", {}), **self.at}
        summary["phases"] = {name: merged[name] for name in phases.NAMES if name in merged}
        tmp = summary_path.with_name(summary_path.name + ".tmp")
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        tmp.replace(summary_path)
        try:
            phases.record(conn, self.ns, "exit", self.at["exit"], first_only=False)
        except redis.RedisError:
            pass  # summary.json has it


class _DonePipe:
    """Read end of the coordinator's done pipe: its exit code arrives there once summary.json and
    final.pt are written (coordinator/daemon.py, done_fd)."""

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        self.code: Optional[int] = None  # the coordinator's exit code, once it came

    def open(self) -> int:
        """Make the pipe; returns its write end (the coordinator's alone: close it here once forked)."""
        self.fd, write_end = os.pipe()
        return write_end

    def wait(self, coord: Child, timeout: float) -> bool:
        """True once the coordinator has sent its exit code through the done pipe (summary.json and
        final.pt are written) or has exited; waits at most ``timeout`` seconds for either."""
        deadline = time.monotonic() + timeout
        while self.code is None and coord.poll() is None:
            fds = [fd for fd in (self.fd, coord.pidfd) if fd is not None]
            left = max(0.0, deadline - time.monotonic())
            # Without a pidfd (Linux < 5.3) the coordinator's exit is looked at every 50 ms.
            ready = select.select(fds, [], [], left if coord.pidfd is not None else min(left, 0.05))[0]
            if self.fd is not None and self.fd in ready:
                data = os.read(self.fd, 64)
                if data.strip():
                    self.code = int(data.split()[0])
                else:  # EOF, no code: the coordinator ended before its summary; its exit code will tell
                    os.close(self.fd)
                    self.fd = None
            elif not ready and time.monotonic() >= deadline:
                return False
        return True


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
        started_at: unix seconds of the launch, where the run's clock starts (default now).
        resume: the run's ``resume.json`` when it is resumed from its folder (``--resume``).
        data_urls: the data shards' URLs (``--data-redis-url``; [] = step data on the run's Redis),
            handed to the coordinator and workers in ``$RQRL_DATA_REDIS_URL`` (never on a command line).
    """

    def __init__(self, cfg: EasyDict, config_path: str, redis_url: Optional[str], collectors: int,
                 coordinator_args: list[str], run_name: str, out_dir: str = ".", started_at: Optional[float] = None,
                 resume: Optional[dict[str, Any]] = None, data_urls: Sequence[str] = ()) -> None:
        self.cfg = cfg
        self.data_urls = list(data_urls)
        self.config_path = config_path
        self.redis_url = redis_url
        self.collectors = collectors
        self.coordinator_args = coordinator_args
        self.out_dir = Path(out_dir)
        self.run_name = run_name
        self.ns = keys.namespace(cfg.exp_name, run_name)  # the run's keys, and its folder below out_dir
        self.run_dir = self.out_dir / self.ns
        self.log_dir = self.run_dir / "log"
        self.children: dict[str, Child] = {}
        self._spawn: dict[str, tuple[Any, ...]] = {}  # name -> what _fork was given, to start it again
        self.restarts: dict[str, int] = {}
        self.embedded: Optional[EmbeddedRedis] = None
        self.started_at = time.time() if started_at is None else started_at
        self.resume = resume
        self.phases = _Phases(self.ns)
        self._stale_run_id: Optional[bytes] = None
        self._worker_names: list[str] = []
        self._done = _DonePipe()
        # Ends every child (and the private Redis) when this process dies, kill -9 included.
        self._lifeline: Optional[Lifeline] = None

    def _fork(self, name: str, main: Callable[[list[str]], int], argv: list[str], env: dict[str, str],
              path: list[str], nice: int = 0) -> None:
        """Fork a child that runs ``main(argv)`` in its own session, in ``out_dir``, with ``env`` set,
        ``path`` first on ``sys.path``, its niceness raised by ``nice`` and stdout/stderr in
        ``log/{name}.log``; it exits with main's code."""
        self._spawn.setdefault(name, (main, argv, env, path, nice))  # as first started: restarts derive from it
        self.children[name] = fork_child(f"rqrl {name} {self.ns}", main, argv, self.log_dir / f"{name}.log",
                                         self.out_dir, env, path, nice, self._lifeline)

    def run(self) -> int:
        """Launch, follow and tear down; returns the coordinator's exit code (130 on Ctrl-C)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._lifeline = Lifeline()
        # SIGTERM / SIGHUP (kill, timeout, a closed terminal) stop the run like Ctrl-C does.
        previous = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
        # Started in the background by a script (`rqrl train ... &`), this process inherits SIGINT
        # ignored, and Python then installs no handler: `kill -INT` must still stop the run.
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
        mask = None
        try:
            # In the try: a signal pending while blocked is handled as this call unblocks it.
            mask = unblock_stop_signals()
            return self._run()
        except KeyboardInterrupt as e:
            print("\ninterrupted: stopping the run ...", file=sys.stderr)
            coord = self.children.get("coordinator")
            if coord is not None and coord.poll() is None:
                coord.send_signal(signal.SIGINT)
                try:
                    # The coordinator's short closing eval comes before its stop sequence.
                    if self._wrapped_up(20 + closing_eval_seconds(self.cfg, interrupted=True)):
                        self._print_closing_block()
                except KeyboardInterrupt:
                    pass
            return 128 + getattr(e, "signum", signal.SIGINT)
        finally:
            # Once summary.json and final.pt are written, the rest (curve.png, the workers' exit,
            # the private Redis's stop) does not hold up the exit.
            if self._done.code is not None:
                self._teardown_in_background()
            else:
                self._teardown()
                _drop_if_empty(self.run_dir)
            for s, h in previous.items():
                signal.signal(s, h)
            if mask is not None:  # an in-process caller of cli.main(argv) gets its own mask back
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def _prepare(self) -> tuple[str, dict[str, str], list[str], redis.Redis]:
        """Start the private Redis (when no URL was given) and check it; returns its URL, the
        children's environment, the folders first on their ``sys.path`` and a connection."""
        url = self.redis_url
        if url is None:
            self.embedded = EmbeddedRedis().start()
            url = self.embedded.url
            if self._lifeline is not None:  # stops it once no rqrl process is left, however they ended
                self._lifeline.guard(self.embedded.stop)
            print(f"started a private redis-server at {url}", file=sys.stderr)
        self.url = url
        # RQ's --connection-class: `rq worker` then takes rqrl's URLs (redis+sentinel:// too) and retries.
        env = {"RQRL_REDIS_URL": url, "RQ_REDIS_URL": url, "RQ_CONNECTION_CLASS": "common.connection.RQConnection",
               "PYTHONUNBUFFERED": "1"}
        # Modules beside the config file or in the cwd (custom envs, env.import_names) import in every child.
        extra = [str(Path(self.config_path).resolve().parent), os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join([*extra, *filter(None, [os.environ.get("PYTHONPATH", "")])])
        env["RQRL_TORCH_THREADS"] = os.environ.get("RQRL_TORCH_THREADS", "1")
        if self.data_urls:
            env[ENV_DATA_URL] = ",".join(self.data_urls)
        conn = connect_checked(url)
        self.phases.at["redis_up"] = time.time()
        self._stale_run_id = conn.get(keys.run(self.ns))
        warnings = check_memory_settings(conn, self.cfg, "--allow-eviction" in self.coordinator_args, self.collectors)
        for warning in warnings + server_limits.check(conn, self.cfg, self.collectors):  # maxclients, proto-max-bulk-len
            print(f"warning: {warning}", file=sys.stderr)
        return url, env, extra, conn

    def _namespaces(self) -> list[str]:
        """The runs this launcher started (their stop flags are set on the way out)."""
        return [self.ns]

    def _start_workers(self, env: dict[str, str], path: list[str], learners: int, tag: str) -> None:
        """Import torch, gymnasium, the job modules and RQ's CLI here once, then fork ``learners``
        learner workers and the collector workers (one more than collector tasks: the coordinator
        keeps it free, so an eval starts at once), named ``{exp_name}-{tag}{role}{i}-{pid}``."""
        importlib.import_module(_WORKER_CLASS[keys.LEARNER_QUEUE].rpartition(".")[0])
        importlib.import_module("rq.cli")
        stamp = f"{os.getpid()}"
        for i in range(learners):
            name = "learner" if i == 0 else f"learner{i}"
            self._worker_names.append(f"{self.cfg.exp_name}-{tag}{name}-{stamp}")
            self._fork(name, _rq_worker_main, [keys.LEARNER_QUEUE, "-w", _WORKER_CLASS[keys.LEARNER_QUEUE],
                                               "--name", self._worker_names[-1]], env, path)
        for i in range(self.collectors + (1 if self.cfg.commander.eval_task_space > 0 else 0)):
            self._worker_names.append(f"{self.cfg.exp_name}-{tag}collector{i}-{stamp}")
            self._fork(f"collector{i}", _rq_worker_main, [keys.COLLECTOR_QUEUE, "-w", _WORKER_CLASS[keys.COLLECTOR_QUEUE],
                                                          "--name", self._worker_names[-1]],
                       env, path, nice=_collector_nice())

    def _run(self) -> int:
        url, env, extra, conn = self._prepare()
        config_path = str(Path(self.config_path).resolve())
        # The coordinator needs neither torch nor RQ's CLI: it starts while they import here. It
        # alone holds the done pipe's write end (closed here before the workers are forked).
        done_w = self._done.open()
        try:
            self._fork("coordinator", _coordinator_main, [config_path, "--out-dir", ".", "--run-name", self.run_name,
                                                          "--started-at", repr(self.started_at), "--done-fd", str(done_w),
                                                          *self.coordinator_args], env, extra)
        finally:
            os.close(done_w)
        # One learner worker per rank of the learner group (policy.learn.learner_num).
        self._start_workers(env, extra, int(self.cfg.policy.learn.get("learner_num", 1)), "")
        print(f"logs in {self.log_dir}/ ; watch with: rqrl status --redis-url {redact(url)}", file=sys.stderr)
        return self._follow(conn)

    def _follow(self, conn: redis.Redis) -> int:
        prior = float(self.resume.get("wall_seconds") or 0.0) if self.resume else 0.0
        progress = Progress(float(self.cfg.env.stop_value), t0=self.started_at - prior, resume=self.resume,
                            budgets=budgets_of(self.cfg))
        try:
            return self._follow_run(conn, progress)
        finally:
            progress.close()  # a live line stopped by an error or Ctrl-C gives the terminal its cursor back

    def _follow_run(self, conn: redis.Redis, progress: Progress) -> int:
        stream = keys.events(self.ns)
        last_id = b"0"
        t0 = time.time()
        coord = self.children["coordinator"]
        warned: set[str] = set()
        workers_told = False
        # A stop flag left by an earlier run of this experiment is not ours: the coordinator
        # clears it when it starts a fresh run. Only a flag set after that ends this run.
        stale_stop = bool(conn.exists(keys.stop(self.ns)))
        while not self._wrapped_up(0.5 if workers_told else 0.0):
            self.phases.note(conn, self._worker_names, self._stale_run_id)
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
            for name, proc in list(self.children.items()):
                if workers_told:
                    break  # workers exiting now were asked to
                if name != "coordinator" and proc.poll() is not None and name not in warned:
                    again = name.startswith("collector") and self.restarts.get(name, 0) < _MAX_RESTARTS
                    print(f"\nworker {name} exited with code {proc.returncode}; see {self.log_dir / (name + '.log')}"
                          + ("; starting it again" if again else ""), file=sys.stderr)
                    if again:  # a collector worker runs its tasks in-process: an env that crashed it
                        n = self.restarts[name] = self.restarts.get(name, 0) + 1
                        main, argv, env, path, nice = self._spawn[name]
                        # A new RQ worker name: the dead one's key lives on until its TTL ends.
                        argv = [f"{a}-r{n}" if i and argv[i - 1] == "--name" else a for i, a in enumerate(argv)]
                        self._fork(name, main, argv, env, path, nice)
                    else:
                        warned.add(name)
        code = self._done.code if self._done.code is not None else coord.returncode
        # The closing line shows the figures of summary.json (the learner may report a little more
        # after the coordinator's snapshot at the stop): one set of numbers per run.
        summary_path = self.run_dir / "summary.json"
        if summary_path.is_file():
            summary = json.loads(summary_path.read_text())
            progress.from_summary(summary)
            self.phases.record_exit(conn, summary_path, summary)
        progress.show(final=True)
        self._print_closing_block()
        return code

    def _print_closing_block(self) -> None:
        """Print the run's closing block (why it stopped, figures, final.pt, phases) from its
        summary.json, as the coordinator printed it (coordinator/closing.py). A coordinator that
        ended before its summary (e.g. it could not claim the run): the last lines of its log."""
        try:
            summary = json.loads((self.run_dir / "summary.json").read_text())
        except (OSError, ValueError):
            try:
                tail = (self.log_dir / "coordinator.log").read_text(errors="replace").splitlines()
            except OSError:
                return
            last = [scrub(ln, self.url) for ln in tail if ln.strip()][-_LAST_WORDS:]
            print(f"the coordinator ended without a summary; the end of {self.log_dir / 'coordinator.log'}:\n"
                  + "\n".join(f"  {ln}" for ln in last), file=sys.stderr)
            return
        print(closing.render(summary))

    def _wrapped_up(self, timeout: float) -> bool:
        """True once the coordinator has sent its exit code or has exited (waits at most ``timeout`` s)."""
        return self._done.wait(self.children["coordinator"], timeout)

    def _teardown_in_background(self) -> None:
        """Run :meth:`_teardown` in a detached process and return at once.

        That process (its own session, output in ``log/teardown.log``) waits up to
        ``_CURVE_GRACE_S`` for the coordinator, which draws curve.png after its summary, then stops
        the workers (most have exited already: they were told at the stop flag) and the private
        Redis as the foreground teardown does, killing what outlives its deadlines, and exits: no
        process is left behind (:func:`~coordinator.children.run_detached`).
        """

        def teardown() -> None:
            t0 = time.time()
            self._teardown(coordinator_grace_s=_CURVE_GRACE_S)
            print(f"teardown finished in {time.time() - t0:.2f} s (at {time.time():.3f})", flush=True)

        run_detached(f"rqrl teardown {self.ns}", self.log_dir / "teardown.log", teardown)

    def _teardown(self, coordinator_grace_s: float = 0.0) -> None:
        """Stop every child (:func:`~coordinator.children.stop_children`) and the private Redis; with
        ``coordinator_grace_s`` the coordinator first gets that long to exit on its own (it draws
        curve.png after its summary)."""
        coord = self.children.get("coordinator")
        if coordinator_grace_s and coord is not None:
            try:
                coord.wait(timeout=coordinator_grace_s)
            except subprocess.TimeoutExpired:
                print(f"the coordinator did not exit within {coordinator_grace_s:g} s of its summary", flush=True)
        # Workers end their tasks at the stop flag; set it in case the coordinator could not, for
        # runs a coordinator claimed (a run id other than one an earlier run left): a launch
        # refused before that leaves no key behind.
        url = getattr(self, "url", None)
        if url is not None and self.children:
            try:
                c = connect(url, socket_timeout=2)
                for ns in self._namespaces():
                    if c.get(keys.run(ns)) not in (None, self._stale_run_id):
                        c.set(keys.stop(ns), "rqrl is exiting", nx=True)
            except (redis.RedisError, ValueError):
                pass
        stop_children(self.children.values())
        if self.embedded is not None:
            self.embedded.stop()
