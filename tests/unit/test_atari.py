"""The Atari preset on real ALE games (common/atari.py, common/envs.py): a lost life is terminal for
the learner while the game plays on, FIRE after reset where the game has it, a real game end
resets fully; and the vector env's autoreset continues the game."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from common import atari, envs  # noqa: E402
from common.config import compile_config  # noqa: E402

NOOP, FIRE = 0, 1  # Breakout's action indices


class _Recorder(gym.Wrapper):
    """Sits on the base env, under the preset's wrappers: logs every base reset, action and reward."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.log: list[tuple[str, int, float]] = []

    def reset(self, **kwargs):
        self.log.append(("reset", -1, 0.0))
        return self.env.reset(**kwargs)

    def step(self, action):
        out = self.env.step(action)
        self.log.append(("step", int(action), float(out[1])))
        return out

    def since_reset(self) -> list[tuple[str, int, float]]:
        i = max(i for i, e in enumerate(self.log) if e[0] == "reset")
        return self.log[i + 1:]


def _env(game: str, train: bool, **atari_cfg):
    cfg = compile_config({"env": dict(env_id=f"ALE/{game}-v5", preset="atari", atari=atari_cfg)})
    envs.import_preset(cfg.env)
    rec = _Recorder(gym.make(cfg.env.env_id, **envs.base_kwargs(cfg.env)))
    env = rec
    for wrap in envs.wrappers(cfg.env, train):
        env = wrap(env)
    return env, rec


def test_a_lost_life_is_terminal_for_learning_and_the_game_plays_on():
    env, rec = _env("Breakout", train=True, clip_rewards=False)
    ale = env.unwrapped.ale
    rng = np.random.default_rng(0)
    try:
        env.reset(seed=0)
        games, lives_at_start, life_returns = [], [ale.lives()], [0.0]
        base_resets, steps_at_game_start = 1, len(rec.log)
        while len(games) < 2:
            _, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
            life_returns[-1] += float(reward)
            if not (terminated or truncated):
                continue
            assert terminated and not truncated  # a lost life, or the last one: terminal for the learner
            game_end = info["lives"] == 0
            if game_end:
                # The whole game's raw score is the sum over its lives, all played in one base game.
                raw_score = sum(r for kind, _, r in rec.log[steps_at_game_start:] if kind == "step")
                games.append((lives_at_start, life_returns))
                assert sum(life_returns) == raw_score
            env.reset()
            if game_end:
                base_resets += 1
                steps_at_game_start = len(rec.log)
                lives_at_start, life_returns = [ale.lives()], [0.0]
            else:
                lives_at_start.append(ale.lives())
                life_returns.append(0.0)
            assert sum(kind == "reset" for kind, _, _ in rec.log) == base_resets  # no restart at a lost life
            assert info[atari.GAME_OVER] is game_end
        for lives, returns in games:
            assert lives == [5, 4, 3, 2, 1]  # each life is one learner episode of the same game
            assert len(returns) == 5
    finally:
        env.close()


def test_the_eval_env_plays_whole_games_with_raw_scores():
    env, rec = _env("Breakout", train=False)
    rng = np.random.default_rng(1)
    try:
        env.reset(seed=1)
        ret = 0.0
        while True:
            _, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
            ret += float(reward)
            if terminated or truncated:
                break
        assert info["lives"] == 0 and atari.GAME_OVER not in info  # one episode = one whole game
        assert ret == sum(r for kind, _, r in rec.log if kind == "step")  # unclipped
    finally:
        env.close()


@pytest.mark.parametrize("train", [True, False])
def test_fire_is_pressed_after_reset_in_breakout_so_play_starts(train):
    env, rec = _env("Breakout", train=train)
    try:
        env.reset(seed=0)
        actions = [a for _, a, _ in rec.since_reset()]
        # Noop starts, then FIRE for one frame-skipped step (4 base frames).
        assert actions[-4:] == [FIRE] * 4 and set(actions[:-4]) <= {NOOP}
        # The ball is in play: doing nothing loses a life soon (without FIRE it never would).
        for _ in range(200):
            _, _, terminated, _, info = env.step(NOOP)
            if info["lives"] < 5:
                break
        assert info["lives"] == 4 and terminated == train
        if train:  # after a lost life: one NOOP step and FIRE again, in the same base game
            env.reset()
            actions = [a for _, a, _ in rec.since_reset()]
            assert actions[-8:] == [NOOP] * 4 + [FIRE] * 4 and info["lives"] == env.unwrapped.ale.lives()
    finally:
        env.close()


@pytest.mark.parametrize("game,fires", [("Breakout", True), ("Pong", True), ("Freeway", False)])
def test_fire_reset_follows_the_games_action_set(game, fires):
    # As SB3 and CleanRL: every game whose action set has FIRE gets it (Pong too); Freeway has none.
    env, rec = _env(game, train=True)
    meanings = env.unwrapped.get_action_meanings()
    try:
        env.reset(seed=0)
        assert {meanings[a] for _, a, _ in rec.since_reset()} == ({"NOOP", "FIRE"} if fires else {"NOOP"})
    finally:
        env.close()


def test_fire_reset_can_be_switched_off():
    env, rec = _env("Breakout", train=True, fire_reset=False)
    try:
        env.reset(seed=0)
        assert {a for _, a, _ in rec.since_reset()} == {NOOP}
    finally:
        env.close()


def test_the_real_game_end_resets_the_game_fully():
    env, rec = _env("Breakout", train=True)
    try:
        env.reset(seed=0)
        losses = 0
        for _ in range(1000):
            _, _, terminated, _, info = env.step(NOOP)
            if terminated:
                if info["lives"] == 0:
                    break
                losses += 1
                env.reset()
        assert info["lives"] == 0 and losses == 4 and info[atari.GAME_OVER] is True
        n_resets = sum(kind == "reset" for kind, _, _ in rec.log)
        _, info = env.reset()
        assert sum(kind == "reset" for kind, _, _ in rec.log) == n_resets + 1  # a new base game
        assert env.unwrapped.ale.lives() == 5 and info["episode_frame_number"] <= 4 * 31  # noops + FIRE
    finally:
        env.close()


def test_the_vector_envs_autoreset_continues_the_game_after_a_lost_life():
    from workers.envs import make_vector_env

    cfg = compile_config({"env": dict(env_id="ALE/Breakout-v5", preset="atari")})
    venv = make_vector_env(cfg.env, 2, train=True)
    try:
        _, info = venv.reset(seed=[0, 1])
        lives = info["lives"].copy()
        ends = 0
        for _ in range(300):
            _, _, terminated, truncated, info = venv.step(np.zeros(2, np.int64))
            for i in np.flatnonzero(terminated | truncated):
                final = info["final_info"]
                assert terminated[i] and not final[atari.GAME_OVER][i]  # a lost life, not the game's end
                assert final["lives"][i] == lives[i] - 1
                assert info["lives"][i] == lives[i] - 1  # the reset observation continues that game
                lives[i] -= 1
                ends += 1
            if ends >= 4:
                break
        assert ends >= 4
    finally:
        venv.close()


def test_training_statistics_count_whole_games_not_lives():
    """A lost life is terminal for learning, but the collector's episode statistics end only at
    the real game over (workers.envs.episode_ends reads the episodic-life wrapper's game_over)."""
    from workers.envs import episode_ends

    done = np.array([True, True, False])
    info = {"final_info": {"game_over": np.array([False, True, False]), "_game_over": np.array([True, True, False])}}
    assert episode_ends(done, info).tolist() == [False, True, False]
    assert episode_ends(done, {}).tolist() == [True, True, False]  # envs without lives: done is the end
