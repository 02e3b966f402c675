"""Independent randomness: no two tasks (or envs) of a run start from the same states, eval tasks
included, and a run's seeds are reproducible from its seed."""

from __future__ import annotations

import numpy as np
import pytest

import workers.collector as collector_mod
from common import keys
from common.config import apply_overrides
from common.seeding import env_seeds, task_seed
from coordinator.commander import SoloCommander
from tests.integration.test_bad_input import _collector_task
from common import lease

pytestmark = pytest.mark.redis_server


def test_no_two_tasks_of_a_run_repeat_start_states(real_redis, redis_server, small_cfg, monkeypatch):
    cfg = apply_overrides(small_cfg, ["policy.collect.collector.task_env_steps=64"])
    starts: list[tuple] = []
    real_make = collector_mod.make_vector_env

    def recording_make(*args, **kwargs):
        env = real_make(*args, **kwargs)
        real_reset = env.reset

        def reset(*a, **k):
            obs, info = real_reset(*a, **k)
            starts.extend(tuple(np.round(o, 6)) for o in obs)
            return obs, info
        env.reset = reset
        return env

    monkeypatch.setattr(collector_mod, "make_vector_env", recording_make)
    setup = _collector_task(real_redis, cfg, redis_server.url)  # run key, lease helper and a published policy
    commander = SoloCommander(cfg, run_id="run-bad")
    commander.get_learner_task()
    for i in range(4):
        task = commander.get_collector_task()
        task.update(policy_id=setup["policy_id"], buffer_id=setup["buffer_id"], redis_url=redis_server.url,
                    eval_flag=i == 3)  # the last one plays an eval
        lease.grant(real_redis, cfg.exp_name, task["task_id"], 600)
        info = collector_mod.run_collector_task(task)
        commander.finish_collector_task(task["task_id"], info)
    assert len(starts) == 3 * cfg.env.collector_env_num + cfg.env.evaluator_env_num
    assert len(set(starts)) == len(starts), "two envs or tasks started from the same state"
    assert real_redis.get(keys.run(cfg.exp_name)) == b"run-bad"


def test_seeds_are_reproducible_and_independent():
    a = [task_seed(7, n) for n in range(1, 200)]
    assert a == [task_seed(7, n) for n in range(1, 200)]
    assert len(set(a)) == len(a) and not set(a) & {task_seed(8, n) for n in range(1, 200)}
    # Consecutive tasks share no env seed (the old seed + i scheme shared all but one).
    envs = [env_seeds(s, 8) for s in a]
    flat = [s for e in envs for s in e]
    assert len(set(flat)) == len(flat) and all(0 <= s < 2**32 for s in flat)  # env seeds are 32-bit
    assert envs[0] == env_seeds(a[0], 8)
