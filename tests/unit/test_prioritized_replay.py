"""Unit tests for proportional prioritized replay (workers/replay_buffer.py: SumTree,
PrioritizedReplayBuffer), its wiring in the replay data source (workers/sources/replay.py) and
the DQN side of it (importance weights in, |TD error| out).

Expected values are computed independently here (numpy cumsum, the formulas of Schaul et al.
2016), never read back from the code under test. Frequency checks use Pearson's chi-square
statistic against the df=9, p=0.001 critical value (scipy's, see CHI2_CRIT_DF9).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from easydict import EasyDict
from scipy.stats import chi2, chisquare

from common.config import compile_config
from common.policy import create_policy
from common.spaces import SpaceSpec
from workers.replay_buffer import PrioritizedReplayBuffer, SumTree
from workers.sources import create_source
from workers.sources.replay import ReplayFeeder

SCHEMA = {"obs": ((2,), np.dtype(np.float32)), "tag": ((), np.dtype(np.int64))}
CARTPOLE = SpaceSpec("CartPole-v1", "box", (4,), 0, 0, "discrete", 2, 0, 0, (), ())
# Upper 0.1 % point of the chi-square distribution with 9 degrees of freedom (10 cells), 27.877.
# Under a correct sampler the statistic exceeds it with probability 0.001 (stratified sampling
# only lowers that); a wrong distribution over 10^5 draws gives statistics in the hundreds or more.
CHI2_CRIT_DF9 = float(chi2.ppf(0.999, df=9))


def rows(tags) -> dict[str, np.ndarray]:
    """One row per tag: ``tag`` int64 identifies the row, ``obs`` = [tag, -tag]."""
    tags = np.asarray(tags, np.int64)
    return {"obs": np.stack([tags, -tags], axis=1).astype(np.float32), "tag": tags}


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's statistic sum (O - E)^2 / E for observed ``counts`` against ``probs`` (scipy's)."""
    return float(chisquare(counts, counts.sum() * np.asarray(probs, np.float64)).statistic)


def tag_counts(buf: PrioritizedReplayBuffer, n_rows: int, draws: int, batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(n_rows, np.int64)
    for _ in range(draws // batch):
        counts += np.bincount(buf.sample(batch, rng)["tag"], minlength=n_rows)
    return counts


def leaf_sum(buf: PrioritizedReplayBuffer, idx) -> np.ndarray:
    return buf._tree.get(np.asarray(idx))


# ---------------------------------------------------------------- SumTree

@pytest.mark.parametrize("capacity", [1, 7, 8, 100, 1000])
def test_sum_tree_total_and_prefix_search_match_a_numpy_cumsum(capacity):
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    p = rng.exponential(size=capacity)
    p[rng.random(capacity) < 0.2] = 0.0  # some empty leaves must never be found
    if p.sum() == 0:
        p[0] = 1.0
    tree.update(np.arange(capacity), p)
    assert tree.total == pytest.approx(p.sum(), rel=1e-12)
    np.testing.assert_allclose(tree.get(np.arange(capacity)), p)
    cum = np.cumsum(p)
    mass = np.concatenate([rng.random(5000) * p.sum(), [0.0]])
    # Brute force: the first leaf whose cumulative sum exceeds the mass.
    want = np.searchsorted(cum, mass, side="right")
    got = tree.find(mass)
    np.testing.assert_array_equal(got, want)
    assert np.all(p[got] > 0)


def test_sum_tree_batched_updates_with_repeated_indices_keep_sums_consistent():
    rng = np.random.default_rng(1)
    cap = 37
    tree, ref = SumTree(cap), np.zeros(cap)
    for _ in range(200):
        idx = rng.integers(0, cap, size=16)  # repeats are the norm with 16 of 37
        val = rng.random(16)
        tree.update(idx, val)
        for i, v in zip(idx, val):  # sequential semantics: the last write of an index wins
            ref[i] = v
        np.testing.assert_allclose(tree.get(np.arange(cap)), ref)
        assert tree.total == pytest.approx(ref.sum(), rel=1e-12)
    # Every inner node is the sum of its children after all those updates.
    for upper, lower in zip(tree.levels, tree.levels[1:]):
        np.testing.assert_allclose(upper, lower.reshape(len(upper), -1).sum(axis=1), rtol=1e-12)
    cum = np.cumsum(ref)
    mass = rng.random(2000) * ref.sum()
    np.testing.assert_array_equal(tree.find(mass), np.searchsorted(cum, mass, side="right"))


# ---------------------------------------------------------------- sampling frequencies

def test_sampling_frequencies_match_priorities_chi_square():
    alpha = 0.7
    buf = PrioritizedReplayBuffer(16, SCHEMA, alpha=alpha, beta=0.5)
    buf.extend(rows(range(10)))
    td = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 0.05, 4.0, 0.3, 1.5, 0.8])
    assert buf.update_priorities(np.arange(10), td) == 10
    probs = (td + buf.eps) ** alpha
    probs /= probs.sum()
    counts = tag_counts(buf, 10, draws=100_000, batch=100)
    stat = chi_square(counts, probs)
    assert stat < CHI2_CRIT_DF9, (stat, counts, probs)
    # The same counts are far from what alpha=1 (or uniform) would give: the test has power.
    p1 = (td + buf.eps) / (td + buf.eps).sum()
    assert chi_square(counts, p1) > 10 * CHI2_CRIT_DF9
    assert chi_square(counts, np.full(10, 0.1)) > 10 * CHI2_CRIT_DF9


def test_alpha_zero_samples_uniformly_whatever_the_priorities():
    buf = PrioritizedReplayBuffer(10, SCHEMA, alpha=0.0)
    buf.extend(rows(range(10)))
    buf.update_priorities(np.arange(10), np.geomspace(1e-3, 1e3, 10))
    counts = tag_counts(buf, 10, draws=50_000, batch=50, seed=3)
    assert chi_square(counts, np.full(10, 0.1)) < CHI2_CRIT_DF9, counts
    # Every weight is 1 when all probabilities are equal.
    out = buf.sample(64, np.random.default_rng(0), train_iter=0)
    np.testing.assert_allclose(out["weight"], 1.0, rtol=1e-6)


def test_update_priorities_changes_sampling():
    buf = PrioritizedReplayBuffer(8, SCHEMA, alpha=1.0)
    buf.extend(rows(range(8)))
    before = tag_counts(buf, 8, draws=8000, batch=80, seed=1)
    assert before.min() > 800  # all at the same (max) priority: ~1000 each
    buf.update_priorities(np.array([3]), np.array([1000.0]))  # others stay at the initial max 1.0
    after = tag_counts(buf, 8, draws=8000, batch=80, seed=2)
    p = np.ones(8)
    p[3] = 1000.0
    assert chi_square(after, p / p.sum()) < 24.322  # df=7, p=0.001
    assert after[3] > 0.98 * after.sum()


# ---------------------------------------------------------------- importance-sampling weights

def test_is_weights_are_n_p_to_minus_beta_over_the_batch_max():
    alpha, beta = 0.6, 0.4
    buf = PrioritizedReplayBuffer(32, SCHEMA, alpha=alpha, beta=beta)
    buf.extend(rows(range(20)))
    td = np.random.default_rng(4).exponential(size=20)
    buf.update_priorities(np.arange(20), td)
    p = (td + buf.eps) ** alpha
    prob = p / p.sum()
    for seed in range(5):
        out = buf.sample(16, np.random.default_rng(seed), train_iter=0)
        assert out["weight"].dtype == np.float32 and out["weight"].shape == (16,)
        w = (20 * prob[out["tag"]]) ** -beta
        np.testing.assert_allclose(out["weight"], w / w.max(), rtol=1e-5)
        assert out["weight"].max() == pytest.approx(1.0)
        # Rarer rows get larger weights.
        order = np.argsort(prob[out["tag"]])
        assert np.all(np.diff(out["weight"][order]) <= 1e-7)


def test_beta_anneals_linearly_to_one_and_weights_follow():
    buf = PrioritizedReplayBuffer(16, SCHEMA, alpha=1.0, beta=0.4, beta_anneal_iters=1000)
    assert buf.beta(0) == pytest.approx(0.4)
    assert buf.beta(250) == pytest.approx(0.55)
    assert buf.beta(500) == pytest.approx(0.7)
    assert buf.beta(1000) == pytest.approx(1.0)
    assert buf.beta(10**6) == pytest.approx(1.0)
    assert PrioritizedReplayBuffer(16, SCHEMA, beta=0.4, beta_anneal_iters=0).beta(10**6) == pytest.approx(0.4)
    buf.extend(rows(range(4)))
    td = np.array([1.0, 2.0, 4.0, 8.0])
    buf.update_priorities(np.arange(4), td)
    prob = (td + buf.eps) / (td + buf.eps).sum()
    for it, beta in ((0, 0.4), (500, 0.7), (5000, 1.0)):
        out = buf.sample(8, np.random.default_rng(it), train_iter=it)
        w = (4 * prob[out["tag"]]) ** -beta
        np.testing.assert_allclose(out["weight"], w / w.max(), rtol=1e-5)


def test_priority_arguments_are_checked():
    with pytest.raises(ValueError, match="priority_alpha"):
        PrioritizedReplayBuffer(8, SCHEMA, alpha=-0.1)
    with pytest.raises(ValueError, match="priority_beta"):
        PrioritizedReplayBuffer(8, SCHEMA, beta=1.5)


# ---------------------------------------------------------------- new rows, generations, full buffer

def test_new_rows_enter_at_the_max_priority_seen():
    alpha, eps = 0.5, 1e-6
    buf = PrioritizedReplayBuffer(16, SCHEMA, alpha=alpha, eps=eps)
    buf.extend(rows(range(4)))
    np.testing.assert_allclose(leaf_sum(buf, range(4)), (1.0 + eps) ** alpha)  # initial max priority 1
    buf.update_priorities(np.arange(4), np.array([0.1, 7.0, 0.2, 3.0]))
    buf.extend(rows([4, 5]))
    np.testing.assert_allclose(leaf_sum(buf, [4, 5]), (7.0 + eps) ** alpha)
    # The max never falls back: lowering every priority keeps new rows at 7.
    buf.update_priorities(np.arange(6), np.full(6, 0.01))
    buf.extend(rows([6]))
    np.testing.assert_allclose(leaf_sum(buf, [6]), (7.0 + eps) ** alpha)
    np.testing.assert_allclose(buf._tree.total, 6 * (0.01 + eps) ** alpha + (7.0 + eps) ** alpha)


def test_row_overwritten_after_sampling_keeps_its_new_priority():
    alpha, eps = 1.0, 1e-6
    buf = PrioritizedReplayBuffer(8, SCHEMA, alpha=alpha, eps=eps)
    buf.extend(rows(range(8)))
    buf.update_priorities(np.arange(8), np.full(8, 2.0))  # max seen: 2
    out = buf.sample(64, np.random.default_rng(0))
    sampled = np.unique(buf.last_idx)
    assert len(sampled) == 8  # stratified over equal priorities: every slot drawn
    np.testing.assert_array_equal(out["tag"], buf.last_idx)
    buf.extend(rows([100, 101, 102]))  # overwrites slots 0, 1, 2 (the ring wraps around)
    n = buf.update_last(np.full(64, 0.5))
    assert n == int(np.sum(~np.isin(buf.last_idx, [0, 1, 2])))
    # The new rows keep the max priority they entered with; the others took the feedback.
    np.testing.assert_allclose(leaf_sum(buf, [0, 1, 2]), 2.0 + eps)
    np.testing.assert_allclose(leaf_sum(buf, range(3, 8)), 0.5 + eps)
    # A stale generation passed explicitly is refused the same way.
    gen = buf._generation[[3]].copy()
    buf.extend(rows(range(200, 206)))  # overwrites 3..7 and 0 again
    assert buf.update_priorities(np.array([3]), np.array([9.0]), generation=gen) == 0
    np.testing.assert_allclose(leaf_sum(buf, [3]), 2.0 + eps)


def test_full_buffer_keeps_the_last_rows_and_tree_total_matches_its_leaves():
    buf = PrioritizedReplayBuffer(8, SCHEMA, alpha=0.6)
    for start in range(0, 20, 3):  # 20 rows in uneven chunks
        buf.extend(rows(range(start, min(start + 3, 20))))
    assert len(buf) == 8 and buf.pushed == 20
    rng = np.random.default_rng(7)
    seen = np.concatenate([buf.sample(32, rng)["tag"] for _ in range(50)])
    assert set(seen.tolist()) == set(range(12, 20))
    buf.update_priorities(np.arange(8), np.arange(1.0, 9.0))
    leaves = leaf_sum(buf, range(8))
    np.testing.assert_allclose(leaves, (np.arange(1.0, 9.0) + buf.eps) ** 0.6)
    assert buf._tree.total == pytest.approx(leaves.sum(), rel=1e-12)
    assert buf._tree.total == pytest.approx(buf._tree.levels[-1].sum(), rel=1e-12)
    buf.extend(rows(range(20, 25)))
    assert len(buf) == 8
    seen = np.concatenate([buf.sample(32, rng)["tag"] for _ in range(50)])
    assert set(seen.tolist()) == set(range(17, 25))


def test_non_power_of_two_capacity_never_samples_padding_leaves():
    buf = PrioritizedReplayBuffer(5, SCHEMA, alpha=1.0)
    buf.extend(rows(range(3)))  # not full: only slots 0..2 hold data
    rng = np.random.default_rng(0)
    for _ in range(200):
        idx_tags = buf.sample(7, rng)["tag"]
        assert set(idx_tags.tolist()) <= {0, 1, 2}


def test_one_chunk_larger_than_capacity_keeps_its_last_rows():
    buf = PrioritizedReplayBuffer(8, SCHEMA, alpha=1.0)
    buf.extend(rows(range(20)))
    assert len(buf) == 8
    rng = np.random.default_rng(1)
    seen = np.concatenate([buf.sample(32, rng)["tag"] for _ in range(50)])
    assert set(seen.tolist()) == set(range(12, 20))
    assert buf._tree.total == pytest.approx(leaf_sum(buf, range(8)).sum(), rel=1e-12)
    assert buf._tree.total == pytest.approx(8 * (1.0 + buf.eps))


@pytest.mark.parametrize("eps", [-1.0, 0.0])
def test_non_positive_priority_eps_is_refused(eps):
    with pytest.raises(ValueError, match="priority_eps"):
        PrioritizedReplayBuffer(8, SCHEMA, alpha=0.6, eps=eps)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_priorities_are_refused(bad):
    buf = PrioritizedReplayBuffer(8, SCHEMA)
    buf.extend(rows(range(4)))
    before = leaf_sum(buf, range(8)).copy()
    with pytest.raises(ValueError, match="finite"):
        buf.update_priorities(np.arange(4), np.array([1.0, bad, 2.0, 3.0]))
    np.testing.assert_array_equal(leaf_sum(buf, range(8)), before)  # nothing half-applied
    with pytest.raises(ValueError):
        buf.update_priorities(np.arange(4), np.ones(3))


def test_empty_buffer_refuses_to_sample():
    with pytest.raises(ValueError, match="empty"):
        PrioritizedReplayBuffer(8, SCHEMA).sample(4, np.random.default_rng(0))


# ---------------------------------------------------------------- ReplayFeeder

class FakeLearner:
    def __init__(self, train_iter: int = 0) -> None:
        self.train_iter = train_iter
        self.consumed_env_steps = 0


def prio_cfg(priority: bool = True):
    return compile_config({"exp_name": "per_test", "policy": {
        "learn": {"batch_size": 6, "train_iter_per_env_step": 0.0},
        "other": {"replay_buffer": {"replay_buffer_size": 50, "replay_start_size": 4, "priority": priority,
                                    "priority_alpha": 1.0, "priority_beta": 0.5,
                                    "priority_beta_anneal_iters": 100}}}})


def test_replay_feeder_with_priority_samples_weights_and_feedback_updates_priorities(fake_redis):
    learner = FakeLearner(train_iter=50)
    src = create_source("replay", fake_redis, "per_test", learner, prio_cfg(), SCHEMA, seed=0)
    assert isinstance(src, ReplayFeeder) and isinstance(src.store, PrioritizedReplayBuffer)
    src.store.extend(rows(range(10)))
    td0 = np.arange(1.0, 11.0)
    src.store.update_priorities(np.arange(10), td0)
    batch = src._take()
    assert batch["weight"].shape == (6,) and batch["weight"].dtype == np.float32
    # The learner's train_iter anneals beta: 0.5 + 0.5 * 50 / 100 = 0.75.
    prob = (td0 + src.store.eps) / (td0 + src.store.eps).sum()
    w = (10 * prob[batch["tag"]]) ** -0.75
    np.testing.assert_allclose(batch["weight"], w / w.max(), rtol=1e-5)
    idx = src.store.last_idx.copy()
    np.testing.assert_array_equal(batch["tag"], idx)
    td = np.linspace(0.5, 3.0, 6).astype(np.float32)
    src.feedback({"priority": td})
    expected = td0 + src.store.eps
    for i, v in zip(idx, td):  # last write of a repeated row wins
        expected[i] = float(v) + src.store.eps
    np.testing.assert_allclose(leaf_sum(src.store, range(10)), expected, rtol=1e-6)


def test_replay_feeder_feedback_without_priority_is_a_clear_error(fake_redis):
    src = create_source("replay", fake_redis, "per_test", FakeLearner(), prio_cfg(), SCHEMA, seed=0)
    src.store.extend(rows(range(10)))
    src._take()
    with pytest.raises(RuntimeError, match="priority"):
        src.feedback({})


def test_uniform_replay_feeder_has_no_weights_and_ignores_feedback(fake_redis):
    src = create_source("replay", fake_redis, "per_test", FakeLearner(), prio_cfg(False), SCHEMA, seed=0)
    src.store.extend(rows(range(10)))
    assert "weight" not in src._take()
    src.feedback({})  # nothing to update, no error


# ---------------------------------------------------------------- DQN with weights



def dqn_batch(n=16, seed=0):
    rng = np.random.default_rng(seed)
    return {"obs": rng.normal(size=(n, 4)).astype(np.float32), "action": rng.integers(0, 2, size=n).astype(np.int64),
            "reward": rng.normal(size=n).astype(np.float32), "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
            "done": rng.random(n) < 0.3, "discount": np.full(n, 0.9, np.float32)}


def make_dqn(small_cfg, seed=0):
    torch.manual_seed(seed)
    return create_policy(EasyDict(copy.deepcopy(small_cfg)), CARTPOLE, device="cpu")


def test_dqn_learn_with_weight_returns_abs_td_error_per_row(small_cfg):
    p = make_dqn(small_cfg)
    for i in range(3):  # online and target nets differ a little
        p.learn(dqn_batch(seed=10 + i))
    batch = dqn_batch(seed=1)
    with torch.no_grad():  # double-DQN TD error before the update, computed here
        q = p.model(torch.as_tensor(batch["obs"])).numpy().astype(np.float64)
        q_next = p.model(torch.as_tensor(batch["next_obs"])).numpy()
        q_tgt = p.target_model(torch.as_tensor(batch["next_obs"])).numpy().astype(np.float64)
    r = np.arange(16)
    target = batch["reward"] + batch["discount"] * (1 - batch["done"]) * q_tgt[r, q_next.argmax(1)]
    td = np.abs(q[r, batch["action"]] - target)
    out = p.learn(dict(batch, weight=np.ones(16, np.float32)))
    prio = out["priority"]
    assert isinstance(prio, np.ndarray) and prio.dtype == np.float32 and prio.shape == (16,)
    np.testing.assert_allclose(prio, td, rtol=1e-5, atol=1e-6)
    assert "priority" not in p.learn(batch)  # uniform replay: no priorities


def test_dqn_zero_weight_row_does_not_move_the_loss_or_the_update(small_cfg):
    base = make_dqn(small_cfg, seed=3)
    batch = dqn_batch(seed=2)
    w = np.ones(16, np.float32)
    w[5] = 0.0
    a, b, c = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    out_a = a.learn(dict(batch, weight=w))
    poisoned = {k: v.copy() for k, v in batch.items()}
    poisoned["reward"][5] = 1e6  # the zero-weight row's target is absurd: it must not matter
    poisoned["obs"][5] = 50.0
    out_b = b.learn(dict(poisoned, weight=w))
    assert out_a["total_loss"] == out_b["total_loss"]
    for x, y in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(x, y)
    # Removing the row instead: the same per-row sum over a mean of 15 instead of 16 rows.
    kept = {k: np.delete(v, 5, axis=0) for k, v in batch.items()}
    out_c = c.learn(dict(kept, weight=np.ones(15, np.float32)))
    assert out_a["total_loss"] * 16 == pytest.approx(out_c["total_loss"] * 15, rel=1e-5)
    # ... and the priority of every other row is unchanged by the poisoned one.
    np.testing.assert_allclose(np.delete(out_a["priority"], 5), out_c["priority"], rtol=1e-6)


def test_learner_train_feeds_dqn_td_errors_back_into_the_buffer(fake_redis, small_cfg, tmp_path):
    """BaseLearner.train -> priority_info -> FeedbackHook -> ReplayFeeder.feedback -> new leaves."""
    from workers.learner import BaseLearner
    from workers.learner_hooks import FeedbackHook

    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.other.replay_buffer.update(priority=True, priority_alpha=1.0, replay_buffer_size=64)
    policy = make_dqn(cfg, seed=5)
    lcfg = copy.deepcopy(cfg.policy.learn.learner)
    lcfg.hook.update(log_show_after_iter=0, save_ckpt_after_iter=0, save_ckpt_every_s=0, save_ckpt_after_run=False,
                     load_ckpt_before_run="")
    learner = BaseLearner(lcfg, policy, exp_name="per_test", log_dir=str(tmp_path / "log"))
    src = create_source("replay", fake_redis, "per_test", learner, cfg, policy.schema(), seed=0)
    learner.register_hook(FeedbackHook(src))
    try:
        data = dqn_batch(n=40, seed=6)
        src.store.extend(data)
        batch = src._take()
        idx = src.store.last_idx.copy()
        log_vars = learner.train(batch)
        assert "priority" not in log_vars  # moved to priority_info, not logged as a scalar
        prio = learner.priority_info["priority"]
        assert prio.shape == (len(idx),) and np.all(prio >= 0)  # values checked against |TD| above
        expected = np.full(64, 0.0)
        expected[:40] = 1.0 + src.store.eps  # rows never sampled keep the initial max priority
        for i, v in zip(idx, prio):
            expected[i] = float(v) + src.store.eps
        np.testing.assert_allclose(leaf_sum(src.store, range(64)), expected, rtol=1e-6)
        assert learner.train_iter == 1
    finally:
        learner.close()
