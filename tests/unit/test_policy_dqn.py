"""Unit tests for common/policy/dqn/: n-step adder, epsilon schedule, learn step, weights I/O."""

from __future__ import annotations

import copy
import io
import math

import numpy as np
import pytest
import torch
from easydict import EasyDict

from common.policy import create_policy, get_algorithm
from common.policy.dqn import collect_setting
from common.policy.dqn.policy import QNetwork
from common.policy.nstep import NStepAdder
from common.spaces import SpaceSpec

GAMMA = 0.9
CARTPOLE = SpaceSpec("CartPole-v1", "box", (4,), 0, 0, "discrete", 2, 0, 0, (), ())


def rows_of(out):
    """Adder output (dict of stacked arrays or None) as (obs, action, reward, next_obs, done, discount) tuples."""
    if out is None:
        return []
    return [(out["obs"][i], int(out["action"][i]), float(out["reward"][i]), out["next_obs"][i], bool(out["done"][i]),
             float(out["discount"][i])) for i in range(len(out["action"]))]


def add(adder, step):
    obs, action, reward, nxt, term, trunc = step
    return rows_of(adder.add(obs, {"action": action}, reward, nxt, term, trunc))




def policy_cfg(small_cfg, **learn):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.learn.update(learn)
    return cfg


def make_policy(small_cfg, seed=0, **learn):
    torch.manual_seed(seed)
    return create_policy(policy_cfg(small_cfg, **learn), CARTPOLE, device="cpu")


def step_arrays(env_num, t, terminated=(), truncated=()):
    """Vector-env step t: obs_i = [t, i], next_obs = [t+1, i], action = t, reward = t+1."""
    obs = np.array([[t, i] for i in range(env_num)], dtype=np.float32)
    nxt = np.array([[t + 1, i] for i in range(env_num)], dtype=np.float32)
    action = np.full(env_num, t, dtype=np.int64)
    reward = np.full(env_num, float(t + 1), dtype=np.float32)
    term = np.array([i in terminated for i in range(env_num)])
    trunc = np.array([i in truncated for i in range(env_num)])
    return obs, action, reward, nxt, term, trunc


# ---------------------------------------------------------------- NStepAdder

def test_nstep_emits_after_n_steps_with_discounted_return():
    adder = NStepAdder(1, 3, GAMMA)
    assert add(adder, step_arrays(1, 0)) == []
    assert add(adder, step_arrays(1, 1)) == []
    out = add(adder, step_arrays(1, 2))
    assert len(out) == 1
    obs, action, ret, next_obs, done, discount = out[0]
    np.testing.assert_array_equal(obs, [0, 0])
    assert action == 0
    assert ret == pytest.approx(1 + GAMMA * 2 + GAMMA ** 2 * 3)
    np.testing.assert_array_equal(next_obs, [3, 0])  # obs 3 steps after t=0
    assert done is False
    assert discount == pytest.approx(GAMMA ** 3)
    out = add(adder, step_arrays(1, 3))
    assert len(out) == 1
    obs, action, ret, next_obs, done, discount = out[0]
    np.testing.assert_array_equal(obs, [1, 0])
    assert action == 1
    assert ret == pytest.approx(2 + GAMMA * 3 + GAMMA ** 2 * 4)
    np.testing.assert_array_equal(next_obs, [4, 0])


def test_nstep_terminated_flushes_with_done_true():
    adder = NStepAdder(1, 3, GAMMA)
    add(adder, step_arrays(1, 0))
    out = add(adder, step_arrays(1, 1, terminated={0}))
    assert len(out) == 2
    (o0, a0, r0, n0, d0, g0), (o1, a1, r1, n1, d1, g1) = out
    np.testing.assert_array_equal(o0, [0, 0])
    np.testing.assert_array_equal(o1, [1, 0])
    assert (a0, a1) == (0, 1)
    assert r0 == pytest.approx(1 + GAMMA * 2)
    assert r1 == pytest.approx(2)
    np.testing.assert_array_equal(n0, [2, 0])
    np.testing.assert_array_equal(n1, [2, 0])
    assert d0 is True and d1 is True
    assert g0 == pytest.approx(GAMMA ** 2) and g1 == pytest.approx(GAMMA)
    # Nothing pending afterwards: a flush emits nothing.
    assert rows_of(adder.flush(np.zeros((1, 2), np.float32))) == []


def test_nstep_truncated_flushes_with_done_false():
    adder = NStepAdder(1, 3, GAMMA)
    add(adder, step_arrays(1, 0))
    add(adder, step_arrays(1, 1))
    out = add(adder, step_arrays(1, 2, truncated={0}))
    assert len(out) == 3
    assert [row[4] for row in out] == [False, False, False]
    assert [row[5] for row in out] == pytest.approx([GAMMA ** 3, GAMMA ** 2, GAMMA])
    assert [row[2] for row in out] == pytest.approx([1 + GAMMA * 2 + GAMMA ** 2 * 3, 2 + GAMMA * 3, 3])
    for row in out:
        np.testing.assert_array_equal(row[3], [3, 0])


def test_nstep_terminated_on_first_step():
    adder = NStepAdder(1, 3, GAMMA)
    out = add(adder, step_arrays(1, 0, terminated={0}))
    assert len(out) == 1
    _, _, ret, nxt, done, disc = out[0]
    assert ret == pytest.approx(1.0) and done is True and disc == pytest.approx(GAMMA)
    np.testing.assert_array_equal(nxt, [1, 0])


def test_nstep_flush_emits_pending_with_done_false():
    adder = NStepAdder(2, 3, GAMMA)
    add(adder, step_arrays(2, 0))
    add(adder, step_arrays(2, 1))
    boot = np.array([[100, 0], [200, 1]], dtype=np.float32)
    out = rows_of(adder.flush(boot))
    assert len(out) == 4
    assert all(row[4] is False for row in out)
    by_env = {}
    for row in out:
        by_env.setdefault(int(row[0][1]), []).append(row)
    for env, rows in by_env.items():
        assert len(rows) == 2
        for row in rows:
            np.testing.assert_array_equal(row[3], boot[env])
        assert [r[5] for r in rows] == pytest.approx([GAMMA ** 2, GAMMA])
        assert [r[2] for r in rows] == pytest.approx([1 + GAMMA * 2, 2])
    assert rows_of(adder.flush(boot)) == []


def test_nstep_envs_are_independent():
    adder = NStepAdder(3, 2, GAMMA)
    out = add(adder, step_arrays(3, 0, terminated={1}))
    assert len(out) == 1 and out[0][0][1] == 1 and out[0][4] is True
    out = add(adder, step_arrays(3, 1, truncated={2}))
    # env 0: 2 pending -> emits 1; env 1: 1 pending; env 2: truncated -> flushes its 2.
    envs = sorted(int(r[0][1]) for r in out)
    assert envs == [0, 2, 2]
    assert all(r[4] is False for r in out)
    out = add(adder, step_arrays(3, 2))
    envs = sorted(int(r[0][1]) for r in out)
    assert envs == [0, 1]  # env 2 restarted with one pending step
    env1 = [r for r in out if int(r[0][1]) == 1][0]
    np.testing.assert_array_equal(env1[0], [1, 1])  # started after its terminal step
    assert env1[2] == pytest.approx(2 + GAMMA * 3)


def test_nstep_one_is_plain_td():
    adder = NStepAdder(1, 1, GAMMA)
    out = add(adder, step_arrays(1, 0))
    assert len(out) == 1 and out[0][2] == pytest.approx(1.0) and out[0][5] == pytest.approx(GAMMA)


def test_policy_rejects_nstep_zero(small_cfg):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.nstep = 0
    with pytest.raises(ValueError, match="nstep"):
        create_policy(cfg, CARTPOLE)


def test_make_adder_uses_policy_gamma_and_nstep(small_cfg):
    p = make_policy(small_cfg)
    adder = p.make_adder(4, {"eps": 0.5})
    assert adder.nstep == small_cfg.policy.nstep
    assert adder.gamma == pytest.approx(small_cfg.policy.discount_factor)


# ---------------------------------------------------------------- epsilon schedule

def test_eps_exp_schedule(small_cfg):
    e = small_cfg.policy.other.eps
    get = lambda n: collect_setting(small_cfg.policy, {"envstep": n})["eps"]
    assert get(0) == pytest.approx(e.start)
    assert get(e.decay) == pytest.approx(e.end + (e.start - e.end) * math.exp(-1))
    assert get(10**9) == pytest.approx(e.end)
    assert get(-50) == pytest.approx(e.start)
    assert collect_setting(small_cfg.policy, {})["eps"] == pytest.approx(e.start)
    vals = [get(n) for n in range(0, 50_000, 5_000)]
    assert all(a > b for a, b in zip(vals, vals[1:]))
    assert isinstance(get(3), float)


def test_eps_linear_schedule(small_cfg):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.other.eps.update(type="linear", start=1.0, end=0.1, decay=1000)
    get = lambda n: collect_setting(cfg.policy, {"envstep": n})["eps"]
    assert get(0) == pytest.approx(1.0)
    assert get(500) == pytest.approx(0.55)
    assert get(1000) == pytest.approx(0.1)
    assert get(5000) == pytest.approx(0.1)


def test_eps_unknown_type(small_cfg):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.other.eps.type = "cosine"
    with pytest.raises(ValueError, match="cosine"):
        collect_setting(cfg.policy, {"envstep": 1})


def test_collect_only_policy_has_no_optimizer_or_target(small_cfg):
    p = create_policy(small_cfg, CARTPOLE, modes=("collect",), device="cpu")
    assert not hasattr(p, "target_model") and not hasattr(p, "optimizer")


def test_box_actions_refused_naming_the_env(small_cfg):
    spec = SpaceSpec("Pendulum-v1", "box", (3,), 0, 0, "box", 0, 0, 1, (-2.0,), (2.0,))
    with pytest.raises(ValueError, match="Pendulum-v1.*Box action"):
        create_policy(small_cfg, spec, device="cpu")


# ---------------------------------------------------------------- learn mode

def fixed_batch(n=32, obs_dim=4, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "action": rng.integers(0, 2, size=n).astype(np.int64),
        "reward": np.ones(n, np.float32),
        "next_obs": rng.normal(size=(n, obs_dim)).astype(np.float32),
        "done": np.ones(n, bool),
        "discount": np.full(n, 0.9 ** 3, np.float32),
    }


def test_learn_converges_to_terminal_reward(small_cfg):
    p = make_policy(small_cfg, learning_rate=3e-3)
    batch = fixed_batch()
    first = p.learn(batch)
    assert set(first) >= {"cur_lr", "total_loss", "q_value", "target_q_value"}
    assert all(isinstance(v, float) for v in first.values())
    assert first["target_q_value"] == pytest.approx(1.0)  # done everywhere: target = reward
    for _ in range(200):
        last = p.learn(batch)
    assert last["total_loss"] < first["total_loss"] * 0.1
    assert last["total_loss"] < 1e-3
    with torch.no_grad():
        q = p.model(torch.as_tensor(batch["obs"])).gather(1, torch.as_tensor(batch["action"])[:, None]).squeeze(1)
    np.testing.assert_allclose(q.numpy(), 1.0, atol=0.1)


@pytest.mark.parametrize("double", [True, False])
def test_learn_is_double_dqn_unless_double_is_off(small_cfg, double):
    """Target = r + g^k Q_target(s', argmax_a Q_online(s', a)) (``policy.learn.double``, the default),
    else r + g^k max_a Q_target(s', a): online and target nets made to differ first, so the two
    targets give other numbers."""
    p = make_policy(small_cfg, target_update_freq=10**6, learning_rate=1e-2, double=double)
    for i in range(30):  # train the online net away from the (frozen) target net
        p.learn(fixed_batch(seed=10 + i))
    batch = fixed_batch(seed=99)
    batch["done"][:] = False
    with torch.no_grad():
        nxt = torch.as_tensor(batch["next_obs"])
        q_online = p.model(nxt).numpy().astype(np.float64)
        q_target = p.target_model(nxt).numpy().astype(np.float64)
    rows = np.arange(len(q_online))
    double_target = batch["reward"] + batch["discount"] * q_target[rows, q_online.argmax(1)]
    max_target = batch["reward"] + batch["discount"] * q_target.max(1)
    assert abs(double_target.mean() - max_target.mean()) > 1e-3  # the nets differ where it matters
    out = p.learn(batch)
    expected = double_target if double else max_target
    assert out["target_q_value"] == pytest.approx(float(expected.mean()), rel=1e-5)


def test_double_is_on_by_default_and_a_non_bool_is_refused_by_its_key(small_cfg):
    assert make_policy(small_cfg).cfg.policy.learn.double is True
    with pytest.raises(ValueError, match=r"'policy.learn.double' must be True or False, got 'no'"):
        make_policy(small_cfg, double="no")


def _params_equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_target_network_copied_every_target_update_freq(small_cfg):
    p = make_policy(small_cfg, target_update_freq=5)
    batch = fixed_batch()
    assert _params_equal(p.model, p.target_model)
    initial_target = copy.deepcopy(p.target_model.state_dict())
    for i in range(1, 13):
        p.learn(batch)
        if i % 5 == 0:
            assert _params_equal(p.model, p.target_model), i
        else:
            assert not _params_equal(p.model, p.target_model), i
        if i < 5:
            assert all(torch.equal(v, initial_target[k]) for k, v in p.target_model.state_dict().items())
    assert not any(t.requires_grad for t in p.target_model.parameters())


def test_get_weights_set_weights_same_greedy_actions(small_cfg):
    learner = make_policy(small_cfg, seed=1)
    for _ in range(5):
        learner.learn(fixed_batch(seed=3))
    weights = learner.get_weights()
    assert all(isinstance(v, np.ndarray) and v.dtype == np.float32 for v in weights.values())
    assert set(weights) == set(learner.model.state_dict())
    collector = create_policy(policy_cfg(small_cfg), CARTPOLE, modes=("collect",), device="cpu")
    obs = np.random.default_rng(5).normal(size=(256, 4)).astype(np.float32)
    torch.manual_seed(99)
    collector2 = create_policy(policy_cfg(small_cfg), CARTPOLE, modes=("eval",), device="cpu")
    collector.set_weights(weights)
    rng = lambda: np.random.default_rng(7)  # noqa: E731  the same eval-epsilon draws for each policy
    np.testing.assert_array_equal(collector.act_eval(obs, rng()), learner.act_eval(obs, rng()))
    # Through the wire format too.
    from common import serialization
    collector2.set_weights(serialization.loads(serialization.dumps(weights)))
    np.testing.assert_array_equal(collector2.act_eval(obs, rng()), learner.act_eval(obs, rng()))
    assert collector.act_eval(obs, rng()).dtype == np.int64


def test_get_weights_follows_training(small_cfg):
    p = make_policy(small_cfg)
    w = p.get_weights()
    snap = {k: v.copy() for k, v in w.items()}
    for _ in range(3):
        p.learn(fixed_batch())
    # A publication after more training carries the new weights.
    w2 = p.get_weights()
    assert any(not np.array_equal(w2[k], snap[k]) for k in snap)


def test_set_weights_missing_tensor(small_cfg):
    p = make_policy(small_cfg)
    w = p.get_weights()
    name = sorted(w)[0]
    del w[name]
    with pytest.raises(ValueError, match="missing") as ei:
        p.set_weights(w)
    assert name in str(ei.value)


def test_set_weights_unexpected_tensor(small_cfg):
    p = make_policy(small_cfg)
    w = p.get_weights()
    w["bogus.weight"] = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="bogus.weight"):
        p.set_weights(w)


def test_set_weights_misshaped_tensor(small_cfg):
    p = make_policy(small_cfg)
    w = p.get_weights()
    before = {k: v.clone() for k, v in p.model.state_dict().items()}
    w["encoder.0.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError) as ei:
        p.set_weights(w)
    assert "encoder.0.weight" in str(ei.value) and "(3, 3)" in str(ei.value)
    # Nothing was loaded.
    assert all(torch.equal(v, before[k]) for k, v in p.model.state_dict().items())


def test_act_eps_zero_is_greedy_eps_one_is_random(small_cfg):
    p = make_policy(small_cfg)
    obs = np.random.default_rng(0).normal(size=(500, 4)).astype(np.float32)
    rng = np.random.default_rng(1)
    greedy = argmax_q(p, obs)
    acts, record = p.act(obs, {"eps": 0.0}, rng)
    np.testing.assert_array_equal(acts, greedy)
    np.testing.assert_array_equal(record["action"], greedy)
    acts, _ = p.act(obs, {"eps": 1.0}, rng)
    assert set(np.unique(acts)) == {0, 1}
    assert 150 < int((acts != greedy).sum()) < 350  # ~half differ when fully random


def test_discrete_action_start_is_applied_to_env_actions_only(small_cfg):
    spec = SpaceSpec("Shifted-v0", "box", (4,), 0, 0, "discrete", 3, -1, 0, (), ())
    p = create_policy(small_cfg, spec, device="cpu")
    obs = np.random.default_rng(0).normal(size=(300, 4)).astype(np.float32)
    env_actions, record = p.act(obs, {"eps": 1.0}, np.random.default_rng(2))
    assert set(np.unique(env_actions)) == {-1, 0, 1}
    np.testing.assert_array_equal(record["action"], env_actions + 1)  # stored as an index in [0, n)
    assert set(np.unique(p.act_eval(obs, np.random.default_rng(3)))) <= {-1, 0, 1}


def argmax_q(p, obs):
    with torch.no_grad():
        return p.model(torch.as_tensor(obs)).argmax(dim=1).numpy()


def eval_cfg(small_cfg, eps):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.eval.eps = eps
    return cfg


def test_evals_act_epsilon_greedy_with_the_configured_epsilon(small_cfg):
    assert small_cfg.policy.eval.eps == 0.05  # the default, as Nature DQN's evaluation
    torch.manual_seed(0)
    p = create_policy(small_cfg, CARTPOLE, modes=("eval",), device="cpu")
    obs = np.random.default_rng(0).normal(size=(40_000, 4)).astype(np.float32)
    greedy = argmax_q(p, obs)
    # A uniform random action differs from the greedy one with probability 1/2 (two actions),
    # so about eps / 2 of the actions differ: 1,000 of 40,000 (binomial sd about 31).
    differ = int((p.act_eval(obs, np.random.default_rng(1)) != greedy).sum())
    assert 850 < differ < 1150, differ
    # Reproducible from the generator's seed.
    np.testing.assert_array_equal(p.act_eval(obs, np.random.default_rng(1)), p.act_eval(obs, np.random.default_rng(1)))
    torch.manual_seed(0)
    g = create_policy(eval_cfg(small_cfg, 0.0), CARTPOLE, modes=("eval",), device="cpu")
    np.testing.assert_array_equal(g.act_eval(obs, np.random.default_rng(1)), greedy)  # eps 0: greedy


@pytest.mark.parametrize("eps", [-0.1, 1.5, True, "0.05"])
def test_a_bad_eval_epsilon_is_refused_by_its_key(small_cfg, eps):
    with pytest.raises(ValueError, match=r"policy\.eval\.eps"):
        create_policy(eval_cfg(small_cfg, eps), CARTPOLE, modes=("eval",), device="cpu")


def test_state_dict_roundtrip_via_torch_save(small_cfg):
    a = make_policy(small_cfg, seed=2, target_update_freq=7)
    batch = fixed_batch(seed=4)
    for _ in range(10):
        a.learn(batch)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    b = make_policy(small_cfg, seed=123, target_update_freq=7)
    assert not _params_equal(a.model, b.model)
    b.load_state_dict(state)
    assert b._updates == 10
    assert _params_equal(a.model, b.model)
    assert _params_equal(a.target_model, b.target_model)
    # Optimizer moments and the iteration count came along: the next steps match exactly,
    # including the target copy at iteration 14.
    for _ in range(5):
        la = a.learn(batch)["total_loss"]
        lb = b.learn(batch)["total_loss"]
        assert la == pytest.approx(lb, rel=1e-6, abs=1e-9)
    assert _params_equal(a.model, b.model)
    assert _params_equal(a.target_model, b.target_model)


@pytest.mark.parametrize("dueling", [True, False])
def test_qnetwork_shapes(dueling):
    net = QNetwork(SpaceSpec("X-v0", "box", (4,), 0, 0, "discrete", 3, 0, 0, (), ()), [8, 8], dueling=dueling)
    out = net(torch.zeros(5, 4))
    assert out.shape == (5, 3)


def test_dueling_head_advantage_is_centered():
    torch.manual_seed(0)
    net = QNetwork(SpaceSpec("X-v0", "box", (4,), 0, 0, "discrete", 3, 0, 0, (), ()), [8], dueling=True)
    x = torch.randn(6, 4)
    q = net(x)
    v = net.value(net.encoder(x))
    torch.testing.assert_close(q.mean(dim=1, keepdim=True), v)


def test_registered_as_dqn():
    algo = get_algorithm("dqn")
    assert algo.data_source == "replay" and algo.policy_class == "common.policy.dqn.policy:DQNPolicy"
    assert algo.collect_setting is collect_setting
