"""The Atari wrappers gymnasium lacks: a lost life ends the learner's episode, and FIRE on reset.

Both follow the Atari setup of Mnih et al. 2015 as OpenAI baselines' ``EpisodicLifeEnv`` and
``FireResetEnv`` define it (used by SB3's ``AtariWrapper`` and CleanRL's ``ppo_atari``). The
``env.preset="atari"`` chain (common/envs.py) places them between gymnasium's
``AtariPreprocessing`` (noop starts, frame skip) and the reward clipping / frame stacking::

    AtariPreprocessing -> EpisodicLife [training] -> FireReset -> ClipReward [training] -> FrameStackObservation

so the vector env's autoreset (workers/envs.py), which calls the outermost ``reset()``, continues
the game after a lost life (EpisodicLife), presses FIRE to relaunch play (FireReset) and refills
the frame stack from the continued game; only a real game end runs the noop-start reset.
"""

from __future__ import annotations

from typing import Any, SupportsFloat

import gymnasium as gym

#: ``info`` key set by :class:`EpisodicLife` on every step: True when the game itself ended.
GAME_OVER = "game_over"


def _meanings(env: gym.Env) -> list[str]:
    return list(env.unwrapped.get_action_meanings())


def has_fire(env: gym.Env) -> bool:
    """True when the ALE game's action set has a ``FIRE`` action (CleanRL's condition for FireReset)."""
    return "FIRE" in _meanings(env)


class EpisodicLife(gym.Wrapper):
    """A lost life is terminal for the learner; the game plays on until it is really over.

    ``step``: ``terminated`` is True when the ALE's life counter dropped (and lives remain:
    a game that sits at 0 lives for a few frames ends by its own ``terminated``), besides the
    base env's own ends. ``info["game_over"]`` (:data:`GAME_OVER`, bool) is True only on the
    step where the game itself ended (the base env's terminated or truncated: no lives left, or
    its frame limit); under a vector env's SAME_STEP autoreset that step's info sits in
    ``info["final_info"]``. Summing rewards until ``game_over`` gives whole-game scores.

    ``reset``: after a lost life, continues the same game with one NOOP step (no new noop
    start, lives and score carry on); after a real game end, or when given a ``seed``, resets
    the base env (and so runs its noop starts). Rewards of that NOOP step are not returned, as
    in baselines.

    Args:
        env: an ALE env (``env.unwrapped.ale``), usually inside gymnasium's AtariPreprocessing.

    Raises:
        ValueError: the env's action 0 is not NOOP.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if _meanings(env)[0] != "NOOP":
            raise ValueError(f"EpisodicLife needs action 0 to be NOOP, got {_meanings(env)[0]!r}")
        self._ale = env.unwrapped.ale
        self._lives = 0
        self._game_over = True

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._game_over = bool(terminated or truncated)
        lives = self._ale.lives()
        if 0 < lives < self._lives:
            terminated = True
        self._lives = lives
        info[GAME_OVER] = self._game_over
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        if self._game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the NOOP step itself ended the game
                obs, info = self.env.reset(options=options)
        self._game_over = False
        self._lives = self._ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE once after every reset, for games that wait for it to (re)start play (Breakout's
    ball is served by FIRE): a policy that never fires would otherwise stall the game.

    With :class:`EpisodicLife` inside it, this also relaunches play after each lost life. One
    FIRE step (of the frame-skipped env); baselines also steps action 2, which no ALE game needs
    to start. Apply only where :func:`has_fire`.

    Raises:
        ValueError: the game has no FIRE action.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not has_fire(env):
            raise ValueError(f"FireReset needs a FIRE action; the game has {_meanings(env)}")
        self._fire = _meanings(env).index("FIRE")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.env.reset(seed=seed, options=options)
        obs, _, terminated, truncated, info = self.env.step(self._fire)
        if terminated or truncated:  # FIRE ended the episode (a lost life): start again, unseeded
            obs, info = self.env.reset(options=options)
        return obs, info
