"""Unit tests for common/policy/impala: V-trace against hand computation and the returns it reduces
to, weight clipping, the trajectory adder, the learn step, the consume-once queue, the config check."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from common import spaces
from common.config import ConfigError, compile_config
from common.policy import create_policy
from common.policy.impala.policy import policy_term, vtrace
from workers.sources.consume_once import ChunkQueue

F, T = False, True


def run_vtrace(values, ratio, reward, terminated, truncated, trunc_value=None, mask=None, gamma=0.9, lam=1.0,
               rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0, weighted=True):
    """One trajectory (lists) -> (vs, adv) as float64 numpy (T,)."""
    n = len(reward)
    as_t = lambda x, dt=torch.float64: torch.tensor(np.array([x]), dtype=dt)  # noqa: E731 - (1, ...) tensors
    vs, adv = vtrace(as_t(values), as_t(np.log(ratio)), as_t(reward), as_t(terminated, torch.bool),
                     as_t(truncated, torch.bool), as_t(trunc_value or [0.0] * n),
                     as_t(mask or [True] * n, torch.bool), gamma, lam, rho_bar, c_bar, pg_rho_bar, weighted)
    return vs[0].numpy(), adv[0].numpy()


# ---------------------------------------------------------------- V-trace by hand

# 5 steps, gamma 0.9, lambda 1, rho_bar = c_bar = pg_rho_bar = 1. The episode terminates at t=1 and
# is truncated at t=3 (the behaviour's V(final obs) = 10); obs[5] bootstraps the last step.
HAND = dict(values=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], ratio=[0.5, 2.0, 1.0, 0.8, 1.5], reward=[1.0] * 5,
            terminated=[F, T, F, F, F], truncated=[F, F, F, T, F], trunc_value=[0.0, 0.0, 0.0, 10.0, 0.0])
# rho = c = [0.5, 1, 1, 0.8, 1]; next_v = [V1, -, V3, 10, V5] = [2, -, 4, 10, 6]
# delta = rho * (r + g * next_v - V):
#   t0 0.5 * (1 + 0.9*2 - 1) = 0.9    t1 1 * (1 - 2) = -1 (terminal)    t2 1 * (1 + 0.9*4 - 3) = 1.6
#   t3 0.8 * (1 + 0.9*10 - 4) = 4.8   t4 1 * (1 + 0.9*6 - 5) = 1.4
# acc (trace cut after t1 and t3): t4 1.4; t3 4.8; t2 1.6 + 0.9*1*4.8 = 5.92; t1 -1; t0 0.9 + 0.9*0.5*(-1) = 0.45
HAND_VS = [1.45, 1.0, 8.92, 8.8, 6.4]
# q = r + g * (10 if truncated else vs_{t+1}, V5 at the end): [1 + 0.9*1.0, 1, 1 + 0.9*8.8, 1 + 0.9*10, 1 + 0.9*6]
# adv = min(1, ratio) * (q - V): [0.5*0.9, -1, 5.92, 0.8*6, 1.4]
HAND_ADV = [0.45, -1.0, 5.92, 4.8, 1.4]


def test_vtrace_equals_a_hand_computation_with_a_terminal_and_a_truncation():
    vs, adv = run_vtrace(**HAND)
    np.testing.assert_allclose(vs, HAND_VS, atol=1e-9)
    np.testing.assert_allclose(adv, HAND_ADV, atol=1e-9)


def test_padding_contributes_nothing_and_the_last_real_step_bootstraps_from_the_next_obs():
    # The hand trajectory cut after t2 (a task's end): obs[3] (V = 4) bootstraps step 2.
    vs, adv = run_vtrace(**dict(HAND, mask=[T, T, T, F, F]))
    # t2: 1 + 0.9*4 - 3 = 1.6 (no trace past it); t1 -1; t0 0.9 - 0.45
    np.testing.assert_allclose(vs[:3], [1.45, 1.0, 4.6], atol=1e-9)
    np.testing.assert_allclose(adv, [0.45, -1.0, 1.6, 0.0, 0.0], atol=1e-9)


# ---------------------------------------------------------------- on-policy: n-step and lambda returns

def nstep_return(values, reward, terminated, truncated, trunc_value, t, n, gamma):
    """The n-step return from t, stopping at the episode's end or the trajectory's."""
    g, disc = 0.0, 1.0
    for k in range(t, t + n):
        g += disc * reward[k]
        disc *= gamma
        if terminated[k]:
            return g
        if truncated[k]:
            return g + disc * trunc_value[k]
        if k == len(reward) - 1:
            return g + disc * values[k + 1]
    return g + disc * values[t + n]


def steps_left(terminated, truncated, t):
    """Steps from t to the end of its episode within the trajectory (inclusive)."""
    for k in range(t, len(terminated)):
        if terminated[k] or truncated[k]:
            return k - t + 1
    return len(terminated) - t


def lambda_return(values, reward, terminated, truncated, trunc_value, t, lam, gamma):
    """(1 - lambda) * sum_n lambda^(n-1) G^(n), the last (longest) return taking the remaining weight."""
    m = steps_left(terminated, truncated, t)
    args = (values, reward, terminated, truncated, trunc_value, t)
    return sum((1 - lam) * lam ** (n - 1) * nstep_return(*args, n, gamma) for n in range(1, m)) + \
        lam ** (m - 1) * nstep_return(*args, m, gamma)


@pytest.mark.parametrize("lam", [1.0, 0.8, 0.0])
def test_on_policy_vtrace_is_the_lambda_return(lam):
    rng = np.random.default_rng(3)
    n = 9
    values = list(rng.normal(size=n + 1))
    reward = list(rng.normal(size=n))
    terminated = [F, F, T, F, F, F, F, F, F]
    truncated = [F, F, F, F, F, T, F, F, F]
    trunc_value = [0.0] * 5 + [2.5] + [0.0] * 3
    vs, adv = run_vtrace(values, [1.0] * n, reward, terminated, truncated, trunc_value, gamma=0.95, lam=lam)
    want = [lambda_return(values, reward, terminated, truncated, trunc_value, t, lam, 0.95) for t in range(n)]
    np.testing.assert_allclose(vs, want, atol=1e-9)
    if lam == 1.0:  # lambda 1: the return to the end of the episode or of the trajectory
        assert vs[0] == pytest.approx(reward[0] + 0.95 * reward[1] + 0.95 ** 2 * reward[2])
        assert vs[8] == pytest.approx(reward[8] + 0.95 * values[9])


# ---------------------------------------------------------------- APPO

def test_appos_advantage_is_q_minus_v_without_the_importance_weight():
    # The hand trajectory's q - V (HAND_ADV before its min(1, ratio) factor: 0.9 at t0, 6 at t3).
    _, adv = run_vtrace(**HAND, weighted=False)
    np.testing.assert_allclose(adv, [0.9, -1.0, 5.92, 6.0, 1.4], atol=1e-9)


def _grad(behaviour_logp, adv, appo_clip, logp=(0.0, 0.0)):
    lp = torch.tensor([list(logp)], dtype=torch.float64, requires_grad=True)
    policy_term(lp, torch.tensor([list(behaviour_logp)], dtype=torch.float64),
                torch.tensor([list(adv)], dtype=torch.float64), appo_clip).sum().backward()
    return lp.grad[0].numpy()


def test_appos_surrogate_matches_the_policy_gradient_on_policy_and_stops_past_its_clip():
    # On-policy (r = 1): d/dlogp of -r*A is -A, IMPALA's -A * log pi too.
    np.testing.assert_allclose(_grad([0.0, 0.0], [2.0, -3.0], 0.2), _grad([0.0, 0.0], [2.0, -3.0], 0.0))
    # r = e^0.5 ~ 1.65 > 1.2 with A > 0, r = e^-0.5 ~ 0.61 < 0.8 with A < 0: clipped, no gradient.
    np.testing.assert_allclose(_grad([-0.5, 0.5], [2.0, -3.0], 0.2), [0.0, 0.0])
    # The same ratios against their advantage's sign are not clipped (min picks the unclipped term): -r*A.
    np.testing.assert_allclose(_grad([-0.5, 0.5], [-2.0, 3.0], 0.2), [2.0 * np.exp(0.5), -3.0 * np.exp(-0.5)])


# ---------------------------------------------------------------- clipped weights

def test_importance_weights_above_rho_bar_count_as_rho_bar():
    base = dict(HAND, ratio=[1.0] * 5)
    clipped_vs, clipped_adv = run_vtrace(**dict(base, ratio=[7.0, 3.0, 1.5, 9.0, 2.0]))
    vs, adv = run_vtrace(**base)
    np.testing.assert_allclose(clipped_vs, vs, atol=1e-9)
    np.testing.assert_allclose(clipped_adv, adv, atol=1e-9)


def test_each_clip_acts_on_its_own_weight():
    one = dict(values=[0.0, 0.0, 0.0], ratio=[4.0, 4.0], reward=[1.0, 1.0], terminated=[F, F], truncated=[F, F],
               gamma=1.0)
    # rho_bar 2, c_bar 3: delta = 2 * 1 each; acc1 = 2, acc0 = 2 + 3 * 2 = 8
    vs, adv = run_vtrace(**one, rho_bar=2.0, c_bar=3.0, pg_rho_bar=1.5)
    np.testing.assert_allclose(vs, [8.0, 2.0])
    # adv0 = 1.5 * (1 + vs1 - 0) = 4.5; adv1 = 1.5 * (1 + V2) = 1.5
    np.testing.assert_allclose(adv, [4.5, 1.5])
    # lambda scales the trace weight: c = 0.5 * 3 -> acc0 = 2 + 1.5 * 2
    vs, _ = run_vtrace(**one, rho_bar=2.0, c_bar=3.0, lam=0.5)
    np.testing.assert_allclose(vs, [5.0, 2.0])
    # weights below the clips stay as they are
    vs, _ = run_vtrace(**dict(one, ratio=[0.5, 0.25]), rho_bar=2.0, c_bar=3.0)
    np.testing.assert_allclose(vs, [0.5 + 0.5 * 0.25, 0.25])


# ---------------------------------------------------------------- policy, adder, learn

def impala_cfg(env_id="CartPole-v1", learn=None, **collect):
    model = {"encoder_hidden_size_list": [16], "actor_head_hidden_size": 16, "critic_head_hidden_size": 16}
    if env_id.startswith("MinAtar"):  # 10x10 grids: MinAtar's one 3x3 conv (the Nature torso does not fit)
        model["conv"] = [[16, 3, 1]]
    return compile_config({"exp_name": "impala_test", "env": {"env_id": env_id},
                           "policy": {"model": model,
                                      "learn": {"batch_size": 4, **(learn or {})},
                                      "collect": {"unroll_length": 3, **collect}}},
                          {"policy": {"type": "impala"}})


def make_policy(env_id="CartPole-v1", learn=None):
    cfg = impala_cfg(env_id, learn)
    spec = spaces.probe(cfg)
    torch.manual_seed(0)
    return create_policy(cfg, spec, device="cpu")


def ob(*ids):
    o = np.zeros((len(ids), 4), np.float32)
    o[:, 0] = ids
    return o


def test_adder_rows_are_trajectories_with_bootstrap_obs_truncation_values_and_padding(monkeypatch):
    policy = make_policy()
    monkeypatch.setattr(policy, "values", lambda obs: np.asarray(obs)[:, 0] * 10)  # V(final) = 10 * id
    adder = policy.make_adder(2, {})
    rec = {"action": np.array([0, 1]), "logp": np.array([-0.1, -0.2], np.float32)}
    r = np.ones(2, np.float32)
    # env 1 is truncated at t=1: its final obs (id 9) is not the next obs it acts on (id 13)
    assert adder.add(ob(1, 11), rec, r, ob(2, 12), np.array([F, F]), np.array([F, F])) is None
    assert adder.add(ob(2, 12), rec, r, ob(3, 9), np.array([T, T]), np.array([F, T])) is None
    rows = adder.add(ob(0, 13), rec, r, ob(4, 14), np.array([F, F]), np.array([F, F]))
    assert rows["obs"].shape == (2, 4, 4) and rows["action"].shape == (2, 3)
    np.testing.assert_array_equal(rows["obs"][:, :, 0], [[1, 2, 0, 4], [11, 12, 13, 14]])
    np.testing.assert_array_equal(rows["terminated"], [[F, T, F], [F, T, F]])
    np.testing.assert_array_equal(rows["truncated"], [[F, F, F], [F, F, F]])  # terminal wins over truncated
    np.testing.assert_array_equal(rows["trunc_value"], np.zeros((2, 3)))
    adder.add(ob(4, 14), rec, r, ob(5, 9), np.array([F, F]), np.array([F, T]))
    short = adder.flush(ob(5, 15))  # the task's end after one step: padded, bootstrapping at obs[1]
    np.testing.assert_array_equal(short["obs"][:, :, 0], [[4, 5, 5, 5], [14, 15, 15, 15]])
    np.testing.assert_array_equal(short["mask"], [[T, F, F], [T, F, F]])
    np.testing.assert_array_equal(short["truncated"][:, 0], [F, T])
    np.testing.assert_allclose(short["trunc_value"][:, 0], [0.0, 90.0])
    for k, (shape, dt) in policy.schema().items():
        assert short[k].shape[1:] == shape and short[k].dtype == dt, k
    assert adder.flush(ob(5, 15)) is None


@pytest.mark.parametrize("env_id,learn", [("CartPole-v1", None), ("Pendulum-v1", None), ("MinAtar/Breakout-v1", None),
                                          ("CartPole-v1", {"appo_clip": 0.2}), ("Pendulum-v1", {"appo_clip": 0.2})])
def test_learn_on_collected_trajectories_returns_finite_scalars_and_changes_weights(env_id, learn):
    """Discrete and Box actions, flat and image (conv torso) observations, IMPALA's and APPO's loss."""
    from gymnasium.vector import SyncVectorEnv

    from common import envs

    if env_id.startswith("MinAtar"):
        pytest.importorskip("minatar")
    policy = make_policy(env_id, learn)
    env = SyncVectorEnv([lambda: envs.make(policy.cfg.env, train=True) for _ in range(4)])
    spec = policy.spec
    obs = spec.obs_batch(env.reset(seed=0)[0])
    adder, rng, rows = policy.make_adder(4, {}), np.random.default_rng(0), None
    while rows is None:
        a, rec = policy.act(obs, {}, rng)
        nxt, r, term, trunc, _ = env.step(a)
        nxt = spec.obs_batch(nxt)
        rows = adder.add(obs, rec, r, nxt, term, trunc)
        obs = nxt
    assert rows["obs"].dtype == spec.obs_dtype and rows["obs"].shape == (4, 4, *spec.obs_shape)
    before = {k: v.copy() for k, v in policy.get_weights().items()}
    info = policy.learn(rows)
    assert all(np.isfinite(v) for v in info.values()) and info["rows"] == 4 and info["steps"] == 12
    assert info["rho_mean"] == pytest.approx(1.0, abs=1e-4)  # the same weights acted: on-policy
    assert any(not np.array_equal(before[k], v) for k, v in policy.get_weights().items())


# ---------------------------------------------------------------- consume-once queue

SCHEMA = {"x": ((2,), np.float32)}


def test_chunk_queue_hands_out_each_row_once_oldest_first_with_its_version():
    q = ChunkQueue(SCHEMA)
    q.extend({"x": np.arange(6, dtype=np.float32).reshape(3, 2)}, version=4)
    q.extend({"x": np.arange(6, 10, dtype=np.float32).reshape(2, 2)}, version=5)
    rows, versions = q.take(2)
    np.testing.assert_array_equal(rows["x"][:, 0], [0, 2]) and np.testing.assert_array_equal(versions, [4, 4])
    rows, versions = q.take(2)  # the first chunk's tail, then the second chunk's head
    np.testing.assert_array_equal(rows["x"][:, 0], [4, 6])
    np.testing.assert_array_equal(versions, [4, 5])
    assert len(q) == 1 and q.pushed == 5 and q.taken == 4
    with pytest.raises(ValueError, match="only 1 rows queued"):
        q.take(2)


# ---------------------------------------------------------------- config check

@pytest.mark.parametrize("key,value", [("learn.rho_bar", 0.0), ("learn.c_bar", -1.0), ("collect.unroll_length", 0),
                                       ("collect.vtrace_lambda", 1.5), ("collect.discount_factor", -0.1),
                                       ("learn.grad_clip_norm", -1.0), ("learn.appo_clip", 1.0),
                                       ("learn.appo_clip", -0.1)])
def test_bad_vtrace_settings_are_refused_naming_the_key(key, value):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=f"'policy.{key}'"):
        compile_config({"env": {"env_id": "CartPole-v1"}, "policy": {section: {name: value}}},
                       {"policy": {"type": "impala"}})


# ---------------------------------------------------------------- back-pressure

class FakeLearner:
    def __init__(self, train_iter: int = 0) -> None:
        self.train_iter, self.consumed_env_steps = train_iter, 0


def consume_once_source(fake_redis, learner, reader, batch=2, max_rows=4, max_lag=3):
    from types import SimpleNamespace

    from workers.sources import create_source

    cfg = compile_config({"env": {"env_id": "CartPole-v1"},
                          "policy": {"learn": {"batch_size": batch, "max_queued_rows": max_rows,
                                               "max_policy_lag": max_lag}}}, {"policy": {"type": "impala"}})
    src = create_source("consume_once", fake_redis, "bp_test", learner, cfg, SCHEMA, seed=0)
    src.reader = SimpleNamespace(env_steps=0, env_steps_base=reader, error=None)
    return src


def rows(n, tag=0.0):
    return {"x": np.full((n, 2), tag, np.float32)}


def test_collectors_may_lead_the_trained_rows_by_max_queued_rows(fake_redis):
    learner = FakeLearner()
    src = consume_once_source(fake_redis, learner, reader=1000, max_rows=4)
    assert src.envstep_limit(0) >= 2**62  # no row yet: the env steps per row are unknown
    for _ in range(3):  # 3 rows of 20 env steps each ingested, none trained on
        src.store.extend(rows(1), version=0)
        src.reader.env_steps += 20
    # trained on: 1060 - 3 queued rows * 20 = 1000; + 4 rows * 20
    assert src.envstep_limit(0) == 1000 + 80
    src()  # a batch of 2 rows trained on: the limit moves by their 40 env steps
    assert src.envstep_limit(1) == 1000 + 40 + 80


def test_rows_past_max_policy_lag_are_dropped_counted_and_never_trained_on(fake_redis):
    learner = FakeLearner(train_iter=10)
    src = consume_once_source(fake_redis, learner, reader=0, batch=2, max_rows=8, max_lag=3)
    src.store.extend(rows(2, tag=6.0), version=6)  # lag 4 > 3: stale
    src.store.extend(rows(1, tag=7.0), version=7)  # lag 3: kept
    src.store.extend(rows(2, tag=9.0), version=9)
    batch = src()
    np.testing.assert_array_equal(batch["x"][:, 0], [7.0, 9.0])
    st = src.stats()
    assert st["stale_chunks"] == 1 and st["stale_rows"] == 2 and st["taken"] == 2 and st["buffer_size"] == 1
    assert st["pushed"] == st["taken"] + st["stale_rows"] + st["buffer_size"]  # every row accounted for
    assert st["data_lag_mean"] == pytest.approx((3 + 1) / 2) and st["data_lag_max"] == 3


@pytest.mark.parametrize("key,value", [("learn.max_queued_rows", 3), ("learn.max_policy_lag", -1)])
def test_bad_back_pressure_settings_are_refused_naming_the_key(key, value):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=f"'policy.{key}'"):
        compile_config({"env": {"env_id": "CartPole-v1"},
                        "policy": {"learn": {"batch_size": 4, name: value}}}, {"policy": {"type": "impala"}})
