"""final.pt (common/policy/export.py) played by ``rqrl eval`` (coordinator/evaluate.py), for any algorithm."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from common import spaces
from common.config import compile_config
from common.policy import create_policy, export
from coordinator import evaluate
from coordinator.cli import main as rqrl_main
from tests.conftest import newest_env_id

SMALL = {
    "dqn": {"hidden_size_list": [16, 16]},
    "ppo": {"encoder_hidden_size_list": [16], "actor_head_hidden_size": 16, "critic_head_hidden_size": 16},
}




def make_policy(algo: str, env_id: str = "CartPole-v1", seed: int = 0):
    cfg = compile_config({"exp_name": f"export_{algo}", "seed": 3, "env": {"env_id": env_id},
                          "policy": {"model": dict(SMALL[algo])}}, {"policy": {"type": algo}})
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    torch.manual_seed(seed)
    return create_policy(cfg, spec, modes=("learn", "collect", "eval"), device="cpu")


def save_bundle(policy, path, train_iter=42):
    torch.save(export.bundle(policy, train_iter), path)
    return path


def play(policy, env_id: str, seed: int, episodes: int) -> list[float]:
    """Episodes played here, independently of coordinator/evaluate.py, by its contract: episode i
    resets with seed + i, the policy's eval randomness draws from one generator seeded with seed."""
    env = gym.make(env_id)
    rng = np.random.default_rng(seed)
    out = []
    try:
        for s in range(seed, seed + episodes):
            obs, _ = env.reset(seed=s)
            ret, done = 0.0, False
            while not done:
                a = policy.act_eval(policy.spec.obs_batch(np.asarray(obs)[None]), rng)[0]
                obs, r, term, trunc, _ = env.step(a)
                ret += float(r)
                done = term or trunc
            out.append(ret)
    finally:
        env.close()
    return out


@pytest.mark.parametrize("algo,env_id", [("dqn", "CartPole-v1"), ("ppo", "CartPole-v1"), ("ppo", "Pendulum-v1"),
                                         ("dqn", "FrozenLake-v1"), ("ppo", newest_env_id("Taxi"))])
def test_final_pt_plays_without_config(tmp_path, algo, env_id):
    policy = make_policy(algo, env_id)
    path = save_bundle(policy, tmp_path / "final.pt")
    result = evaluate.evaluate_checkpoint(path, episodes=2)
    assert len(result.returns) == 2 and len(result.lengths) == 2
    assert result.env_id == env_id and result.seed == 3  # the run's own config came with the file
    assert result.notes == []
    # The same numbers as playing the policy by hand (seeds seed + i, eval randomness from seed).
    assert result.returns == pytest.approx(play(policy, env_id, 3, 2))


def test_final_pt_layout_and_exact_weights(tmp_path):
    for algo in ("dqn", "ppo"):
        policy = make_policy(algo)
        path = save_bundle(policy, tmp_path / f"{algo}.pt", train_iter=17)
        obj = torch.load(path, weights_only=True)
        assert obj["format"] == export.FORMAT and obj["algorithm"] == algo and obj["train_iter"] == 17
        assert obj["env_id"] == "CartPole-v1"
        assert spaces.SpaceSpec.from_dict(obj["spaces"]) == policy.spec
        assert obj["config"]["create"]["policy"]["type"] == algo
        want = policy.get_weights()
        assert set(obj["weights"]) == set(want)
        for k, v in want.items():
            t = obj["weights"][k]
            assert t.dtype == torch.float32
            np.testing.assert_array_equal(t.numpy(), v)
        saved = evaluate.load_saved(path)
        assert saved.kind == f"{algo} policy" and saved.train_iter == 17


def test_rqrl_eval_cli_plays_a_ppo_and_a_dqn_final_pt(tmp_path, capsys):
    for algo in ("ppo", "dqn"):
        path = save_bundle(make_policy(algo), tmp_path / f"{algo}.pt")
        assert rqrl_main(["eval", str(path), "--episodes", "2"]) == 0
        out = capsys.readouterr().out
        assert "return over 2 episodes" in out and "CartPole-v1" in out


def test_nan_weight_refused_by_name(tmp_path, capsys):
    policy = make_policy("ppo")
    obj = export.bundle(policy, 5)
    name = sorted(obj["weights"])[1]
    obj["weights"][name] = obj["weights"][name].clone()
    obj["weights"][name].view(-1)[0] = float("nan")
    path = tmp_path / "final.pt"
    torch.save(obj, path)
    with pytest.raises(evaluate.EvalError, match=name.replace(".", r"\.") + ".*NaN"):
        evaluate.evaluate_checkpoint(path, episodes=1)
    assert rqrl_main(["eval", str(path), "--episodes", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert name in err and len(err.splitlines()) == 1


def test_bare_state_dict_not_matching_default_model_refused_naming_a_tensor(tmp_path):
    # The built-in default is DQN with hidden [128, 128]: a [16, 16] Q-network's tensors do not fit.
    policy = make_policy("dqn")
    path = tmp_path / "bare.pt"
    torch.save(policy.model.state_dict(), path)
    with pytest.raises(evaluate.EvalError) as e:
        evaluate.evaluate_checkpoint(path, episodes=1)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    assert any(f"'{k}'" in msg for k in policy.get_weights()), msg

    # A PPO network's tensors under the default DQN: missing / unexpected names.
    ppo = make_policy("ppo")
    torch.save(ppo.model.state_dict(), path)
    with pytest.raises(evaluate.EvalError) as e:
        evaluate.evaluate_checkpoint(path, episodes=1)
    assert "actor" in str(e.value) or "critic" in str(e.value), str(e.value)


def test_bare_state_dict_of_the_default_model_plays_with_a_note(tmp_path):
    cfg = compile_config({"exp_name": "bare"})
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, modes=("eval",), device="cpu")
    path = tmp_path / "bare.pt"
    torch.save(policy.model.state_dict(), path)
    result = evaluate.evaluate_checkpoint(path, episodes=2, seed=0)
    assert len(result.returns) == 2
    assert any("bare state_dict" in n for n in result.notes)


def test_cartpole_policy_on_acrobot_refused_naming_the_spaces(tmp_path):
    path = save_bundle(make_policy("dqn"), tmp_path / "final.pt")
    other = compile_config({"exp_name": "x", "env": {"env_id": "Acrobot-v1"}})
    with pytest.raises(evaluate.EvalError) as e:
        evaluate.evaluate_checkpoint(path, cfg=other, episodes=1)
    msg = str(e.value)
    assert "\n" not in msg
    assert "spaces" in msg and "Acrobot-v1" in msg and str(path) in msg


def test_cfg_env_section_replaces_the_final_pts_env(tmp_path):
    """Same spaces, another env variant: a shorter time limit shortens every episode."""
    path = save_bundle(make_policy("ppo"), tmp_path / "final.pt")
    other = compile_config({"exp_name": "x", "env": {"env_kwargs": {"max_episode_steps": 5}}})
    result = evaluate.evaluate_checkpoint(path, cfg=other, episodes=2)
    assert all(n <= 5 for n in result.lengths)


class ScalarObsEnv(gym.Env):
    """A float Box observation of shape () (a single number): 'Box observations of any shape'."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.float32(0.5), {}

    def step(self, action):
        return np.float32(0.0), 1.0, True, False, {}


SCALAR_ID = "RqrlTestScalarObs-v0"
if SCALAR_ID not in gym.registry:
    gym.register(id=SCALAR_ID, entry_point=ScalarObsEnv)


def test_final_pt_of_a_scalar_box_observation_plays(tmp_path):
    policy = make_policy("dqn", SCALAR_ID)
    assert policy.spec.obs_shape == () and policy.spec.obs_dim == 1
    path = save_bundle(policy, tmp_path / "final.pt")
    result = evaluate.evaluate_checkpoint(path, episodes=2)
    assert result.returns == [1.0, 1.0]
