"""A collector adopts the published policy version whenever it differs from the one it holds, older too.

A replacement learner resumes from its last checkpoint and republishes the version it was saved
at, which can be older than what the collectors hold (version 500 published, checkpoint taken at
300): the sequence of versions goes back, and the collectors must act with 300 from then on, or
they keep producing data from weights nobody trains. On fakeredis (the chunk script runs in its Lua).
"""

from __future__ import annotations

import copy

import fakeredis
import numpy as np
import pytest

from common import keys, spaces
from common.config import compile_config
from common.policy import create_policy
from tests.fixtures import long_envs  # noqa: F401  (registers Countdown-v0)
from workers.collector import Collector, build_live_envs
from workers.comm_collector import RedisCommCollector
from workers.publication import publish_policy

EXP, BUF, POL = "handover", "buffer_h", "policy_h"


def _cfg():
    return compile_config({"exp_name": EXP, "env": {"env_id": "Countdown-v0", "env_kwargs": {"length": 50},
                                                    "collector_env_num": 2, "import_names": ["tests.fixtures.long_envs"]},
                           "policy": {"model": {"hidden_size_list": [8]},
                                      "collect": {"n_sample": 4, "collector": {"task_env_steps": 16}}}},
                          {"policy": {"type": "dqn"}})


def _weights(cfg, value):
    """The config's DQN weights, every entry ``value`` (so which version is held shows in them)."""
    c = copy.deepcopy(cfg)
    spec = spaces.probe(c)
    spaces.check_model(c, spec)
    return {k: np.full_like(v, value) for k, v in create_policy(c, spec, modes=("learn",), device="cpu")
            .get_weights().items()}


def _comm(conn, task_id):
    conn.set(keys.lease(EXP, task_id), "1")
    task = {"exp_name": EXP, "task_id": task_id, "buffer_id": BUF, "policy_id": POL, "eval_flag": False}
    return RedisCommCollector(conn, task, data_ttl_s=600)


def _task(task_id):
    return {"exp_name": EXP, "task_id": task_id, "buffer_id": BUF, "policy_id": POL, "eval_flag": False, "seed": 1,
            "collect_setting": {"eps": 0.5}, "envstep": 0}


def _sent_versions(conn):
    """Policy version of each chunk's metadata in the run's buffer stream, oldest first."""
    return [int(fields[b"policy_version"]) for _, fields in conn.xrange(keys.buffer_meta(EXP, BUF))]


@pytest.fixture
def conn():
    return fakeredis.FakeRedis()


def test_the_comm_adopts_an_older_version_republished_by_a_replacement_learner(conn):
    cfg = _cfg()
    comm = _comm(conn, "t0")
    publish_policy(conn, EXP, POL, _weights(cfg, 0.5), 500, 10_000)
    assert comm.get_policy_update_info() is not None and comm.policy_version == 500
    publish_policy(conn, EXP, POL, _weights(cfg, -0.3), 300, 10_000)  # the replacement resumed from 300
    comm.send_stepdata("d0", {"obs": np.zeros((4, 1), np.float32)})
    comm.send_metadata({"data_id": "d0", "policy_version": 500, "n_samples": 4, "env_steps": 4})
    assert comm.flush() is True  # the published version differs from the one held
    assert comm.wait_for_policy_update(0.0) is True  # on-policy collectors wait for it the same way
    weights = comm.get_policy_update_info()
    assert comm.policy_version == 300
    assert all(np.all(w == np.float32(-0.3)) for w in weights.values())
    assert comm.get_policy_update_info() is None  # held now: not read again


def test_a_collector_on_kept_envs_acts_with_the_older_republished_version(conn):
    """Task 1 acts with version 500 and keeps its envs (and the version they hold); the learner is
    replaced and republishes 300; task 2 on the same envs fetches 300 and sends every chunk from it."""
    cfg = _cfg()
    publish_policy(conn, EXP, POL, _weights(cfg, 0.5), 500, 10_000)
    live = build_live_envs(cfg, _task("t1"))
    try:
        first = Collector(cfg, _task("t1"), _comm(conn, "t1"), live).run()
        assert first["policy_version"] == 500 and live.policy_version == 500
        sent_by_first = len(_sent_versions(conn))
        assert sent_by_first and set(_sent_versions(conn)) == {500}

        publish_policy(conn, EXP, POL, _weights(cfg, -0.3), 300, 10_000)
        second = Collector(cfg, _task("t2"), _comm(conn, "t2"), live).run()
    finally:
        live.close()
    assert second["policy_version"] == 300 and live.policy_version == 300
    assert set(_sent_versions(conn)[sent_by_first:]) == {300}
    held = live.policy.get_weights()
    assert all(np.all(w == np.float32(-0.3)) for w in held.values())
