"""Text loggers and TensorBoard writers under ``./{exp_name}/log/{name}`` (the seed's build_logger)."""

from __future__ import annotations

import logging
import sys
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


def build_tb_writer(log_dir: str | Path):
    """torch's SummaryWriter on ``log_dir`` (imported lazily: tensorboard is heavy)."""
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(str(log_dir))
