"""policy.learn.learner_num > 1: config, commander, coordinator and task checks of learner groups."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
from easydict import EasyDict

from common import keys
from common.config import ConfigError, compile_config
from coordinator.commander import SoloCommander
from coordinator.daemon import Coordinator
from workers.sources import create_source
from workers.task import TaskError, validate_task
from tests.unit.test_learner_limiter import BATCH, SCHEMA, Call, rows


def _group_cfg(small_cfg, n=2):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.learn.learner_num = n
    return cfg


def test_learner_num_is_refused_for_on_policy_data_and_below_1():
    with pytest.raises(ConfigError, match=r"^config key 'policy.learn.learner_num' = 2: 'ppo' learns from on_policy"):
        compile_config({"policy": {"learn": {"learner_num": 2}}}, {"policy": {"type": "ppo"}})
    with pytest.raises(ConfigError, match="'policy.learn.learner_num' must be >= 1, got 0"):
        compile_config({"policy": {"learn": {"learner_num": 0}}}, {"policy": {"type": "dqn"}})
    assert compile_config({"policy": {"learn": {"learner_num": 2}}}, {"policy": {"type": "sac"}}).policy.learn.learner_num == 2


def test_one_learner_space_holds_a_group_of_ranks(small_cfg):
    cm = SoloCommander(_group_cfg(small_cfg, 3), run_id="r1")
    ranks = [cm.get_learner_task() for _ in range(3)]
    assert cm.get_learner_task() is None  # the one learner space is taken by the whole group
    assert [t["rank"] for t in ranks] == [0, 1, 2]
    assert {t["world_size"] for t in ranks} == {3} and len({t["group_id"] for t in ranks}) == 1
    assert len({t["task_id"] for t in ranks}) == 3 and len({t["seed"] for t in ranks}) == 3
    assert len({(t["policy_id"], t["buffer_id"], t["resume"]) for t in ranks}) == 1
    for t in ranks:  # every rank is a valid learner task
        validate_task(t, "learner")
    # Two ranks report failure (one died, the other lost its collective): the group fails once.
    cm.notify_fail_learner_task(ranks[1])
    cm.notify_fail_learner_task(ranks[0])
    again = [cm.get_learner_task() for _ in range(3)]
    assert cm.get_learner_task() is None, "a second failure report of one group freed a second space"
    assert again[0]["group_id"] != ranks[0]["group_id"] and all(t["resume"] for t in again)
    assert again[0]["policy_id"] == ranks[0]["policy_id"] and again[0]["buffer_id"] == ranks[0]["buffer_id"]


def test_a_single_learner_task_has_no_group_fields(small_cfg):
    task = SoloCommander(EasyDict(copy.deepcopy(small_cfg)), run_id="r1").get_learner_task()
    assert not {"group_id", "rank", "world_size"} & set(task)


def test_the_coordinator_drops_a_lost_ranks_siblings_and_counts_only_rank_0s_finish(tmp_path, fake_redis, small_cfg):
    c = Coordinator(_group_cfg(small_cfg), fake_redis, tmp_path)
    cm = c.commander
    ranks = [cm.get_learner_task() for _ in range(2)]
    for t in ranks:
        c.tasks.running[t["task_id"]] = {"task": t, "kind": "learner", "started": True}
    c.router.route({"type": "failed", "task_id": ranks[1]["task_id"], "task_type": "learner", "error": "killed"})
    assert c.tasks.running == {} and set(c.tasks.drop_leases) == {t["task_id"] for t in ranks}
    assert c.tasks.failures_in_a_row["learner"] == 1  # one loss, however many ranks it takes down
    # The replacement group; at the end rank 1's finish is bookkeeping, rank 0's ends the learner.
    new = [cm.get_learner_task() for _ in range(2)]
    for t in new:
        c.tasks.running[t["task_id"]] = {"task": t, "kind": "learner", "started": True}
    done = {"type": "finished", "task_type": "learner", "buffer_id": new[0]["buffer_id"], "train_iter": 7,
            "consumed_env_steps": 70, "learner_done": True}
    c.router.route(dict(done, task_id=new[1]["task_id"]))
    assert cm.summary()["learner_tasks_running"] == 1 and c.records.learner_last["train_iter"] == 0
    c.router.route(dict(done, task_id=new[0]["task_id"]))
    assert cm.summary()["learner_tasks_running"] == 0 and c.records.learner_last["train_iter"] == 7
    c.tb.close()


@pytest.mark.parametrize("field,value,why", [
    ("rank", 2, r"'rank' = 2 must be an integer in \[0, world_size=2\)"),
    ("world_size", 0, r"'world_size' = 0 must be an integer in \[1, 1024\]"),
    ("group_id", "a:b", r"'group_id' = 'a:b' is empty or contains ':'"),
    ("group_id", None, r"'group_id' = None must be a string"),
])
def test_bad_group_fields_are_refused_by_name(small_cfg, field, value, why):
    task = SoloCommander(_group_cfg(small_cfg), run_id="r1").get_learner_task()
    task[field] = value
    with pytest.raises(TaskError, match=why):
        validate_task(task, "learner")


def test_a_rank_keeps_its_share_of_the_buffer_and_starts_on_the_groups_env_steps(fake_redis, small_cfg):
    """A rank's replay buffer holds 1/N of replay_buffer_size; it starts once the whole group
    consumed replay_start_size env steps (the buffer's stats hash) and it holds a row, and the
    collectors may send replay_start_size + max_env_step_lead before the first update; the
    replay ratio counts from that start."""
    cfg = _group_cfg(small_cfg)
    cfg.policy.other.replay_buffer.update(replay_buffer_size=1001, replay_start_size=200)
    cfg.policy.learn.update(train_iter_per_env_step=0.5, max_env_step_lead=100)
    learner = SimpleNamespace(train_iter=0, consumed_env_steps=0)
    feeder = create_source("replay", fake_redis, cfg.exp_name, learner, cfg, SCHEMA, seed=0, group_size=2)
    assert feeder.store.capacity == 500
    stats = keys.buffer_stats(cfg.exp_name, "B")
    feeder.reader = SimpleNamespace(env_steps=0, env_steps_base=0, error=None,
                                    consumed_env_steps=lambda: int(fake_redis.hget(stats, "env_steps") or 0))
    assert feeder.envstep_limit(0) == 300  # the group's start size, not this rank's share
    feeder.store.extend(rows(64))
    feeder.reader.env_steps = 64
    fake_redis.hset(stats, "env_steps", 150)  # the other rank consumed 86 more: not yet 200
    feeder._refresh_shared()
    assert feeder.envstep() == 150 and not feeder._ready(feeder.envstep())
    fake_redis.hset(stats, "env_steps", 210)
    call = Call(feeder)
    assert call.returned(3.0) and call.error is None and len(call.result["obs"]) == BATCH
    assert learner.consumed_env_steps == 210  # the group's count, reported by rank 0
    # From the group's start on, the ratio: 1 + 0.5 x 10 iterations at 210 env steps, not 0.5 x 210.
    learner.train_iter = 5
    assert feeder.ratio_ok(210)
    learner.train_iter = 6
    assert not feeder.ratio_ok(210)
    assert feeder.envstep_limit(6) == 200 + 12 + 100


def test_two_ranks_dead_at_once_fail_their_group_once(tmp_path, fake_redis, small_cfg):
    c = Coordinator(_group_cfg(small_cfg), fake_redis, tmp_path)
    ranks = [c.commander.get_learner_task() for _ in range(2)]
    for t in ranks:  # started, and neither refreshes its heartbeat key
        c.tasks.running[t["task_id"]] = {"task": t, "kind": "learner", "started": True}
    c._check_liveness()
    assert c.tasks.running == {} and c.tasks.failures_in_a_row["learner"] == 1
    assert c.commander.summary()["learner_tasks_running"] == 0
    assert c.commander.get_learner_task()["group_id"] != ranks[0]["group_id"]
    c.tb.close()
