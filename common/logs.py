"""Text loggers and TensorBoard writers under ``./{exp_name}/log/{name}`` (the seed's build_logger)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path


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
