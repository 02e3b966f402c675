"""Episodes that outlive collector tasks, on the full stack: ``rqrl train`` (its collector
workers are ``workers.worker.CollectorWorker``), real rq workers and a private Redis.

``Countdown-v0`` episodes last 200 env steps; each collector task takes 20 per env, so an
episode spans 10 tasks. Every training episode the run finishes must have the env's own length
(none cut by a task's end), and each collector worker builds the run's envs once.
"""

from __future__ import annotations

import os

import pytest

from common import keys, streams
from common.connection import connect
from tests.conftest import REPO, run_rqrl

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.server_agnostic]

CONFIG = str(REPO / "tests" / "fixtures" / "countdown_dqn.py")


def _events(conn, ns):
    return [streams.decode_fields(raw) for _, raw in conn.xrange(keys.events(ns))]


@pytest.mark.timeout(300)
def test_training_episodes_keep_the_envs_length_across_many_tasks(tmp_path, redis_server):
    conn = connect(redis_server.url)
    exp = f"countdown_{os.getpid()}"
    res = run_rqrl("train", CONFIG, "--redis-url", redis_server.url, "--set", f"exp_name={exp}", "--name", "r",
                   cwd=tmp_path, timeout=280)
    assert res.returncode == 2 and "max_env_step 2400 reached" in res.stdout, res.stdout + res.stderr[-3000:]
    evs = _events(conn, keys.namespace(exp, "r"))
    train = [e for e in evs if e["type"] == "finished" and e["task_type"] == "collector" and not e["eval_flag"]]
    assert len(train) >= 20, f"only {len(train)} training tasks: tasks were not much shorter than episodes"
    finished = [e for e in train if e["real_episode_count"] > 0]
    assert sum(e["real_episode_count"] for e in train) >= 4
    assert {(e["min_step_per_episode"], e["max_step_per_episode"]) for e in finished} == {(200, 200)}, finished
    assert all(e["episodes_cut"] == 0 for e in train)
    builds: dict[str, int] = {}
    for e in train:
        builds[e["worker"]] = builds.get(e["worker"], 0) + int(e["env_built"])
    assert set(builds.values()) == {1}, f"env builds per collector worker: {builds}"
