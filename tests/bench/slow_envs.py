"""A latency-bound env for the scaling benchmark (tests/bench/bench_scaling.py): CartPole-v1 whose
every step waits a fixed time first, as a remote simulator or a game client would, so that many
collector worker processes fit on a few cores (the wait holds no CPU).

Registered on import as ``rqrl/SlowCartPole-v1`` (500-step episodes, as CartPole-v1); a config
reaches it from every worker process with ``env.import_names=["tests.bench.slow_envs"]`` and
``env.env_id="rqrl/SlowCartPole-v1"`` (the repository on ``PYTHONPATH``).
``env.env_kwargs.step_latency_s`` sets the wait (seconds, default 0.005).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ENV_ID = "rqrl/SlowCartPole-v1"
STEP_LATENCY_S = 0.005


class SlowCartPole(CartPoleEnv):
    """CartPole whose :meth:`step` sleeps ``step_latency_s`` seconds before it steps."""

    def __init__(self, step_latency_s: float = STEP_LATENCY_S, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_latency_s = float(step_latency_s)

    def step(self, action: Any) -> tuple:
        time.sleep(self.step_latency_s)
        return super().step(action)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=SlowCartPole, max_episode_steps=500, reward_threshold=475.0)
