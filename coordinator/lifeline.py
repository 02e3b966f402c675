"""Children of ``rqrl train`` that end when it dies, however it dies (``kill -9`` included).

``rqrl train`` forks its coordinator and workers into sessions of their own (a Ctrl-C at the
terminal is handled by ``rqrl train``, which stops the run in order), so neither its process
group nor ``PR_SET_PDEATHSIG`` can take them along: the children must also outlive its normal
exit, which leaves the workers' and the private Redis's stop to a background teardown process.

Two pipes do it, the kernel closing a dead process's ends whatever killed it:

* the **lifeline**: ``rqrl train`` and its teardown process (forked from it) hold the write
  end, each child only the read end, on which a thread of the child blocks. EOF means both are
  gone: the child sends itself SIGTERM (the coordinator stops the run and writes summary.json,
  an rq worker shuts down warm) and, after ``grace_s``, SIGKILLs its own process group (an rq
  worker's work-horse with it).
* the **holders** pipe: every rqrl process (``rqrl train``, the teardown, each child and what
  it forks) holds its write end. A guard process started beside the private redis-server
  blocks on the read end: EOF means no rqrl process is left, and it stops the server (at most
  ``redis_wait_s`` after the lifeline broke, should a child linger).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import Callable

# What a child is given after the lifeline broke before its process group is killed: a
# coordinator's interrupted wrap-up waits at most 10 s for the learner's final checkpoint.
GRACE_S = 15.0


# Set in a child once its lifeline broke, just before the SIGTERM that follows.
_BROKEN = threading.Event()


def broken() -> bool:
    """True once this child's lifeline broke: ``rqrl train`` is gone, its SIGTERM asks for a stop
    within ``grace_s`` and the workers are shutting down too (the coordinator runs no closing eval)."""
    return _BROKEN.is_set()


class Lifeline:
    """The two pipes of the module docstring; made by ``rqrl train`` before its first fork."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.holders_r, self.holders_w = os.pipe()

    def in_child(self, grace_s: float = GRACE_S) -> None:
        """Call first thing in a forked child: it ends within ``grace_s`` seconds of the lifeline
        breaking (a daemon thread waits for it)."""
        os.close(self.w)
        os.close(self.holders_r)
        threading.Thread(target=_watch, args=(self.r, grace_s), name="lifeline", daemon=True).start()

    def guard(self, stop: Callable[[], None], redis_wait_s: float = GRACE_S + 15.0) -> int:
        """Fork the guard process that calls ``stop`` (e.g. the private Redis's stop) once no rqrl
        process holds the holders pipe, or ``redis_wait_s`` seconds after the lifeline broke;
        returns its pid. The guard ignores terminal signals and exits after ``stop``."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            os.setsid()
            for s in (signal.SIGINT, signal.SIGHUP):
                signal.signal(s, signal.SIG_IGN)
            os.close(self.w)
            os.close(self.holders_w)
            _wait_for_no_holders(self.r, self.holders_r, redis_wait_s)
            stop()
            code = 0
        except BaseException:  # noqa: BLE001  (the guard's only way out is os._exit below)
            traceback.print_exc()
        finally:
            os._exit(code)


def _watch(fd: int, grace_s: float) -> None:
    """Block until the lifeline's EOF; then SIGTERM this process and SIGKILL its group after ``grace_s``."""
    while True:
        try:
            if not os.read(fd, 64):
                break
        except InterruptedError:
            continue
    _BROKEN.set()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)  # a timer of last resort: the process normally exits before it fires
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _wait_for_no_holders(lifeline_r: int, holders_r: int, redis_wait_s: float) -> None:
    """Return once the holders pipe reads EOF, or ``redis_wait_s`` seconds after the lifeline did."""
    deadline = None
    fds = [lifeline_r, holders_r]
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = select.select(fds, [], [], timeout)[0]
        if holders_r in ready and not os.read(holders_r, 64):
            return
        if lifeline_r in ready and not os.read(lifeline_r, 64):
            fds.remove(lifeline_r)
            deadline = time.monotonic() + redis_wait_s
        if deadline is not None and time.monotonic() >= deadline:
            return
