"""``final.pt``: a policy's acting weights plus what it takes to rebuild and play it.

Layout (a dict, loadable with ``torch.load(path, weights_only=True)``)::

    format      "rqrl-policy/1"
    algorithm   "dqn", "ppo", ...           (create_config.policy.type)
    train_iter  int                         the policy version these weights are
    env_id      str
    spaces      dict                        common.spaces.SpaceSpec.to_dict()
    config      dict                        the run's compiled config (plain values)
    weights     {name: float32 CPU tensor}  Policy.get_weights(), as tensors

``rqrl eval`` rebuilds the policy from ``algorithm``, ``config`` and ``spaces`` alone, so it
needs no algorithm code of its own.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.config import to_plain
from common.policy import algorithm_of
from common.spaces import SpaceSpec

FORMAT = "rqrl-policy/1"


def from_weights(cfg: Any, spec: SpaceSpec, weights: dict[str, np.ndarray], train_iter: int) -> dict[str, Any]:
    """The ``final.pt`` dict for ``weights`` (``Policy.get_weights()`` output) of config ``cfg``."""
    return {"format": FORMAT, "algorithm": algorithm_of(cfg).name, "train_iter": int(train_iter),
            "env_id": cfg.env.env_id, "spaces": spec.to_dict(), "config": to_plain(cfg),
            "weights": {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in weights.items()}}


def bundle(policy: Any, train_iter: int) -> dict[str, Any]:
    """The ``final.pt`` dict of a live policy (see module docstring)."""
    return from_weights(policy.cfg, policy.spec, policy.get_weights(), train_iter)


def to_bytes(obj: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def is_bundle(obj: Any) -> bool:
    """True for a dict in the layout of the module docstring."""
    return isinstance(obj, dict) and obj.get("format") == FORMAT and isinstance(obj.get("weights"), dict)


def load(path: str | Path) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)`` (never unpickles arbitrary objects)."""
    return torch.load(path, map_location="cpu", weights_only=True)
