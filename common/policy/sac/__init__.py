"""Soft Actor-Critic for Box actions: defaults and collect setting (no torch; see policy.py).

Defaults follow DI-engine's ``dizoo/classic_control/pendulum/config/pendulum_sac_config.py``:
twin critics, hidden 128, batch 128, learning rates 1e-3 (critics, actor) and 3e-4 (alpha),
Polyak 0.005, discount 0.99, automatic entropy tuning, random actions for the first
``replay_start_size`` env steps.
"""

from __future__ import annotations

from typing import Any

from easydict import EasyDict

from common.policy.base import Algorithm

CONFIG: dict[str, Any] = dict(
    nstep=1,
    discount_factor=0.99,
    model=dict(actor_hidden_size_list=[128, 128], critic_hidden_size_list=[128, 128]),
    learn=dict(
        batch_size=128,
        learning_rate_q=1e-3,
        learning_rate_policy=1e-3,
        learning_rate_alpha=3e-4,
        target_theta=0.005,  # Polyak factor of the target critics
        init_temperature=0.2,
        auto_alpha=True,  # tune alpha towards the target entropy -|A|
        grad_clip_norm=0.0,
    ),
    other=dict(replay_buffer=dict(replay_buffer_size=100_000, replay_start_size=1000)),
)


def collect_setting(cfg: EasyDict, info: dict[str, Any]) -> dict[str, Any]:
    """Uniformly random actions until ``replay_start_size`` env steps were collected (as DI-engine's
    ``random_collect_size``), then samples of the current policy."""
    return {"random": int(info.get("envstep", 0)) < int(cfg.other.replay_buffer.replay_start_size)}


ALGORITHM = Algorithm(name="sac", data_source="replay", policy_class="common.policy.sac.policy:SACPolicy",
                      config=CONFIG, collect_setting=collect_setting, action_kinds=("box",))
