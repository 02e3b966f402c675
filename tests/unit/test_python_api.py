"""``rqrl.load`` (rqrl/__init__.py): a saved final.pt acts on single and batched observations."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

import rqrl
from coordinator.evaluate import EvalError
from tests.unit.test_export_eval import make_policy, save_bundle


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_a_loaded_final_pt_acts_greedily_like_the_policy_that_saved_it(tmp_path, algo):
    policy = make_policy(algo)
    agent = rqrl.load(save_bundle(policy, tmp_path / "final.pt", train_iter=42))
    assert (agent.algorithm, agent.env_id, agent.train_iter) == (algo, "CartPole-v1", 42)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    one = agent.act(obs)
    assert np.shape(one) == () and env.action_space.contains(int(one))
    batch = np.stack([env.observation_space.sample() for _ in range(64)])
    actions = agent.act(batch)
    assert actions.shape == (64,)
    if algo == "dqn":  # greedy: the Q-network's argmax, whatever the run's eval epsilon says
        with torch.no_grad():
            q = policy.model(torch.as_tensor(batch, dtype=torch.float32))
        assert (actions == q.argmax(-1).numpy()).all()
    assert (agent.act(batch) == actions).all()  # deterministic: the same actions again


def test_acting_as_the_evals_did_draws_from_the_eval_epsilon(tmp_path):
    policy = make_policy("dqn")
    policy.cfg.policy.eval.eps = 1.0  # every eval action random
    agent = rqrl.load(save_bundle(policy, tmp_path / "final.pt"))
    batch = np.zeros((500, 4), dtype=np.float32)
    greedy = agent.act(batch)
    assert len(set(greedy.tolist())) == 1  # one observation, one greedy action
    sampled = agent.act(batch, deterministic=False, rng=np.random.default_rng(0))
    assert set(sampled.tolist()) == {0, 1}
    again = agent.act(batch, deterministic=False, rng=np.random.default_rng(0))
    assert (again == sampled).all()


def test_a_wrong_observation_shape_and_a_bare_state_dict_are_refused_by_name(tmp_path):
    policy = make_policy("dqn")
    agent = rqrl.load(save_bundle(policy, tmp_path / "final.pt"))
    with pytest.raises(ValueError, match=r"shape \(3,\) for env 'CartPole-v1': expected \(4,\) or a batch \(B, 4\)"):
        agent.act(np.zeros(3))
    bare = tmp_path / "bare.pt"
    torch.save({k: torch.from_numpy(np.asarray(v)) for k, v in policy.get_weights().items()}, bare)
    with pytest.raises(EvalError, match="bare state_dict holds no config"):
        rqrl.load(bare)


def test_the_run_folder_found_after_a_train_is_the_run_not_its_latest_link(tmp_path):
    run = tmp_path / "exp" / "20261202T000000Z-s1"
    (run / "log").mkdir(parents=True)
    (tmp_path / "exp" / "latest").symlink_to(run.name)
    assert rqrl._run_folders(tmp_path) == {run}
