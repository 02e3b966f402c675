"""DQN (double by default) with n-step returns: defaults and the epsilon schedule (no torch; see policy.py for the math)."""

from __future__ import annotations

import math
from typing import Any

from easydict import EasyDict

from common.policy.base import Algorithm

CONFIG: dict[str, Any] = dict(
    nstep=3,
    discount_factor=0.97,
    model=dict(hidden_size_list=[128, 128], dueling=True),
    # double: double DQN's target (van Hasselt et al. 2016); False takes the target network's max
    # (Nature DQN, SB3), for side-by-side runs with the plain target.
    learn=dict(batch_size=64, learning_rate=1e-3, target_update_freq=100, huber_delta=1.0, grad_clip_norm=10.0,
               double=True),
    other=dict(eps=dict(type="exp", start=0.95, end=0.1, decay=10000)),
    # Evals act epsilon-greedy with this epsilon (0.05 as Nature DQN's evaluation and CleanRL's
    # dqn evaluate): a greedy policy stuck in a state it never leaves would play until the cut-off.
    eval=dict(eps=0.05),
)


def collect_setting(cfg: EasyDict, info: dict[str, Any]) -> dict[str, Any]:
    """Epsilon from the total env steps ``info["envstep"]``, as DI-engine's DQN ``get_setting_collect``.

    ``exp``: end + (start - end) * exp(-envstep / decay); ``linear``: straight line to end at decay.

    Raises:
        ValueError: ``policy.other.eps.type`` is neither.
    """
    e = cfg.other.eps
    step = max(0, int(info.get("envstep", 0)))
    if e.type == "exp":
        eps = e.end + (e.start - e.end) * math.exp(-step / e.decay)
    elif e.type == "linear":
        eps = e.start + (e.end - e.start) * min(1.0, step / e.decay)
    else:
        raise ValueError(f"policy.other.eps.type must be 'exp' or 'linear', got {e.type!r}")
    return {"eps": float(eps)}


def check_setting(setting: dict[str, Any]) -> None:
    """A collect setting must carry ``eps`` in [0, 1].

    Raises:
        ValueError: naming ``eps``.
    """
    eps = setting.get("eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= eps <= 1.0:
        raise ValueError(f"'collect_setting.eps' = {eps!r} must be in [0, 1]")


ALGORITHM = Algorithm(name="dqn", data_source="replay", policy_class="common.policy.dqn.policy:DQNPolicy",
                      config=CONFIG, collect_setting=collect_setting, check_setting=check_setting,
                      action_kinds=("discrete",))
