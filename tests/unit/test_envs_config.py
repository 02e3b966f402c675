"""The env section's preset and wrappers (common/envs.py): what training and eval envs get, and bad input."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from common import envs, spaces
from common.config import ConfigError, compile_config
from tests.conftest import REPO


def _cfg(**env):
    return compile_config({"env": env})


def test_the_atari_preset_builds_training_and_eval_envs_from_one_base():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    cfg = _cfg(env_id="ALE/Pong-v5", preset="atari")
    train, evaluate = envs.make(cfg.env, train=True), envs.make(cfg.env, train=False)
    try:
        for env in (train, evaluate):
            assert env.observation_space.shape == (4, 84, 84) and env.observation_space.dtype == np.uint8
            base = env.unwrapped
            assert base._frameskip == 1 and base.ale.getFloat("repeat_action_probability") == 0.25  # the wrapper skips
        chain = lambda e: [type(w).__name__ for w in _chain(e)]  # noqa: E731
        # Pong has a FIRE action, so both get FireReset; life loss and clipping are for training only.
        assert chain(train) == ["FrameStackObservation", "ClipReward", "FireReset", "EpisodicLife", "AtariPreprocessing"]
        assert chain(evaluate) == ["FrameStackObservation", "FireReset", "AtariPreprocessing"]
        # gymnasium's own life-loss option restarts the game at every lost life: EpisodicLife replaces it.
        assert _find(train, "AtariPreprocessing").terminal_on_life_loss is False
        spec = spaces.probe(cfg)
        assert (spec.obs_kind, spec.obs_layout, spec.action_n) == ("image", "chw", 6)
    finally:
        train.close()
        evaluate.close()


def _chain(env):
    out = []
    while hasattr(env, "env"):
        if type(env).__name__ in ("FrameStackObservation", "ClipReward", "FireReset", "EpisodicLife", "AtariPreprocessing"):
            out.append(env)
        env = env.env
    return out


def _find(env, name):
    return next(w for w in _chain(env) if type(w).__name__ == name)


def test_config_wrappers_apply_in_order_and_train_only_ones_skip_eval():
    cfg = _cfg(env_id="CartPole-v1", wrappers=[
        dict(type="gymnasium.wrappers:ClipReward", kwargs=dict(min_reward=0.0, max_reward=0.5), train_only=True),
        dict(type="gymnasium.wrappers:TimeAwareObservation")])
    train, evaluate = envs.make(cfg.env, train=True), envs.make(cfg.env, train=False)
    assert type(train).__name__ == "TimeAwareObservation" and type(train.env).__name__ == "ClipReward"
    assert type(evaluate.env).__name__ != "ClipReward"
    train.reset(seed=0)
    assert train.step(0)[1] == 0.5
    assert spaces.probe(cfg).obs_shape == (5,)  # the wrapper's space is what the policy sees


@pytest.mark.parametrize("env,words", [
    (dict(preset="doom"), "env.preset"),
    (dict(preset="atari", env_kwargs=dict(frameskip=4)), "env.env_kwargs.frameskip"),
    (dict(wrappers=["gymnasium.wrappers:ClipReward"]), r"env.wrappers\[0\]"),
    (dict(wrappers=[dict(type="ClipReward")]), r"env.wrappers\[0\]"),
    (dict(wrappers=[dict(type="a:B", kwarg={})]), r"env.wrappers\[0\]"),
])
def test_bad_env_sections_are_refused_in_one_line(env, words):
    with pytest.raises(ConfigError, match=words) as e:
        _cfg(**env)
    assert "\n" not in str(e.value)


def test_a_wrapper_that_cannot_be_imported_is_named_by_its_key():
    cfg = _cfg(wrappers=[dict(type="gymnasium.wrappers:NoSuchWrapper")])
    with pytest.raises(spaces.SpaceError, match=r"env.wrappers\[0\].type.*NoSuchWrapper"):
        spaces.probe(cfg)


@pytest.mark.parametrize("path", sorted((REPO / "deploy" / "configs").glob("*.py")), ids=lambda p: p.name)
def test_no_shipped_config_cuts_episodes(path):
    """Under rqrl train (envs kept on the collector workers) nothing in a shipped config ends an
    episode before the env does: no eval env-step cap below the eval's episodes."""
    from common.config import load_config
    from common.envs import cut_warnings

    if path.name.startswith("minatar_") and importlib.util.find_spec("minatar") is None:
        pytest.skip("the minatar extra is not installed (the floors' environment has none)")
    warnings, _ = cut_warnings(load_config(path))
    assert warnings == []


def test_an_eval_cap_below_the_episodes_is_warned_about_and_short_tasks_noted():
    from common.config import compile_config
    from common.envs import cut_warnings

    cfg = compile_config({"policy": {"eval": {"evaluator": {"max_env_steps": 5000}},
                                     "collect": {"collector": {"task_env_steps": 1000}}}})
    warnings, notes = cut_warnings(cfg)  # CartPole-v1: 500-step episodes, 20 in a confirmation eval
    assert warnings == ["config key 'policy.eval.evaluator.max_env_steps' = 5,000 can cut evals short: an eval plays "
                        "20 episodes of up to 500 env steps (env.n_evaluator_episode, commander.confirm_eval_episodes)"]
    assert len(notes) == 1 and "after 125 env steps per env" in notes[0] and "shorter than the env's 500" in notes[0]
    assert cut_warnings(compile_config({})) == ([], [])
