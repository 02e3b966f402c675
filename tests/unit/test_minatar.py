"""MinAtar out of the box (common/envs.py, common/spaces.py, common/seeding.py): its ids build
without an import of the user's, its bool grids are image channels, rqrl's env seeds fit its
32-bit RandomState, and the shipped configs take a DQN and a PPO learning step on it.

Needs the ``minatar`` extra (``pip install minatar --no-deps`` is enough); the tests that do not
build a MinAtar env run without it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from common import envs, seeding, spaces
from common.config import load_config
from common.policy import algorithm_of, create_policy, export
from tests.conftest import REPO
from workers.envs import make_vector_env, true_next_obs
from workers.replay_buffer import ReplayBuffer

needs_minatar = pytest.mark.skipif(importlib.util.find_spec("minatar") is None,
                                   reason="minatar not installed (pip install minatar --no-deps)")
DQN_CONFIG = REPO / "deploy" / "configs" / "minatar_breakout_dqn.py"
PPO_CONFIG = REPO / "deploy" / "configs" / "minatar_space_invaders_ppo.py"
BIG_TASK_SEED = 2**63 - 1  # task seeds are 63-bit


def test_env_seeds_are_32_bit_independent_and_reproducible():
    seeds = [s for n in range(1, 100) for s in seeding.env_seeds(seeding.task_seed(2**40, n), 8)]
    assert all(0 <= s < 2**32 for s in seeds)
    assert len(set(seeds)) == len(seeds)
    assert seeding.env_seeds(BIG_TASK_SEED, 3) == seeding.env_seeds(BIG_TASK_SEED, 3)
    assert seeding.episode_seed(5, 2) == 7 and seeding.episode_seed(2**32 - 1, 1) == 0


@needs_minatar
def test_a_minatar_id_builds_in_a_fresh_process_with_no_import_of_minatar_by_the_user():
    code = ("import sys; from common.config import compile_config; from common import spaces; "
            "assert 'minatar' not in sys.modules; "
            "spec = spaces.probe(compile_config({'env': {'env_id': 'MinAtar/Breakout-v1'}})); "
            "print(spec.obs_kind, spec.obs_layout, spec.obs_shape, spec.image_high, spec.action_n)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["image", "hwc", "(10,", "10,", "4)", "1.0", "3"]
    assert "seaborn" not in out.stderr  # MinAtar's own import-time warnings are not ours to show


def test_a_missing_minatar_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(gym, "registry", {k: v for k, v in gym.registry.items() if not k.startswith("MinAtar/")})
    monkeypatch.setitem(sys.modules, "minatar", None)  # import minatar raises ImportError
    monkeypatch.setitem(sys.modules, "minatar.gym", None)
    cfg = load_config(DQN_CONFIG)
    with pytest.raises(envs.EnvConfigError, match=r"'env.env_id' is 'MinAtar/Breakout-v1' but minatar is not "
                                                  r"installed .*pip install 'rqrl\[minatar\]'") as e:
        envs.make(cfg.env, train=True)
    assert "\n" not in str(e.value)


@needs_minatar
def test_rqrls_env_seeds_reach_minatar_where_63_bit_ones_are_refused():
    cfg = load_config(DQN_CONFIG)
    env = make_vector_env(cfg.env, 4)
    try:
        obs, _ = env.reset(seed=seeding.env_seeds(BIG_TASK_SEED, 4))
        assert obs.dtype == np.bool_ and obs.shape == (4, 10, 10, 4)
        again, _ = env.reset(seed=seeding.env_seeds(BIG_TASK_SEED, 4))
        np.testing.assert_array_equal(obs, again)
    finally:
        env.close()
    single = envs.make(cfg.env, train=True)
    with pytest.raises(ValueError, match="2\\*\\*32"):  # why env seeds are 32-bit: MinAtar's RandomState
        single.reset(seed=2**40)
    single.close()


def _collect(cfg, policy, spec, setting, env_num, rows_wanted, rng):
    """A few env steps of the config's MinAtar env through common/envs.py, as rows of the policy's adder."""
    env = make_vector_env(cfg.env, env_num)
    try:
        obs, _ = env.reset(seed=seeding.env_seeds(BIG_TASK_SEED, env_num))
        obs = spec.obs_batch(obs)
        adder, parts, got = policy.make_adder(env_num, setting), [], 0
        while got < rows_wanted:
            env_action, record = policy.act(obs, setting, rng)
            nxt, reward, terminated, truncated, info = env.step(env_action)
            nxt = spec.obs_batch(nxt)
            rows = adder.add(obs, record, reward, true_next_obs(nxt, terminated | truncated, info, spec), terminated,
                             truncated)
            if rows is not None:
                parts.append(rows)
                got += len(rows["obs"])
            obs = nxt
    finally:
        env.close()
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


@needs_minatar
def test_the_breakout_dqn_config_takes_a_learning_step_on_minatar():
    torch.manual_seed(0)
    cfg = load_config(DQN_CONFIG)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    assert (spec.obs_kind, spec.obs_layout, spec.image_high, spec.action_n) == ("image", "hwc", 1.0, 6)
    policy = create_policy(cfg, spec, device="cpu")
    schema = policy.schema()
    assert schema["obs"] == ((10, 10, 4), np.uint8)
    rng = np.random.default_rng(0)
    setting = algorithm_of(cfg).collect_setting(cfg.policy, {"envstep": 0, "train_iter": 0, "collectors": 1})
    assert setting["eps"] == 1.0  # epsilon starts at 1 (MinAtar's dqn.py)
    rows = _collect(cfg, policy, spec, setting, 4, 64, rng)
    assert rows["obs"].dtype == np.uint8 and set(np.unique(rows["obs"])) <= {0, 1} and rows["obs"].any()
    buf = ReplayBuffer(1000, schema)
    buf.extend(rows)
    before = {k: v.copy() for k, v in policy.get_weights().items()}
    info = policy.learn(buf.sample(int(cfg.policy.learn.batch_size), rng))
    assert np.isfinite(info["total_loss"])
    after = policy.get_weights()
    assert any(not np.array_equal(before[k], after[k]) for k in after)
    conv = [k for k in after if k.endswith("weight") and after[k].ndim == 4]
    assert [after[k].shape for k in conv] == [(16, 4, 3, 3)]  # the paper's one conv of 16 3x3 filters


@needs_minatar
def test_the_space_invaders_ppo_config_takes_a_learning_step_on_minatar():
    torch.manual_seed(0)
    cfg = load_config(PPO_CONFIG)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    assert (spec.obs_kind, spec.obs_shape, spec.image_high) == ("image", (10, 10, 6), 1.0)
    policy = create_policy(cfg, spec, device="cpu")
    rng = np.random.default_rng(1)
    setting = algorithm_of(cfg).collect_setting(cfg.policy, {"envstep": 0, "train_iter": 0, "collectors": 8})
    rollout = _collect(cfg, policy, spec, setting, 4, setting["rollout_rows"], rng)
    assert rollout["obs"].dtype == np.uint8 and len(rollout["obs"]) >= 128
    before = {k: v.copy() for k, v in policy.get_weights().items()}
    info = policy.learn(rollout)
    assert np.isfinite(info["total_loss"])
    assert any(not np.array_equal(before[k], v) for k, v in policy.get_weights().items())


@needs_minatar
def test_rqrl_eval_plays_a_minatar_policy_with_a_seed_past_32_bits(tmp_path):
    from coordinator import evaluate

    cfg = load_config(DQN_CONFIG)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    path = tmp_path / "final.pt"
    torch.save(export.bundle(create_policy(cfg, spec, device="cpu"), train_iter=0), path)
    result = evaluate.evaluate_checkpoint(path, episodes=2, seed=2**40)
    assert len(result.returns) == 2 and all(np.isfinite(result.returns))
