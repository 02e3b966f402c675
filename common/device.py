"""The torch device a policy runs on, from the config's ``policy.cuda`` (shared by the algorithms
and by the learner, which must know it before the policy exists: a learner group's ranks pick
their GPU and backend from it)."""

from __future__ import annotations

from typing import Any

import torch


def pick_device(cfg: Any, device: str | None) -> torch.device:
    """``device`` if given, else from ``policy.cuda``: True -> CUDA, "auto" -> CUDA when it exists, False -> CPU.

    Raises:
        RuntimeError: ``policy.cuda=True`` on a machine without CUDA (named, with the way out).
    """
    if device is None:
        want = cfg.policy.cuda
        if want is True and not torch.cuda.is_available():
            raise RuntimeError("config key 'policy.cuda' is True but this machine has no CUDA device "
                               f"(torch {torch.__version__}); set policy.cuda=False, or 'auto' to use CUDA where it exists")
        device = "cuda" if want is True or (want == "auto" and torch.cuda.is_available()) else "cpu"
    return torch.device(device)
