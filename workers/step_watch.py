"""A collector task whose env hangs inside ``step`` fails, naming the env, instead of stalling the run.

The task's heartbeat thread keeps beating while the main thread is stuck in ``env.step``, so
the coordinator sees a live task until RQ's job timeout (10 minutes), and an eval stuck that way
blocks every later eval. :class:`StepWatch` times each ``env.step`` (deliberate waits, for a
policy or the replay-ratio limiter, are not steps): one that lasts longer than
``policy.collect.collector.step_timeout_s`` is reported at once as the task's ``failed`` event
(the coordinator frees its slot and issues a replacement), and the main thread is interrupted
with :class:`EnvStalled` (SIGUSR2), which frees the worker when the env waits in Python or in an
interruptible system call.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable, Optional


class EnvStalled(Exception):
    """An env made no step for longer than ``step_timeout_s`` (names the env and the setting)."""


class StepWatch:
    """Times ``env.step`` calls from a daemon thread (module docstring).

    Args:
        timeout_s: seconds one ``env.step`` may take; 0 disables the watch.
        env_id: the env, for the message.
        on_stall: called once from the watch's thread with the reason (e.g. emit ``failed``).
    """

    def __init__(self, timeout_s: float, env_id: str, on_stall: Callable[[str], None]) -> None:
        self.timeout_s = float(timeout_s)
        self._env_id = env_id
        self._on_stall = on_stall
        self._since: Optional[float] = None  # monotonic start of the env.step in progress
        self.reason = ""
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._previous: Any = None
        self._main = threading.main_thread().ident

    def __enter__(self) -> "StepWatch":
        if self.timeout_s <= 0:
            return self
        if threading.current_thread() is threading.main_thread():  # only it can take a signal handler
            self._previous = signal.signal(signal.SIGUSR2, self._interrupt)
        self._thread = threading.Thread(target=self._watch, name="step-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()  # its signal, if it sent one, is sent before the handler is restored
        if self._previous is not None:
            signal.signal(signal.SIGUSR2, self._previous)

    def stepping(self) -> None:
        """Call right before ``env.step``."""
        self._since = time.monotonic()

    def stepped(self) -> None:
        """Call right after ``env.step`` returned."""
        self._since = None

    def _interrupt(self, _signum: int, _frame: Any) -> None:
        raise EnvStalled(self.reason)

    def _watch(self) -> None:
        tick = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(tick):
            since = self._since
            if since is None or time.monotonic() - since <= self.timeout_s:
                continue
            self.reason = (f"env {self._env_id!r} made no step for {self.timeout_s:g} s "
                           "(policy.collect.collector.step_timeout_s): a hung env.step")
            self._on_stall(self.reason)
            if self._previous is not None:
                signal.pthread_kill(self._main, signal.SIGUSR2)
            return
