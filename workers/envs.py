"""Building gymnasium vector envs the way the collector needs them."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from common import envs
from common.spaces import SpaceSpec
from workers.step_watch import EnvStalled


class EnvError(RuntimeError):
    """An env could not be built or misbehaved (names the env id)."""


def make_vector_env(env_cfg: Any, num_envs: int, train: bool = True) -> gym.vector.VectorEnv:
    """A gymnasium vector env of the config's ``env`` section (base env + preset + wrappers, see
    common/envs.py; ``train`` False for eval tasks) with SAME_STEP autoreset, vectorised by
    ``env.manager.type``.

    SAME_STEP makes the step that ends an episode return the *reset* observation, with the true
    final observation in ``info["final_obs"]`` — so every step is a real transition (the default
    NEXT_STEP mode inserts a fake transition after each episode end).

    Raises:
        EnvError: unknown env id, bad kwargs or a bad wrapper, naming ``env_id``.
    """
    env_id = env_cfg.env_id
    try:
        envs.import_preset(env_cfg)
        return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=env_cfg.manager.type,
                            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                            wrappers=envs.wrappers(env_cfg, train), **envs.base_kwargs(env_cfg))
    except Exception as e:  # gymnasium raises several error types for an unknown id
        raise EnvError(f"cannot build env {env_id!r} (config key env.env_id / env.env_kwargs / env.preset / "
                       f"env.wrappers): {type(e).__name__}: {e}") from None


def step(env: gym.vector.VectorEnv, env_id: str, actions: np.ndarray) -> tuple:
    """``env.step(actions)``, with any exception re-raised as :class:`EnvError` naming ``env_id``."""
    try:
        return env.step(actions)
    except EnvStalled:
        raise  # names the env already
    except Exception as e:
        raise EnvError(f"env {env_id!r} raised during step: {type(e).__name__}: {e}") from e


def true_next_obs(next_obs: np.ndarray, done: np.ndarray, info: dict[str, Any], spec: SpaceSpec) -> np.ndarray:
    """Replace reset observations of finished envs by their final observations (SAME_STEP mode).

    ``next_obs`` is already in stored form (``spec.obs_batch``); so is the result.
    """
    if not done.any():
        return next_obs
    out = next_obs.copy()
    for i in np.flatnonzero(done):
        out[i] = spec.obs_batch(np.asarray(info["final_obs"][i])[None])[0]
    return out


def check_finite(env_id: str, *arrays: np.ndarray) -> None:
    """Raise :class:`EnvError` when an env returned NaN or inf (the data would poison training)."""
    for a in arrays:
        if not np.all(np.isfinite(a)):
            raise EnvError(f"env {env_id!r} returned a non-finite value (NaN or inf)")


def episode_ends(done: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """Where an episode really ended: ``done`` bool (E,), except where the env says its game goes
    on (a life lost under the Atari preset's episodic-life wrapper, common/atari.py: terminal for
    learning, ``info["game_over"]`` False). Training statistics count whole games with it."""
    final = info.get("final_info")
    if not done.any() or not isinstance(final, dict) or "game_over" not in final:
        return done
    known = np.asarray(final.get("_game_over", np.ones_like(done)), bool)
    return done & ~(known & ~np.asarray(final["game_over"], bool))
