"""DQN's torch-free half: its default config and its command mode (the epsilon schedule).

Kept apart from common/policy/dqn.py so the coordinator (config compilation, the commander)
never imports torch: that import costs seconds of CPU on every start.
"""

from __future__ import annotations

import math
from typing import Any

from easydict import EasyDict

from common.registry import COMMAND_REGISTRY

DQN_CONFIG: dict[str, Any] = dict(
    cuda=False,
    nstep=3,
    discount_factor=0.97,
    model=dict(obs_shape=4, action_shape=2, hidden_size_list=[128, 128], dueling=True),
    learn=dict(
        batch_size=64,
        learning_rate=1e-3,
        target_update_freq=100,
        huber_delta=1.0,
        grad_clip_norm=10.0,
        # Replay-ratio limiter: at most this many train iterations per env step received.
        train_iter_per_env_step=0.5,
        # ... and collectors wait once they are this many env steps ahead of that ratio.
        max_env_step_lead=256,
        learner=dict(
            train_iterations=1_000_000_000,
            log_policy=True,
            send_policy_freq=4,  # publish weights every N train iterations
            send_info_freq=20,  # learner info event every N train iterations
            hook=dict(
                load_ckpt_before_run="",  # checkpoint name in Redis ("latest", ...); "" = none
                log_show_after_iter=100,
                save_ckpt_after_iter=500,
                save_ckpt_after_run=True,
            ),
        ),
    ),
    collect=dict(
        n_sample=128,  # transitions per step-data chunk (one blob + one stream entry)
        collector=dict(
            task_env_steps=1000,  # env steps per collector task
            data_ttl=600,  # seconds a step-data blob lives in Redis
            torch_threads=1,
            policy_wait_s=120.0,  # seconds a task waits for the learner's first policy
        ),
    ),
    eval=dict(evaluator=dict(max_episode_seconds=60.0)),
    other=dict(
        eps=dict(type="exp", start=0.95, end=0.1, decay=10000),
        replay_buffer=dict(replay_buffer_size=20000, replay_start_size=256),
    ),
)


@COMMAND_REGISTRY.register("dqn")
class DQNCommandMode:
    """The command mode of DQN: collect settings for the commander (as DI-engine's ``command_mode``)."""

    config = DQN_CONFIG

    def __init__(self, cfg: EasyDict) -> None:
        self._cfg = cfg

    @classmethod
    def default_config(cls) -> dict[str, Any]:
        import copy

        return copy.deepcopy(cls.config)

    @property
    def command_mode(self) -> "DQNCommandMode":
        """Itself: the same ``policy.command_mode`` access as on a full policy."""
        return self

    def get_setting_collect(self, info: dict[str, Any]) -> dict[str, Any]:
        """Epsilon from the total env steps ``info["envstep"]``, as DI-engine's ``get_setting_collect``.

        ``exp``: end + (start - end) * exp(-envstep / decay); ``linear``: straight line to end at decay.
        """
        e = self._cfg.other.eps
        step = max(0, int(info.get("envstep", 0)))
        if e.type == "exp":
            eps = e.end + (e.start - e.end) * math.exp(-step / e.decay)
        elif e.type == "linear":
            eps = e.start + (e.end - e.start) * min(1.0, step / e.decay)
        else:
            raise ValueError(f"policy.other.eps.type must be 'exp' or 'linear', got {e.type!r}")
        return {"eps": float(eps)}
