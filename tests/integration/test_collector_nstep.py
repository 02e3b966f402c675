"""n-step rows through the real collector: episode ends (terminal and time limit) and the task's end.

A real collector task (real CartPole-v1 vector env, real Redis) sends its chunks; the test
re-plays the same env from the same seed with the actions found in the rows and derives every
row independently: the n-step return, the bootstrap observation, ``done`` (terminated only,
never on the time limit) and the discount ``gamma ** m`` (m = steps summed: n, fewer at an
episode end, fewer at the task's end where the rows bootstrap from the current observation).
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
from easydict import EasyDict

from common import keys, lease, serialization, streams
from common.seeding import env_seeds
from coordinator.commander import SoloCommander
from workers.collector import Collector
from workers.comm_collector import RedisCommCollector
from workers.publication import publish_policy
from tests.conftest import initial_weights

pytestmark = pytest.mark.redis_server

STEPS, N_SAMPLE, LIMIT = 203, 32, 20  # 203 is no multiple of 32: the last chunk is partial


def run_task(conn, small_cfg):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.env.collector_env_num = 1
    cfg.env.env_kwargs = {"max_episode_steps": LIMIT}  # random play reaches both ends
    cfg.policy.collect.n_sample = N_SAMPLE
    cfg.policy.collect.collector.task_env_steps = STEPS
    commander = SoloCommander(cfg, run_id="run-n")
    conn.set(keys.run(cfg.exp_name), "run-n")
    learner = commander.get_learner_task()
    task = commander.get_collector_task()
    task["collect_setting"] = {"eps": 1.0}  # uniform random play: terminations and time limits both come
    lease.grant(conn, cfg.exp_name, task["task_id"], 600)
    weights = initial_weights(cfg)
    publish_policy(conn, cfg.exp_name, learner["policy_id"], weights, 0, 2**40)
    comm = RedisCommCollector(conn, task, 600)
    Collector(cfg, task, comm).run()
    comm.close()
    entries = conn.xrange(keys.buffer_meta(cfg.exp_name, task["buffer_id"]))
    chunks = []
    for _, raw in entries:
        meta = streams.decode_fields(raw)
        chunks.append(serialization.loads(conn.get(keys.data(cfg.exp_name, meta["data_id"]))))
    rows = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    return cfg, task, rows, [len(c["reward"]) for c in chunks]


def expected_rows(cfg, seed, actions, nstep, gamma):
    """Replay CartPole with ``actions``; the rows an n-step adder must emit, in emission order."""
    env = gym.make(cfg.env.env_id, max_episode_steps=LIMIT)
    obs, _ = env.reset(seed=seed)
    steps = []  # (obs, action, reward, next_obs, terminated, truncated)
    for a in actions:
        nxt, r, term, trunc, _ = env.step(int(a))
        steps.append((obs, int(a), float(r), nxt, term, trunc))
        obs = env.reset()[0] if term or trunc else nxt
    rows = []
    for t, (o, a, _, _, _, _) in enumerate(steps):
        ret, m, done, boot = 0.0, 0, False, None
        for k in range(t, min(t + nstep, len(steps))):
            _, _, r, nxt, term, trunc = steps[k]
            ret += gamma ** m * r
            m += 1
            boot = nxt
            if term or trunc:
                done = term
                break
        # At the task's end (fewer than n steps left, episode not over) the row bootstraps from
        # the current observation, which is the last step's next_obs.
        rows.append((o, a, ret, boot, done, gamma ** m))
    return rows, steps


def test_nstep_rows_through_the_real_collector(real_redis, small_cfg):
    cfg, task, rows, sizes = run_task(real_redis, small_cfg)
    nstep, gamma = int(cfg.policy.nstep), float(cfg.policy.discount_factor)
    assert nstep == 3
    n = len(rows["reward"])
    assert n == STEPS  # one row per env step, none lost at episode ends or at the task's end
    # A chunk is sent once it holds n_sample rows; an episode end emits up to nstep rows at once and
    # rows are never split across chunks (each chunk has one policy version tag).
    assert all(N_SAMPLE <= k < N_SAMPLE + nstep for k in sizes[:-1]) and 0 < sizes[-1] < N_SAMPLE + nstep, sizes
    exp, steps = expected_rows(cfg, env_seeds(int(task["seed"]), 1)[0], rows["action"], nstep, gamma)
    # Rows are emitted in time order for one env (episode-end and task-end flushes included).
    np.testing.assert_allclose(rows["obs"], np.stack([e[0] for e in exp]), rtol=1e-6)
    np.testing.assert_allclose(rows["reward"], [e[2] for e in exp], rtol=1e-5)
    np.testing.assert_allclose(rows["next_obs"], np.stack([e[3] for e in exp]), rtol=1e-6)
    np.testing.assert_array_equal(rows["done"], [e[4] for e in exp])
    np.testing.assert_allclose(rows["discount"], [e[5] for e in exp], rtol=1e-6)
    # The run covered what the test is about.
    terminated = sum(s[4] for s in steps)
    truncated = sum(s[5] and not s[4] for s in steps)
    assert terminated > 0 and truncated > 0, (terminated, truncated)
    assert rows["discount"][-1] == pytest.approx(gamma) and not rows["done"][-1]  # task end: 1 step left
    short = rows["discount"] > gamma ** nstep + 1e-6  # fewer than n steps summed
    assert short.sum() >= 2 * (terminated + truncated)  # the last 2 rows of each episode are short
