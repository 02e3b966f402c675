"""Unit tests for common/policy/ppo: GAE adder, acting in Box bounds, learn step, weights, collect setting."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal

from common import spaces
from common.config import compile_config
from common.policy import create_policy, get_algorithm
from common.policy.ppo import collect_setting

GAMMA, LAM = 0.9, 0.95




def ppo_cfg(env_id="CartPole-v1", model=None, learn=None, collect=None):
    m = {"encoder_hidden_size_list": [16, 16], "actor_head_hidden_size": 16, "critic_head_hidden_size": 16}
    m.update(model or {})
    c = {"discount_factor": GAMMA, "gae_lambda": LAM}
    c.update(collect or {})
    return compile_config({"exp_name": "ppo_test", "env": {"env_id": env_id},
                           "policy": {"model": m, "learn": learn or {}, "collect": c}},
                          {"policy": {"type": "ppo"}})


def make_policy(env_id="CartPole-v1", seed=0, modes=("learn", "collect", "eval"), **kw):
    cfg = ppo_cfg(env_id, **kw)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    torch.manual_seed(seed)
    return create_policy(cfg, spec, modes=modes, device="cpu")


# ---------------------------------------------------------------- GAE adder

# Observations carry an id in column 0; V(id) is fixed by this table (monkeypatched ``values``),
# so the expected advantages below do not depend on the network or on the adder's own code.
V = {1: 0.5, 2: 1.0, 3: 7.0, 4: -0.3, 5: 2.0, 11: 0.2, 12: 3.0, 13: 0.4, 14: 0.6, 15: -1.0}


def ob(*ids):
    o = np.zeros((len(ids), 4), np.float32)
    o[:, 0] = ids
    return o


def fake_values(obs):
    return np.array([V[int(round(x))] for x in np.asarray(obs)[:, 0]], np.float32)


def record_for(obs):
    n = len(obs)
    return {"action": np.zeros(n, np.int64), "logp": np.full(n, -0.7, np.float32), "value": fake_values(obs)}


def test_gae_adder_matches_hand_computed_gae_with_termination_and_truncation(monkeypatch):
    """2 envs x 3 steps. env 0: obs 1 -> 2 -> terminated (final obs 3) ; reset obs 4 -> 5.
    env 1: obs 11 -> truncated (final obs 12) ; reset obs 13 -> 14 -> 15."""
    policy = make_policy()
    monkeypatch.setattr(policy, "values", fake_values)
    adder = policy.make_adder(2, {"rollout_rows": 6})
    assert adder.horizon == 3
    F, T = False, True
    # (obs, reward, true next obs, terminated, truncated) per step
    steps = [
        (ob(1, 11), [1.0, 1.5], ob(2, 12), [F, F], [F, T]),
        (ob(2, 13), [2.0, -1.0], ob(3, 14), [T, F], [F, F]),
        (ob(4, 14), [0.5, 0.7], ob(5, 15), [F, F], [F, F]),
    ]
    out = None
    for t, (obs, rew, nxt, term, trunc) in enumerate(steps):
        out = adder.add(obs, record_for(obs), np.array(rew, np.float32), nxt, np.array(term), np.array(trunc))
        if t < 2:
            assert out is None
    assert out is not None

    # By hand, g = 0.9, gl = 0.9 * 0.95 = 0.855; rows are ordered (t0 e0, t0 e1, t1 e0, t1 e1, t2 e0, t2 e1).
    # env 0: t2: d = 0.5 + 0.9*V5(2.0) - V4(-0.3)                 = 2.6     adv 2.6
    #        t1: terminated, no bootstrap: d = 2.0 - V2(1.0)       = 1.0     adv 1.0 (episode ends)
    #        t0: d = 1.0 + 0.9*V2(1.0) - V1(0.5) = 1.4;                      adv 1.4 + 0.855*1.0 = 2.255
    # env 1: t2: d = 0.7 + 0.9*V15(-1.0) - V14(0.6)               = -0.8    adv -0.8
    #        t1: d = -1.0 + 0.9*V14(0.6) - V13(0.4) = -0.86;                 adv -0.86 + 0.855*-0.8 = -1.544
    #        t0: truncated, bootstrap from its final obs: d = 1.5 + 0.9*V12(3.0) - V11(0.2) = 4.0   adv 4.0
    adv = np.array([2.255, 4.0, 1.0, -1.544, 2.6, -0.8], np.float32)
    value = np.array([0.5, 0.2, 1.0, 0.4, -0.3, 0.6], np.float32)
    np.testing.assert_allclose(out["adv"], adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["value"], value)
    np.testing.assert_allclose(out["ret"], adv + value, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["obs"][:, 0], [1, 11, 2, 13, 4, 14])
    assert set(out) == set(policy.schema())
    for name, (shape, dtype) in policy.schema().items():
        assert out[name].shape == (6, *shape) and out[name].dtype == dtype, name
    # The adder starts a fresh segment afterwards.
    assert adder.flush(ob(5, 15)) is None


def test_gae_adder_flush_bootstraps_a_short_segment(monkeypatch):
    policy = make_policy()
    monkeypatch.setattr(policy, "values", fake_values)
    adder = policy.make_adder(2, {"rollout_rows": 100})
    assert adder.horizon == 50
    F = False
    assert adder.add(ob(1, 11), record_for(ob(1, 11)), np.array([1.0, 2.0], np.float32), ob(2, 13),
                     np.array([F, F]), np.array([F, F])) is None
    # The task ended at obs (2, 13): not terminal, both bootstrap from V(obs).
    out = adder.flush(ob(2, 13))
    # env 0: 1.0 + 0.9*1.0 - 0.5 = 1.4 ; env 1: 2.0 + 0.9*0.4 - 0.2 = 2.16
    np.testing.assert_allclose(out["adv"], [1.4, 2.16], rtol=1e-5)
    assert adder.flush(ob(2, 13)) is None


# ---------------------------------------------------------------- acting

def test_pendulum_actions_scaled_to_the_bounds_for_env_stored_unclipped():
    # A wide Gaussian (std e^1.5 ~ 4.5) so many samples fall outside the normalised [-1, 1].
    policy = make_policy("Pendulum-v1", model={"init_log_std": 1.5})
    assert policy.spec.action_kind == "box" and policy.spec.action_low == (-2.0,)
    obs = np.random.default_rng(0).uniform(-1, 1, (256, 3)).astype(np.float32)
    env_action, record = policy.act(obs, {}, np.random.default_rng(0))
    stored = record["action"]
    assert env_action.shape == stored.shape == (256, 1)
    assert stored.dtype == np.float32 and env_action.dtype == np.float32
    assert env_action.min() >= -2.0 and env_action.max() <= 2.0
    assert (np.abs(stored) > 1.0).any(), "test needs samples outside the bounds"
    # [-1, 1] maps onto [low, high] = [-2, 2]: here a factor of 2.
    np.testing.assert_allclose(env_action, 2.0 * np.clip(stored, -1.0, 1.0), rtol=1e-6, atol=1e-6)
    # The stored log-probability is that of the unclipped sample.
    with torch.no_grad():
        dist, value = policy.model(torch.as_tensor(obs))
        want = dist.log_prob(torch.as_tensor(stored)).sum(-1).numpy()
    np.testing.assert_allclose(record["logp"], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(record["value"], value.numpy(), rtol=1e-6)
    assert isinstance(dist, Normal)
    greedy = policy.act_eval(obs, np.random.default_rng(0))
    assert greedy.shape == (256, 1) and greedy.min() >= -2.0 and greedy.max() <= 2.0


def test_discrete_act_records_logp_of_the_chosen_action():
    policy = make_policy()
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    env_action, record = policy.act(obs, {}, np.random.default_rng(0))
    assert env_action.dtype == np.int64 and set(env_action.tolist()) <= {0, 1}
    with torch.no_grad():
        dist, _ = policy.model(torch.as_tensor(obs))
        want = dist.log_prob(torch.as_tensor(record["action"])).numpy()
    np.testing.assert_allclose(record["logp"], want, rtol=1e-5)


def eval_policy(env_id="CartPole-v1", sample=False, **kw):
    cfg = ppo_cfg(env_id, **kw)
    cfg.policy.eval.sample = sample
    spec = spaces.probe(cfg)
    torch.manual_seed(0)
    return create_policy(cfg, spec, modes=("eval",), device="cpu")


def test_eval_takes_the_most_likely_action_unless_sampling_is_on():
    assert ppo_cfg().policy.eval.sample is False  # the default
    obs = np.random.default_rng(0).normal(size=(4000, 4)).astype(np.float32)
    argmax_policy = eval_policy(sample=False)
    with torch.no_grad():
        probs = argmax_policy.model(torch.as_tensor(obs))[0].probs.numpy()
    for seed in range(3):  # never anything but the argmax, whatever the generator
        np.testing.assert_array_equal(argmax_policy.act_eval(obs, np.random.default_rng(seed)), probs.argmax(1))
    sampler = eval_policy(sample=True)
    a = sampler.act_eval(obs, np.random.default_rng(1))
    assert a.dtype == np.int64 and set(a.tolist()) == {0, 1}
    # The near-uniform first policy: a sample differs from the argmax about as often as the other
    # action's probability says (sum of min(p) over 4,000 rows, binomial sd about 32).
    expected = float(probs.min(1).sum())
    assert abs(int((a != probs.argmax(1)).sum()) - expected) < 150, (int((a != probs.argmax(1)).sum()), expected)
    np.testing.assert_array_equal(a, sampler.act_eval(obs, np.random.default_rng(1)))  # reproducible from the seed


def test_eval_samples_of_box_actions_stay_in_bounds():
    obs = np.random.default_rng(0).normal(size=(512, 3)).astype(np.float32)
    mean = eval_policy("Pendulum-v1", model={"init_log_std": 1.5}).act_eval(obs, np.random.default_rng(0))
    sampled = eval_policy("Pendulum-v1", sample=True, model={"init_log_std": 1.5}).act_eval(obs, np.random.default_rng(0))
    assert sampled.shape == mean.shape == (512, 1) and sampled.dtype == np.float32
    assert sampled.min() >= -2.0 and sampled.max() <= 2.0 and (sampled == 2.0).any()  # clipped to the space
    assert (np.abs(sampled - mean) > 0.1).mean() > 0.5


# ---------------------------------------------------------------- learn

def synthetic_batch(policy, n=128, logp_shift=0.0, adv=None, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    action = rng.integers(0, 2, n).astype(np.int64)
    with torch.no_grad():
        dist, v = policy.model(torch.as_tensor(obs))
        logp = dist.log_prob(torch.as_tensor(action)).numpy().astype(np.float32)
    adv = rng.normal(size=n).astype(np.float32) if adv is None else adv
    return {"obs": obs, "action": action, "logp": logp + np.float32(logp_shift), "value": v.numpy(),
            "adv": adv, "ret": (adv + v.numpy()).astype(np.float32)}


def test_learn_returns_finite_scalars_and_changes_weights():
    policy = make_policy()
    # Copies: get_weights() arrays share memory with the live CPU parameters.
    before = {k: v.copy() for k, v in policy.get_weights().items()}
    info = policy.learn(synthetic_batch(policy))
    for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_frac", "total_loss", "cur_lr"):
        assert k in info and isinstance(info[k], float) and math.isfinite(info[k]), (k, info)
    assert info["rows"] == 128
    after = policy.get_weights()
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_clipped_objective():
    """Positive advantages and a new policy far more likely than the old one: every ratio is clipped,
    the surrogate is exactly -(1 + eps) * mean(A), and clip_frac > 0."""
    learn = {"epoch_per_collect": 1, "batch_size": 256, "adv_norm": False}
    policy = make_policy(learn=learn)
    adv = np.linspace(0.5, 1.5, 64).astype(np.float32)
    info = policy.learn(synthetic_batch(policy, n=64, logp_shift=-5.0, adv=adv))
    assert info["clip_frac"] == 1.0
    assert info["policy_loss"] == pytest.approx(-1.2 * float(adv.mean()), rel=1e-5)
    assert info["approx_kl"] > 1.0

    # Same data with logp_old = logp_new: ratio 1, nothing clipped on the first (only) minibatch.
    policy = make_policy(learn=learn)
    info = policy.learn(synthetic_batch(policy, n=64, logp_shift=0.0, adv=adv))
    assert info["clip_frac"] == 0.0
    assert info["policy_loss"] == pytest.approx(-float(adv.mean()), rel=1e-5)


# ---------------------------------------------------------------- weights and checkpoints

def test_get_set_weights_round_trip():
    a, b = make_policy(seed=0), make_policy(seed=1, modes=("collect", "eval"))
    wa = a.get_weights()
    assert all(v.dtype == np.float32 for v in wa.values())
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    assert any(not np.array_equal(wa[k], b.get_weights()[k]) for k in wa)
    b.set_weights(wa)
    wb = b.get_weights()
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])
    np.testing.assert_array_equal(a.act_eval(obs, np.random.default_rng(0)), b.act_eval(obs, np.random.default_rng(1)))
    np.testing.assert_array_equal(a.values(obs), b.values(obs))


def test_set_weights_refuses_missing_and_misshaped_tensors_by_name():
    p = make_policy()
    w = p.get_weights()
    name = sorted(w)[0]
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        p.set_weights({k: v for k, v in w.items() if k != name})
    bad = dict(w)
    bad[name] = np.zeros((3, 3, 3), np.float32)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        p.set_weights(bad)


def test_state_dict_round_trip_restores_learning_state():
    a = make_policy(seed=0)
    a.learn(synthetic_batch(a))
    b = make_policy(seed=1)
    b.load_state_dict(a.state_dict())
    for k, v in a.get_weights().items():
        np.testing.assert_array_equal(v, b.get_weights()[k])


# ---------------------------------------------------------------- collect setting

@pytest.mark.parametrize("collectors,rows", [(1, 256), (2, 128), (3, 86), (5, 52), (300, 1), (0, 256)])
def test_collect_setting_splits_n_sample_over_collectors(collectors, rows):
    cfg = ppo_cfg()
    assert cfg.policy.collect.n_sample == 256
    assert collect_setting(cfg.policy, {"collectors": collectors, "envstep": 0, "train_iter": 0}) == {"rollout_rows": rows}
    assert rows == max(1, math.ceil(256 / max(1, collectors)))


def test_collect_setting_registered_and_json_plain():
    algo = get_algorithm("ppo")
    assert algo.data_source == "on_policy"
    s = algo.collect_setting(ppo_cfg().policy, {"collectors": 3})
    assert s == {"rollout_rows": 86} and type(s["rollout_rows"]) is int


def test_make_adder_horizon_covers_the_share():
    policy = make_policy()
    # 86 rows over 8 envs: ceil(86 / 8) = 11 steps per env (88 rows).
    assert policy.make_adder(8, {"rollout_rows": 86}).horizon == 11
    assert policy.make_adder(8, {}).horizon == 32  # no setting: n_sample 256 / 8


def test_ppo_box_actions_off_centre_act_in_the_middle_and_learn():
    """A one-step bandit on Box [100, 110] (issue 20): reward -|a - 107|. A Gaussian around 0
    clipped to the bounds sent 100 every time and never learned; scaled to the bounds, the fresh
    policy acts around 105 and PPO moves its mean action to the optimum."""
    from gymnasium import spaces as gs

    cfg = ppo_cfg(learn={"learning_rate": 3e-3, "epoch_per_collect": 4, "batch_size": 64, "entropy_weight": 0.0})
    spec = spaces.from_spaces("Bandit", gs.Box(-1.0, 1.0, (2,), np.float32), gs.Box(100.0, 110.0, (1,), np.float32))
    cfg.policy.model.update(obs_shape=2, action_shape=1)
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, device="cpu")
    obs = np.zeros((256, 2), np.float32)
    greedy = policy.act_eval(obs[:1], np.random.default_rng(0))
    assert 104.0 < greedy[0, 0] < 106.0, greedy  # the middle of the bounds, not the edge at 100
    env_action, _ = policy.act(obs, {}, np.random.default_rng(0))
    assert env_action.min() >= 100.0 and env_action.max() <= 110.0 and env_action.std() > 1.0
    for _ in range(40):  # one-step episodes: adv = r - V, ret = r
        env_action, rec = policy.act(obs, {}, np.random.default_rng(0))
        reward = -np.abs(env_action[:, 0] - 107.0).astype(np.float32)
        policy.learn({"obs": obs, "action": rec["action"], "logp": rec["logp"], "value": rec["value"],
                      "adv": reward - rec["value"], "ret": reward})
    assert abs(policy.act_eval(obs[:1], np.random.default_rng(0))[0, 0] - 107.0) < 0.5


def test_lr_anneal_iters_lowers_the_learning_rate_linearly_to_zero_and_resumes_from_the_state():
    """CleanRL's anneal_lr: train iteration i (from 0) learns at learning_rate * (1 - i / N); a
    learner that restarts from the policy's state goes on down the line, not back at the top, and
    a resume with another N or none follows its own config, not the checkpoint's."""
    def batch(policy):
        obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
        _, rec = policy.act(obs, {}, np.random.default_rng(0))
        return {"obs": obs, "action": rec["action"], "logp": rec["logp"], "value": rec["value"],
                "adv": np.ones(32, np.float32), "ret": np.ones(32, np.float32)}

    def lrs(policy, n):
        return [policy.learn(batch(policy))["cur_lr"] for _ in range(n)]

    learn = {"learning_rate": 1e-3, "lr_anneal_iters": 4}
    policy = make_policy(learn=learn)
    seen = lrs(policy, 2)
    again = make_policy(learn=learn)
    again.load_state_dict(policy.state_dict())
    assert seen + lrs(again, 3) == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4, 0.0])
    longer = make_policy(learn={"learning_rate": 1e-3, "lr_anneal_iters": 8})
    longer.load_state_dict(policy.state_dict())  # 2 of 8 done
    assert lrs(longer, 2) == pytest.approx([7.5e-4, 6.25e-4])
    constant = make_policy(learn={"learning_rate": 1e-3})
    constant.load_state_dict(again.state_dict())  # saved with a learning rate of 0
    assert lrs(constant, 2) == [1e-3, 1e-3]
