"""Text loggers and TensorBoard writers (the seed's build_logger), local or shipped to the coordinator.

The coordinator writes its run folder (``./{exp_name}/{run_name}/``) on its own machine. A task
on another machine (the learner of the many-machines recipe, started from any folder) ships its
log lines and TensorBoard scalars there through Redis, as ``log`` and ``scalars`` events on the
run's events stream (:class:`ShippedLogHandler`, :class:`ShippedScalars`); the coordinator
appends the lines to ``log/{name}/{name}.txt`` and writes the scalars into the run's one
TensorBoard event file (``tensorboard/``), so TensorBoard shows one run per run.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional


def build_logger(log_dir: str | Path, name: str, console: bool = False) -> logging.Logger:
    """A logger writing ``{log_dir}/{name}.txt`` (and stderr when ``console``); idempotent per name."""
    logger = logging.getLogger(f"rqrl.{name}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    path = Path(log_dir)
    path.mkdir(parents=True, exist_ok=True)
    target = str((path / f"{name}.txt").resolve())
    fmt = logging.Formatter("[%(asctime)s] %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    if not any(getattr(h, "baseFilename", None) == target for h in logger.handlers):
        fh = logging.FileHandler(target)
        fh.setFormatter(fmt)
        logger.addHandler(fh)
    if console and not any(getattr(h, "_rqrl_console", False) for h in logger.handlers):
        sh = logging.StreamHandler(sys.stderr)
        sh.setFormatter(fmt)
        sh._rqrl_console = True  # type: ignore[attr-defined]
        logger.addHandler(sh)
    return logger


class ScalarWriter:
    """TensorBoard scalars through tensorboard's own ``EventFileWriter``.

    The same ``add_scalar`` / ``flush`` / ``close`` calls as torch's SummaryWriter, without
    importing torch, so the coordinator starts in a fraction of the time.
    """

    def __init__(self, log_dir: str | Path, flush_secs: float = 10.0) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.log_dir = str(log_dir)
        # A deep queue: add_scalar must not block the coordinator loop on file writes.
        self._writer = EventFileWriter(self.log_dir, max_queue_size=4096, flush_secs=flush_secs)

    def add_scalar(self, tag: str, value: float, global_step: int, walltime: float | None = None) -> None:
        """Record ``value`` (float) under ``tag`` at ``global_step`` (train iterations or env
        steps), stamped ``walltime`` (seconds since the epoch; default now)."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
        self._writer.add_event(Event(wall_time=time.time() if walltime is None else walltime, step=int(global_step),
                                     summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def build_tb_writer(log_dir: str | Path) -> ScalarWriter:
    """A TensorBoard scalar writer on ``log_dir`` (see :class:`ScalarWriter`)."""
    return ScalarWriter(log_dir)


# Seconds a shipping task gathers log lines / scalars into one event (at most one event per
# second each; a warning or an error is sent at once).
SHIP_EVERY_S = 1.0


class ShippedScalars:
    """TensorBoard scalars sent to the coordinator (module docstring): the ``add_scalar`` /
    ``flush`` / ``close`` calls of :class:`ScalarWriter`, gathered for :data:`SHIP_EVERY_S` into
    one ``scalars`` event whose field ``scalars`` is a JSON list of ``[tag, value, step, walltime]``.

    Args:
        conn: the task's Redis connection.
        exp: the run's namespace (common/keys.py).
        task_id, task_type: the task the events belong to (the coordinator ignores other tasks').
    """

    def __init__(self, conn: Any, exp: str, task_id: str, task_type: str) -> None:
        self._conn, self._exp, self._task_id, self._task_type = conn, exp, task_id, task_type
        self._pending: list[list[Any]] = []
        self._lock = threading.Lock()
        self._sent = time.monotonic()

    def add_scalar(self, tag: str, value: float, global_step: int, walltime: Optional[float] = None) -> None:
        """Queue ``value`` under ``tag`` at ``global_step``, stamped ``walltime`` (default now)."""
        with self._lock:
            self._pending.append([tag, float(value), int(global_step), time.time() if walltime is None else walltime])
            due = time.monotonic() - self._sent >= SHIP_EVERY_S
        if due:
            self.flush()

    def flush(self) -> None:
        """Send what is queued as one event."""
        from common import events

        with self._lock:
            batch, self._pending = self._pending, []
            self._sent = time.monotonic()
        if batch:
            events.emit(self._conn, self._exp, "scalars", self._task_id, self._task_type, scalars=json.dumps(batch))

    def close(self) -> None:
        self.flush()


class ShippedLogHandler(logging.Handler):
    """A logging handler that sends formatted lines to the coordinator as ``log`` events (fields
    ``name``: the log's name, ``lines``: newline-joined lines), gathered for :data:`SHIP_EVERY_S`;
    a WARNING or worse is sent at once, and :meth:`flush` / :meth:`close` send the rest."""

    def __init__(self, conn: Any, exp: str, task_id: str, task_type: str, name: str) -> None:
        super().__init__()
        self._conn, self._exp, self._task_id, self._task_type, self._name = conn, exp, task_id, task_type, name
        self._lines: list[str] = []
        self._sent = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record))
            if record.levelno >= logging.WARNING or time.monotonic() - self._sent >= SHIP_EVERY_S:
                self.flush()
        except Exception:  # noqa: BLE001 - logging must not fail the task (stdlib convention)
            self.handleError(record)

    def flush(self) -> None:
        from common import events

        self.acquire()
        try:
            lines, self._lines = self._lines, []
            self._sent = time.monotonic()
        finally:
            self.release()
        if lines:
            events.emit(self._conn, self._exp, "log", self._task_id, self._task_type, name=self._name,
                        lines="\n".join(lines))

    def close(self) -> None:
        try:
            self.flush()
        finally:
            super().close()


def shipped_logger(conn: Any, exp: str, task_id: str, task_type: str, name: str) -> logging.Logger:
    """A logger for one task whose lines go to the coordinator's run folder (``log/{name}/{name}.txt``,
    :class:`ShippedLogHandler`) and to stderr (the worker's own output); release it with
    :func:`close_logger`."""
    logger = logging.getLogger(f"rqrl.{name}.{task_id}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    fmt = logging.Formatter("[%(asctime)s] %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    for handler in (ShippedLogHandler(conn, exp, task_id, task_type, name), logging.StreamHandler(sys.stderr)):
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    return logger


def close_logger(logger: logging.Logger) -> None:
    """Send what a :func:`shipped_logger` still holds and remove its handlers."""
    for handler in list(logger.handlers):
        handler.close()
        logger.removeHandler(handler)
