"""Unit tests for coordinator/evaluate.py (``rqrl eval``): no training, an untrained policy is enough."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from common import spaces
from common.config import compile_config
from common.policy import create_policy, export
from common.spaces import SpaceSpec
from coordinator import evaluate
from coordinator.cli import main as rqrl_main


class NotATensor:
    """Pickled by torch.save; torch.load(weights_only=True) must refuse to build it."""


@pytest.fixture(autouse=True)
def _quiet_sdl(monkeypatch):
    """``--video`` sets SDL variables with setdefault; scope them to the test."""
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    monkeypatch.setenv("SDL_AUDIODRIVER", "dummy")


CARTPOLE = SpaceSpec("CartPole-v1", "box", (4,), 0, 0, "discrete", 2, 0, 0, (), ())


def make_policy(algo="dqn", hidden=(16, 16), seed=0, train_steps=3):
    """A policy of ``algo`` with non-default sizes, trained a few steps on random data (so its weights are
    neither the defaults' nor a fresh init's)."""
    torch.manual_seed(seed)
    model = ({"hidden_size_list": list(hidden), "dueling": True} if algo == "dqn"
             else {"encoder_hidden_size_list": list(hidden), "actor_head_hidden_size": 8, "critic_head_hidden_size": 8})
    cfg = compile_config({"exp_name": "eval_test", "policy": {"model": model}}, {"policy": {"type": algo}})
    spaces.check_model(cfg, CARTPOLE)
    policy = create_policy(cfg, CARTPOLE, modes=("learn", "collect"), device="cpu")
    rng = np.random.default_rng(seed)
    for _ in range(train_steps):
        obs = rng.normal(size=(32, 4)).astype(np.float32)
        if algo == "dqn":
            batch = {"obs": obs, "action": rng.integers(0, 2, 32), "reward": np.ones(32, np.float32),
                     "next_obs": obs, "done": np.ones(32, bool), "discount": np.full(32, 0.9, np.float32)}
        else:
            _, rec = policy.act(obs, {}, rng)
            batch = dict(rec, obs=obs, adv=rng.normal(size=32).astype(np.float32),
                         ret=np.ones(32, np.float32))
        policy.learn(batch)
    return policy


@pytest.fixture
def final_pt(tmp_path):
    """A DQN final.pt as the learner exports it (hidden [16, 16]; the defaults are [128, 128])."""
    path = tmp_path / "final.pt"
    torch.save(export.bundle(make_policy(), train_iter=42), path)
    return path


@pytest.fixture
def ppo_final_pt(tmp_path):
    path = tmp_path / "ppo_final.pt"
    torch.save(export.bundle(make_policy("ppo"), train_iter=7), path)
    return path


def one_line_error(capsys, *names):
    err = capsys.readouterr().err.strip()
    assert err.startswith("rqrl eval: error:"), err
    assert "\n" not in err, err
    for n in names:
        assert n in err, (n, err)
    return err


# ---------------------------------------------------------------- happy paths

def test_eval_final_pt_two_episodes(final_pt, capsys):
    assert evaluate.main([str(final_pt), "--episodes", "2"]) == 0
    out, err = capsys.readouterr()
    assert "return over 2 episodes" in out and "±" in out
    assert "CartPole-v1" in out
    assert err == ""  # the final.pt carries its own config: nothing to guess


def test_eval_through_rqrl_cli(final_pt, capsys):
    assert rqrl_main(["eval", str(final_pt), "--episodes", "2", "--seed", "3"]) == 0
    assert "return over 2 episodes" in capsys.readouterr().out


def test_ppo_and_dqn_final_pt_play_alike(final_pt, ppo_final_pt):
    for path in (final_pt, ppo_final_pt):
        res = evaluate.evaluate_checkpoint(path, episodes=2, seed=5)
        assert len(res.returns) == 2 and all(r > 0 for r in res.returns)  # CartPole pays 1 per step


def test_played_policy_is_the_saved_one(tmp_path):
    """Same returns as the exported policy itself, and other ones than a fresh policy of the same seed."""
    trained = make_policy(train_steps=200)
    path = tmp_path / "final.pt"
    torch.save(export.bundle(trained, train_iter=200), path)
    saved = evaluate.load_saved(path)
    assert saved.train_iter == 200
    for k, v in trained.get_weights().items():
        np.testing.assert_array_equal(saved.weights[k].numpy(), v)
    fresh = make_policy(train_steps=0)
    obs = np.random.default_rng(0).normal(size=(512, 4)).astype(np.float32)
    rng = np.random.default_rng
    assert (fresh.act_eval(obs, rng(0)) != trained.act_eval(obs, rng(0))).any()


def test_bare_state_dict_with_the_runs_config(tmp_path, capsys):
    path = tmp_path / "plain.pt"
    torch.save({k: torch.from_numpy(v) for k, v in make_policy().get_weights().items()}, path)
    cfg = tmp_path / "cfg.py"
    cfg.write_text("main_config = dict(exp_name='e', env=dict(n_evaluator_episode=3),"
                   " policy=dict(model=dict(hidden_size_list=[16, 16])))\n")
    assert evaluate.main([str(path), "--config", str(cfg)]) == 0
    assert "over 3 episodes" in capsys.readouterr().out
    # Without the config the default sizes do not fit: the error names a tensor.
    assert evaluate.main([str(path)]) == 1
    one_line_error(capsys, str(path), "encoder.0.weight")


def test_config_env_section_replaces_the_final_pts(final_pt, tmp_path):
    res = evaluate.evaluate_checkpoint(final_pt, episodes=2, overrides=("env.env_kwargs.max_episode_steps=7",))
    assert max(res.lengths) <= 7


def test_seed_is_reproducible(final_pt):
    a = evaluate.evaluate_checkpoint(final_pt, episodes=3, seed=11)
    b = evaluate.evaluate_checkpoint(final_pt, episodes=3, seed=11)
    assert a.returns == b.returns


# ---------------------------------------------------------------- video

def test_gif_video_has_several_frames(final_pt, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "videos" / "cartpole.gif"
    assert evaluate.main([str(final_pt), "--episodes", "2", "--video", str(out)]) == 0
    assert f"video: {out}" in capsys.readouterr().out
    with Image.open(out) as im:
        assert im.format == "GIF"
        assert im.n_frames > 1
        assert im.size == (600, 400)


@pytest.mark.skipif(importlib.util.find_spec("imageio_ffmpeg") is None,
                    reason="MP4 needs the video extra (pip install -e \".[video]\")")
def test_mp4_video_with_the_video_extra(final_pt, tmp_path, capsys):
    """The video extra installs imageio with imageio-ffmpeg (whose wheel ships ffmpeg): an .mp4 is
    written and reads back as an H.264 video of the episode's frames."""
    import imageio.v2 as imageio

    out = tmp_path / "cartpole.mp4"
    assert evaluate.main([str(final_pt), "--episodes", "1", "--video", str(out)]) == 0
    assert f"video: {out}" in capsys.readouterr().out
    assert out.read_bytes()[4:8] == b"ftyp"  # an MP4 container
    reader = imageio.get_reader(str(out))
    try:
        frames = [f for _, f in zip(range(5), reader)]
        assert len(frames) == 5 and frames[0].shape == (400, 600, 3)
        assert reader.get_meta_data()["codec"] == "h264"
    finally:
        reader.close()


def test_mp4_without_writer_suggests_gif(final_pt, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.split(".")[0] in ("imageio", "imageio_ffmpeg", "moviepy") else real(name, *a))
    assert evaluate.main([str(final_pt), "--video", str(tmp_path / "v.mp4")]) == 1
    one_line_error(capsys, "v.mp4", ".gif")
    assert not (tmp_path / "v.mp4").exists()


def test_bad_video_suffix(final_pt, tmp_path, capsys):
    assert evaluate.main([str(final_pt), "--video", str(tmp_path / "v.avi")]) == 1
    one_line_error(capsys, "v.avi", ".gif")


# ---------------------------------------------------------------- errors: one line, exit 1

def test_missing_file(tmp_path, capsys):
    missing = tmp_path / "nope.pt"
    assert evaluate.main([str(missing)]) == 1
    one_line_error(capsys, str(missing), "does not exist")


def test_not_a_torch_file(tmp_path, capsys):
    junk = tmp_path / "junk.pt"
    junk.write_text("definitely not a checkpoint\n" * 10)
    assert rqrl_main(["eval", str(junk)]) == 1
    one_line_error(capsys, str(junk), "weights_only")


def test_pickle_that_weights_only_refuses(tmp_path, capsys):
    bad = tmp_path / "evil.pt"
    torch.save({"obj": NotATensor()}, bad)  # an arbitrary class: refused by weights_only=True
    assert evaluate.main([str(bad)]) == 1
    one_line_error(capsys, str(bad), "weights_only")


def test_torch_file_of_another_layout(tmp_path, capsys):
    other = tmp_path / "other.pt"
    torch.save({"step": 3, "name": "x"}, other)
    assert evaluate.main([str(other)]) == 1
    one_line_error(capsys, str(other), "neither")


def _bare(tmp_path, state, name):
    path = tmp_path / name
    torch.save(state, path)
    cfg = tmp_path / "cfg.py"
    cfg.write_text("main_config = dict(exp_name='e', policy=dict(model=dict(hidden_size_list=[16, 16])))\n")
    return path, cfg


def test_wrong_obs_size_names_tensor(tmp_path, capsys):
    state = {k: torch.from_numpy(v) for k, v in make_policy().get_weights().items()}
    state["encoder.0.weight"] = torch.zeros(16, 5)
    path, cfg = _bare(tmp_path, state, "wide.pt")
    assert evaluate.main([str(path), "--config", str(cfg)]) == 1
    one_line_error(capsys, str(path), "encoder.0.weight", "(16, 5)")


def test_wrong_action_count_names_tensor(tmp_path, capsys):
    state = {k: torch.from_numpy(v) for k, v in make_policy().get_weights().items()}
    state["advantage.weight"] = torch.zeros(3, 16)
    state["advantage.bias"] = torch.zeros(3)
    path, cfg = _bare(tmp_path, state, "three.pt")
    assert evaluate.main([str(path), "--config", str(cfg)]) == 1
    one_line_error(capsys, "advantage.weight")


def test_unexpected_tensor_names_it(tmp_path, capsys):
    state = {k: torch.from_numpy(v) for k, v in make_policy().get_weights().items()}
    state["lstm.weight"] = torch.zeros(2, 2)
    path, cfg = _bare(tmp_path, state, "extra.pt")
    assert evaluate.main([str(path), "--config", str(cfg)]) == 1
    one_line_error(capsys, "lstm.weight")


def test_non_finite_weights_refused(tmp_path, capsys):
    bundle = export.bundle(make_policy(), train_iter=1)
    bundle["weights"]["advantage.bias"][0] = float("nan")
    path = tmp_path / "nan.pt"
    torch.save(bundle, path)
    assert evaluate.main([str(path)]) == 1
    one_line_error(capsys, "non-finite weight advantage.bias", "refusing to evaluate")


def test_policy_of_other_spaces_refused(final_pt, capsys):
    assert evaluate.main([str(final_pt), "--set", "env.env_id=Acrobot-v1"]) == 1
    one_line_error(capsys, "Acrobot-v1", "spaces")


def test_zero_episodes(final_pt, capsys):
    assert evaluate.main([str(final_pt), "--episodes", "0"]) == 1
    one_line_error(capsys, "--episodes")


def test_unknown_env(final_pt, capsys):
    assert evaluate.main([str(final_pt), "--set", "env.env_id=NoSuchEnv-v0"]) == 1
    one_line_error(capsys, "NoSuchEnv-v0")
