"""The launcher's child processes: forked (not executed), each in its own session with its output in
a log file, stopped as a group, and a teardown that runs detached (coordinator/launcher.py).

Forked so that every child inherits the modules the launcher imported once (torch, gymnasium, RQ).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Iterable, Optional

from setproctitle import setproctitle

from coordinator.lifeline import Lifeline

# Seconds the children have to exit after SIGTERM before their process groups are killed.
STOP_GRACE_S = 15.0


class Child:
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
        """The exit code, or None while it runs. In a process that did not fork it (one started by
        :func:`run_detached`) an ended child reads as -1."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = (self.pid, None) if self._ended() else (0, None)
            if pid:
                self.returncode = -1 if status is None else os.waitstatus_to_exitcode(status)
                if self._pidfd is not None:
                    os.close(self._pidfd)
        return self.returncode

    @property
    def pidfd(self) -> Optional[int]:
        """A pidfd of the process while it runs (readable once it ended), or None (none available)."""
        return self._pidfd if self.returncode is None else None

    def _ended(self) -> bool:
        """Whether the process ended, without waiting for it (it need not be this process's child)."""
        if self._pidfd is not None:
            return bool(select.select([self._pidfd], [], [], 0)[0])
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        return False

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


def unblock_stop_signals() -> set[signal.Signals]:
    """Unblock SIGINT, SIGTERM and SIGHUP in the calling thread (the main one: new threads and
    forked children inherit its mask); returns the mask before, for ``signal.pthread_sigmask(
    signal.SIG_SETMASK, ...)``. A blocked mask survives fork and exec, so a parent that had them
    blocked when it started this process (a supervisor, a thread of a test runner) would leave
    Ctrl-C and ``kill`` pending here for good: the handlers installed here would never run."""
    return signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


def fork_child(title: str, main: Callable[[list[str]], int], argv: list[str], log_path: Path, cwd: Path,
               env: dict[str, str], path: list[str], nice: int = 0, lifeline: Optional[Lifeline] = None) -> Child:
    """Fork a child that runs ``main(argv)`` in its own session, in ``cwd``, with ``env`` set, ``path``
    first on ``sys.path``, its niceness raised by ``nice``, stdout/stderr appended to ``log_path``
    and ``title`` as its name in ps; it exits with main's code."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(log)
        return Child(pid)
    code = 1
    try:
        # Its own name in ps: the inherited command line may carry a --redis-url password.
        setproctitle(title)
        os.setsid()
        if lifeline is not None:
            lifeline.in_child()
        if nice:
            os.nice(nice)
        for s in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _redirect(log)
        sys.stdout.reconfigure(line_buffering=True)
        sys.stderr.reconfigure(line_buffering=True)
        os.chdir(cwd)
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


def run_detached(title: str, log_path: Path, work: Callable[[], None]) -> None:
    """Run ``work()`` in a forked process of its own session (output appended to ``log_path``,
    ``title`` in ps, deaf to the terminal's SIGINT / SIGHUP) and return at once.

    The caller exits right after, so init (or the nearest subreaper) adopts and reaps it; a caller
    that lives on reaps it itself. One fork, not a daemon's two: the exit of a forked copy of the
    launcher (torch imported) takes tens of milliseconds, which a middle process would put first.
    """
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork():
        os.close(log)
        return
    code = 1
    try:
        setproctitle(title)
        os.setsid()
        for s in (signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # the terminal the run was started from is not ours now
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _redirect(log)
        work()
        code = 0
    except BaseException:  # noqa: BLE001  (this process's only way out is os._exit below)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _redirect(log: int) -> None:
    """stdout and stderr to the file descriptor ``log`` (closed), stdin from /dev/null."""
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


def stop_children(children: Iterable[Child]) -> None:
    """SIGTERM to each running child's process group, then SIGKILL to the groups of those still there
    after :data:`STOP_GRACE_S` seconds (the group: an rq worker and the work-horse it forked)."""
    children = list(children)
    for proc in children:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:  # forked a moment ago: not yet the leader of its session
                proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in children:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in children:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        if proc.poll() is None:
            proc.wait(timeout=5)
