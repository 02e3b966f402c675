"""Unit tests for coordinator/evaluate.py (``rqrl eval``): no training, an untrained policy is enough."""

from __future__ import annotations

import importlib.util
import pytest
import torch

from common.config import compile_config
from common.policy import create_policy
from coordinator import evaluate
from coordinator.cli import main as rqrl_main


class NotATensor:
    """Pickled by torch.save; torch.load(weights_only=True) must refuse to build it."""


@pytest.fixture(autouse=True)
def _quiet_sdl(monkeypatch):
    """``--video`` sets SDL variables with setdefault; scope them to the test."""
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    monkeypatch.setenv("SDL_AUDIODRIVER", "dummy")


def make_policy(hidden=(16, 16), dueling=True, seed=0):
    torch.manual_seed(seed)
    cfg = compile_config({"exp_name": "eval_test",
                          "policy": {"model": {"hidden_size_list": list(hidden), "dueling": dueling}}})
    return create_policy(cfg, enable_field=("learn",), device="cpu")


@pytest.fixture
def final_pt(tmp_path):
    """A plain Q-network state_dict, as the coordinator writes final.pt (hidden [16, 16], dueling)."""
    path = tmp_path / "final.pt"
    torch.save(make_policy().model.state_dict(), path)
    return path


@pytest.fixture
def learner_ckpt(tmp_path):
    """A learner checkpoint file: {"policy": policy.state_dict(), "last_iter", "collector_envstep"}."""
    path = tmp_path / "latest.pth"
    torch.save({"policy": make_policy().state_dict(), "last_iter": 7, "collector_envstep": 123}, path)
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
    # The config default is [128, 128]: the sizes were read from the tensors, with a note.
    assert "hidden_size_list [16, 16]" in err


def test_eval_through_rqrl_cli(final_pt, capsys):
    assert rqrl_main(["eval", str(final_pt), "--episodes", "2", "--seed", "3"]) == 0
    assert "return over 2 episodes" in capsys.readouterr().out


def test_learner_checkpoint_gives_same_returns_as_final_pt(final_pt, learner_ckpt):
    a = evaluate.evaluate_checkpoint(final_pt, episodes=2, seed=5)
    b = evaluate.evaluate_checkpoint(learner_ckpt, episodes=2, seed=5)
    assert len(a.returns) == 2 and len(a.lengths) == 2
    assert a.returns == b.returns and a.lengths == b.lengths
    assert all(r > 0 for r in a.returns)  # CartPole pays 1 per step


def test_infers_non_dueling_and_other_sizes(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save(make_policy(hidden=(8,), dueling=False).model.state_dict(), path)
    res = evaluate.evaluate_checkpoint(path, episodes=1)
    assert len(res.returns) == 1
    assert any("dueling False" in n for n in res.notes)


def test_infer_model_reads_shapes():
    state = make_policy(hidden=(24, 12), dueling=True).model.state_dict()
    assert evaluate.infer_model(state, "x") == {"obs_shape": 4, "action_shape": 2, "hidden_size_list": [24, 12],
                                               "dueling": True}


def test_config_file_and_default_episodes(final_pt, tmp_path, capsys):
    cfg = tmp_path / "cfg.py"
    cfg.write_text("main_config = dict(exp_name='e', env=dict(n_evaluator_episode=3),"
                   " policy=dict(model=dict(hidden_size_list=[16, 16])))\n")
    assert evaluate.main([str(final_pt), "--config", str(cfg)]) == 0
    out, err = capsys.readouterr()
    assert "over 3 episodes" in out
    assert "note" not in err  # the config matches the tensors


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


def test_wrong_obs_size_names_tensor(tmp_path, capsys):
    state = make_policy().model.state_dict()
    state["encoder.0.weight"] = torch.zeros(16, 5)
    path = tmp_path / "wide.pt"
    torch.save(state, path)
    assert evaluate.main([str(path)]) == 1
    one_line_error(capsys, str(path), "encoder.0.weight", "CartPole-v1")


def test_wrong_action_count_names_tensor(tmp_path, capsys):
    policy = make_policy()
    state = policy.model.state_dict()
    state["advantage.weight"] = torch.zeros(3, 16)
    state["advantage.bias"] = torch.zeros(3)
    path = tmp_path / "three.pt"
    torch.save(state, path)
    assert evaluate.main([str(path)]) == 1
    one_line_error(capsys, "advantage.weight")


def test_layers_that_do_not_chain_name_tensor(tmp_path, capsys):
    state = make_policy().model.state_dict()
    state["encoder.2.weight"] = torch.zeros(16, 9)
    path = tmp_path / "chain.pt"
    torch.save(state, path)
    assert evaluate.main([str(path)]) == 1
    one_line_error(capsys, "encoder.2.weight")


def test_wrong_bias_shape_names_tensor(tmp_path, capsys):
    state = make_policy().model.state_dict()
    state["encoder.0.bias"] = torch.zeros(7)
    path = tmp_path / "bias.pt"
    torch.save(state, path)
    assert evaluate.main([str(path)]) == 1
    one_line_error(capsys, "encoder.0.bias")


def test_unexpected_tensor_names_it(tmp_path, capsys):
    state = make_policy().model.state_dict()
    state["lstm.weight"] = torch.zeros(2, 2)
    path = tmp_path / "extra.pt"
    torch.save(state, path)
    assert evaluate.main([str(path)]) == 1
    one_line_error(capsys, "lstm.weight")


def test_zero_episodes(final_pt, capsys):
    assert evaluate.main([str(final_pt), "--episodes", "0"]) == 1
    one_line_error(capsys, "--episodes")


def test_unknown_env(final_pt, capsys):
    assert evaluate.main([str(final_pt), "--set", "env.env_id=NoSuchEnv-v0"]) == 1
    one_line_error(capsys, "NoSuchEnv-v0")
