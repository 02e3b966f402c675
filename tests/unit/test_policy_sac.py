"""Unit tests for common/policy/sac/: the squashed-Gaussian log-prob, action rescaling to the env's
Box, random warm-up actions, the learn step (Polyak targets, automatic entropy tuning,
prioritized-replay weights) and checkpoint state.

Expected values come from independent computations: torch.distributions for the log-prob,
float64 arithmetic on copies for the Polyak update and the TD errors.
"""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch
from torch.distributions import Normal, TanhTransform, TransformedDistribution

from common.config import compile_config
from common.policy import create_policy, get_algorithm
from common.policy.sac import collect_setting
from common.policy.sac.policy import Actor, SACPolicy
from common.spaces import SpaceError, SpaceSpec

# An asymmetric 2-D Box: rescaling must use each dimension's own bounds.
LOW, HIGH = np.array([-1.0, 0.0]), np.array([3.0, 10.0])
ASYM = SpaceSpec("AsymBox-v0", "box", (3,), 0, 0, "box", 0, 0, 2, tuple(LOW), tuple(HIGH))
# Chi-square upper 0.1 % point, df = 9 (10 bins): 27.877 (standard tables).
CHI2_CRIT_DF9 = 27.877




def sac_cfg(**learn):
    cfg = compile_config({"exp_name": "sac_test", "policy": {
        "model": {"actor_hidden_size_list": [32, 32], "critic_hidden_size_list": [32, 32]},
        "learn": {"batch_size": 32, **learn},
        "other": {"replay_buffer": {"replay_start_size": 1000}}}}, {"policy": {"type": "sac"}})
    return cfg


def make(seed=0, spec=ASYM, **learn) -> SACPolicy:
    torch.manual_seed(seed)
    return create_policy(sac_cfg(**learn), spec, device="cpu")


def batch_of(n=32, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 3)).astype(np.float32),
            "action": rng.uniform(-1, 1, size=(n, 2)).astype(np.float32),
            "reward": rng.normal(size=n).astype(np.float32),
            "next_obs": rng.normal(size=(n, 3)).astype(np.float32),
            "done": rng.random(n) < 0.2, "discount": np.full(n, 0.99, np.float32)}


# ---------------------------------------------------------------- actor

@pytest.mark.parametrize("log_std_bias", [-1.0, 0.0, 1.0])
def test_actor_logp_matches_torch_tanh_transformed_normal(log_std_bias):
    torch.manual_seed(1)
    actor = Actor(ASYM, [32, 32])
    with torch.no_grad():  # wide Gaussians too: many samples deep in tanh's saturation
        actor.log_std.bias.fill_(log_std_bias)
    x = torch.randn(512, 3)
    torch.manual_seed(5)
    a, logp = actor.sample(x)
    assert a.shape == (512, 2) and logp.shape == (512,) and a.dtype == torch.float32
    assert torch.all(a.abs() <= 1)
    with torch.no_grad():
        mu, log_std = actor(x)
        torch.manual_seed(5)  # the same noise draw (the forward pass uses no randomness)
        u = mu + log_std.exp() * torch.randn_like(mu)
        tanh = TanhTransform(cache_size=1)
        dist = TransformedDistribution(Normal(mu, log_std.exp()), [tanh])
        a_ref = tanh(u)  # cached: log_prob inverts to this u exactly, no atanh of saturated values
        ref = dist.log_prob(a_ref).sum(-1)
    torch.testing.assert_close(a, a_ref)
    torch.testing.assert_close(logp.detach(), ref, atol=1e-4, rtol=1e-5)
    # The correction matters: the plain Gaussian log-prob of u is another number.
    plain = Normal(mu, log_std.exp()).log_prob(u).sum(-1)
    assert (plain - ref).abs().mean() > 0.1


def test_actor_sample_is_reparameterised():
    torch.manual_seed(2)
    actor = Actor(ASYM, [16])
    a, logp = actor.sample(torch.randn(8, 3))
    (a.sum() + logp.sum()).backward()
    assert actor.mu.weight.grad is not None and actor.mu.weight.grad.abs().sum() > 0
    assert actor.log_std.weight.grad is not None and actor.log_std.weight.grad.abs().sum() > 0


# ---------------------------------------------------------------- acting

def test_actions_are_rescaled_to_the_asymmetric_box():
    p = make()
    obs = np.random.default_rng(0).normal(size=(400, 3)).astype(np.float32)
    env_a, record = p.act(obs, {"random": False}, np.random.default_rng(1))
    a = record["action"]
    assert a.shape == (400, 2) and a.dtype == np.float32 and env_a.dtype == np.float32
    assert np.all(np.abs(a) <= 1)
    np.testing.assert_allclose(env_a, LOW + (a + 1) / 2 * (HIGH - LOW), rtol=1e-6, atol=1e-6)
    assert np.all(env_a >= LOW - 1e-6) and np.all(env_a <= HIGH + 1e-6)
    # Both edges map exactly: -1 -> low, +1 -> high, 0 -> the middle.
    np.testing.assert_allclose(p._to_env(np.array([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0]], np.float32)),
                               [LOW, HIGH, (LOW + HIGH) / 2], rtol=1e-6)


def test_spec_read_from_a_gymnasium_box_is_the_asymmetric_one():
    from gymnasium import spaces as gs

    from common.spaces import from_spaces

    obs = gs.Box(-np.inf, np.inf, (3,), np.float32)
    act = gs.Box(low=LOW.astype(np.float32), high=HIGH.astype(np.float32), dtype=np.float32)
    assert from_spaces("AsymBox-v0", obs, act) == ASYM


def test_random_actions_cover_the_whole_box_uniformly():
    p = make()
    obs = np.zeros((20_000, 3), np.float32)
    env_a, record = p.act(obs, {"random": True}, np.random.default_rng(3))
    np.testing.assert_allclose(env_a, LOW + (record["action"] + 1) / 2 * (HIGH - LOW), rtol=1e-6, atol=1e-6)
    for d in range(2):
        col = env_a[:, d]
        assert col.min() >= LOW[d] and col.max() <= HIGH[d]
        width = HIGH[d] - LOW[d]
        assert col.min() < LOW[d] + 0.01 * width and col.max() > HIGH[d] - 0.01 * width
        counts, _ = np.histogram(col, bins=10, range=(LOW[d], HIGH[d]))
        expected = len(col) / 10
        stat = float(((counts - expected) ** 2 / expected).sum())
        assert stat < CHI2_CRIT_DF9, (d, counts)
    # Random actions do not depend on the observations or the network.
    env_b, _ = make(seed=9).act(np.ones((20_000, 3), np.float32), {"random": True}, np.random.default_rng(3))
    np.testing.assert_array_equal(env_a, env_b)


def test_policy_actions_are_stochastic_and_eval_actions_deterministic():
    p = make()
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    torch.manual_seed(0)
    e1 = p.act_eval(obs, np.random.default_rng(0))
    torch.manual_seed(123)
    e2 = p.act_eval(obs, np.random.default_rng(1))  # the mean action: no randomness from either source
    np.testing.assert_array_equal(e1, e2)
    with torch.no_grad():
        mu, _ = p.model.actor(torch.as_tensor(obs))
    np.testing.assert_allclose(e1, LOW + (np.tanh(mu.numpy().astype(np.float64)) + 1) / 2 * (HIGH - LOW), rtol=1e-5)
    a1, _ = p.act(obs, {"random": False}, np.random.default_rng(0))
    a2, _ = p.act(obs, {"random": False}, np.random.default_rng(0))
    assert not np.array_equal(a1, a2)  # sampled from the Gaussian, not the mean


def test_collect_setting_random_until_replay_start_size():
    cfg = sac_cfg()
    assert cfg.policy.other.replay_buffer.replay_start_size == 1000
    assert collect_setting(cfg.policy, {"envstep": 0}) == {"random": True}
    assert collect_setting(cfg.policy, {"envstep": 999})["random"] is True
    assert collect_setting(cfg.policy, {"envstep": 1000})["random"] is False
    assert collect_setting(cfg.policy, {"envstep": 10**7})["random"] is False
    assert collect_setting(cfg.policy, {})["random"] is True
    algo = get_algorithm("sac")
    assert algo.data_source == "replay" and algo.collect_setting is collect_setting


def test_sac_refuses_discrete_actions_naming_the_env():
    spec = SpaceSpec("CartPole-v1", "box", (4,), 0, 0, "discrete", 2, 0, 0, (), ())
    with pytest.raises(SpaceError, match="CartPole-v1.*Discrete"):
        create_policy(sac_cfg(), spec, device="cpu")


def test_make_adder_uses_nstep_and_discount():
    p = make()
    adder = p.make_adder(3, {"random": True})
    assert adder.nstep == p.cfg.policy.nstep and adder.gamma == pytest.approx(p.cfg.policy.discount_factor)
    assert p.schema()["action"] == ((2,), np.dtype(np.float32))


# ---------------------------------------------------------------- learn

def test_learn_returns_finite_floats_and_target_entropy_is_minus_action_dim():
    p = make()
    assert p.target_entropy == -2.0
    out = p.learn(batch_of())
    assert set(out) >= {"q_loss", "actor_loss", "alpha_loss", "alpha", "q_value", "entropy", "total_loss"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in out.values()), out
    assert out["alpha"] == pytest.approx(0.2, rel=1e-6)  # init_temperature
    assert "priority" not in out


@pytest.mark.parametrize("log_std_bias,direction", [(0.0, -1), (-6.0, +1)])
def test_auto_alpha_moves_toward_the_target_entropy(log_std_bias, direction):
    """Entropy above -|A| lowers alpha, entropy below it raises alpha (the actor barely moves).
    (Squashed entropy peaks near std 1, ~+1.3 for |A| = 2; a very wide or very narrow pre-squash
    Gaussian both end far below the target -2.)"""
    p = make(learning_rate_policy=1e-7, learning_rate_alpha=1e-2)
    with torch.no_grad():
        p.model.actor.log_std.weight.zero_()
        p.model.actor.log_std.bias.fill_(log_std_bias)
    batch = batch_of()
    alphas, entropies = [], []
    for _ in range(60):
        out = p.learn(batch)
        alphas.append(out["alpha"])
        entropies.append(out["entropy"])
    ent = np.mean(entropies)
    assert np.sign(p.target_entropy - ent) == direction, ent  # the setup really is on that side
    final = p.log_alpha.detach().exp().item()
    # Adam moves log(alpha) by ~lr per step: 60 steps of 1e-2 is ~0.6 when every step agrees.
    assert direction * math.log(final / 0.2) > 0.4, (final, alphas[:3], alphas[-3:])
    steps = np.diff(alphas)
    assert np.all(direction * steps > 0)  # monotone while on one side of the target


def test_fixed_alpha_without_auto_alpha():
    p = make(auto_alpha=False, init_temperature=0.05)
    for _ in range(5):
        out = p.learn(batch_of())
    assert out["alpha"] == pytest.approx(0.05, rel=1e-6) and out["alpha_loss"] == 0.0


def test_polyak_update_of_both_target_critics():
    p = make(target_theta=0.05)
    for i in range(3):  # online and target critics differ
        p.learn(batch_of(seed=i))
    old = {n: {k: v.double().clone() for k, v in getattr(p, n).state_dict().items()} for n in ("q1_target", "q2_target")}
    p.learn(batch_of(seed=7))
    tau = 0.05
    for online, target in (("q1", "q1_target"), ("q2", "q2_target")):
        new_online = getattr(p, online).state_dict()
        new_target = getattr(p, target).state_dict()
        for k, v in new_target.items():
            want = (1 - tau) * old[target][k] + tau * new_online[k].double()
            torch.testing.assert_close(v.double(), want, rtol=1e-6, atol=1e-7)
            assert not torch.allclose(v, new_online[k])
    assert not any(t.requires_grad for t in (*p.q1_target.parameters(), *p.q2_target.parameters()))


def test_learn_with_weight_returns_mean_abs_td_error_of_the_twin_critics():
    p = make()
    for i in range(3):
        p.learn(batch_of(seed=i))
    batch = dict(batch_of(seed=11), weight=np.linspace(0.2, 1.0, 32).astype(np.float32))
    ref = copy.deepcopy(p)
    torch.manual_seed(42)
    out = p.learn(batch)
    prio = out["priority"]
    assert isinstance(prio, np.ndarray) and prio.dtype == np.float32 and prio.shape == (32,)
    with torch.no_grad():  # the TD target, from the pre-update copy and the same noise draw
        torch.manual_seed(42)
        nxt = torch.as_tensor(batch["next_obs"])
        a2, logp2 = ref.model.actor.sample(nxt)
        q_next = torch.min(ref.q1_target(nxt, a2), ref.q2_target(nxt, a2)).double()
        alpha = ref.log_alpha.detach().exp().item()
        y = (torch.as_tensor(batch["reward"]).double() + torch.as_tensor(batch["discount"]).double()
             * (1 - torch.as_tensor(batch["done"]).double()) * (q_next - alpha * logp2.double()))
        obs, act = torch.as_tensor(batch["obs"]), torch.as_tensor(batch["action"])
        q1, q2 = ref.q1(obs, act).double(), ref.q2(obs, act).double()
    want = (0.5 * ((q1 - y).abs() + (q2 - y).abs())).numpy()
    np.testing.assert_allclose(prio, want, rtol=1e-4, atol=1e-5)
    td = ((q1 - y) ** 2 + (q2 - y) ** 2).numpy()
    assert out["q_loss"] == pytest.approx(float((batch["weight"] * td).mean()), rel=1e-4)


def test_state_dict_roundtrip_reproduces_the_next_learn_exactly():
    a = make(seed=2)
    for i in range(5):
        a.learn(batch_of(seed=i))
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    b = make(seed=77)
    b.load_state_dict(state)
    batch = batch_of(seed=20)
    for step in range(3):
        torch.manual_seed(100 + step)
        la = a.learn(batch)
        torch.manual_seed(100 + step)
        lb = b.learn(batch)
        assert la == lb, step
    for name in ("model", "q1", "q2", "q1_target", "q2_target"):
        for x, y in zip(getattr(a, name).state_dict().values(), getattr(b, name).state_dict().values()):
            assert torch.equal(x, y), name
    assert torch.equal(a.log_alpha, b.log_alpha)


def test_collect_only_policy_has_only_the_actor():
    p = create_policy(sac_cfg(), ASYM, modes=("collect",), device="cpu")
    assert not hasattr(p, "q1") and not hasattr(p, "actor_optimizer")
    learner = make(seed=4)
    p.set_weights(learner.get_weights())
    obs = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
    rng = np.random.default_rng
    np.testing.assert_array_equal(p.act_eval(obs, rng(0)), learner.act_eval(obs, rng(1)))
    assert all(k.startswith("actor.") for k in learner.get_weights())
