"""Work the coordinator's event loop hands to background threads: log output and TensorBoard scalars;
and the writers of what tasks ship (their log lines and scalars, common/logs.py) into the run.

At many collectors the loop digests thousands of events a second; formatting and writing a log
line per task, and building a TensorBoard protobuf per scalar (the commander records 14 per
finished task), would sit between an event and the task that replaces it. Here the loop only
appends to a queue; one thread each does the rest (stdlib ``logging.handlers.QueueListener``
for the logs).
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import queue
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from common import keys


class _RecordQueueHandler(logging.handlers.QueueHandler):
    """Queues the record as it is: the listener's handlers format it (stdlib's ``prepare`` would
    format it on the logging thread, which is the work being moved)."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def offload_logging(logger: logging.Logger) -> Callable[[], None]:
    """Move ``logger``'s handlers behind a queue served by a listener thread.

    Returns:
        A function that stops the listener (writing every queued record first) and gives the
        logger its handlers back; calling it again does nothing.
    """
    handlers = list(logger.handlers)
    q: queue.SimpleQueue = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(q, *handlers, respect_handler_level=True)
    for h in handlers:
        logger.removeHandler(h)
    front = _RecordQueueHandler(q)
    logger.addHandler(front)
    listener.start()

    def restore() -> None:
        if front not in logger.handlers:
            return
        listener.stop()
        logger.removeHandler(front)
        for h in handlers:
            logger.addHandler(h)

    return restore


class DeferredScalars:
    """``add_scalar`` that only queues the scalar; a thread passes the queue to ``writer``
    every ``interval_s`` seconds (each scalar keeps the wall time it was recorded at).

    Args:
        writer: a :class:`common.logs.ScalarWriter` (``add_scalar(tag, value, step, walltime)``,
            ``flush``, ``close``).
    """

    def __init__(self, writer: Any, interval_s: float = 0.5) -> None:
        self._writer = writer
        self._pending: deque[tuple[str, float, int, float]] = deque()
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tensorboard-scalars", daemon=True)
        self._thread.start()

    def add_scalar(self, tag: str, value: float, global_step: int, walltime: float | None = None) -> None:
        """Queue ``value`` under ``tag`` at ``global_step``, stamped ``walltime`` (default now; see
        ScalarWriter.add_scalar)."""
        self._pending.append((tag, value, global_step, time.time() if walltime is None else walltime))

    def _drain(self) -> None:
        while self._pending:
            tag, value, step, walltime = self._pending.popleft()
            self._writer.add_scalar(tag, value, step, walltime=walltime)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._drain()

    def flush(self) -> None:
        """Write what is queued now, then flush the writer."""
        self._drain()
        self._writer.flush()

    def close(self) -> None:
        """Stop the thread, write what is queued and close the writer."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._drain()
        self._writer.close()


def write_shipped_log(run_dir: Path, ev: dict[str, Any]) -> None:
    """Append a task's shipped log lines (a ``log`` event, common/logs.py) to the run folder's
    ``log/{name}/{name}.txt``, where a learner started in the run folder used to write them.

    Raises:
        ValueError: ``name`` is not one plain file name.
    """
    name = keys.check_path_component("log name", str(ev.get("name", "")))
    folder = run_dir / "log" / name
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{name}.txt", "a") as f:
        f.write(str(ev.get("lines", "")) + "\n")


def write_shipped_scalars(tb: Any, ev: dict[str, Any]) -> None:
    """Hand a task's shipped TensorBoard scalars (a ``scalars`` event: a JSON list of
    ``[tag, value, step, walltime]``) to the run's writer, with their own wall times.

    Raises:
        ValueError: the field is not such a list.
    """
    for tag, value, step, walltime in json.loads(ev["scalars"]):
        tb.add_scalar(str(tag), float(value), int(step), walltime=float(walltime))
