"""The coordinator's give-up rule counts failures in a row per task kind."""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import redis
from easydict import EasyDict

from coordinator.daemon import Coordinator


def _finish_info(task, reward=10.0):
    return {"type": "finished", "task_id": task["task_id"], "task_type": "collector", "eval_flag": task["eval_flag"],
            "buffer_id": task["buffer_id"], "policy_version": 0, "real_episode_count": 4, "env_steps": 100,
            "avg_step_per_episode": 25.0, "avg_time_per_step": 0.01, "avg_time_per_episode": 0.2,
            "reward_mean": reward, "reward_std": 1.0}


def test_a_learner_failing_every_time_is_not_hidden_by_finishing_collectors(tmp_path, fake_redis, small_cfg):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(max_task_failures=3, eval_every_train_iter=0, eval_interval=0.0)
    c = Coordinator(cfg, fake_redis, tmp_path)
    cm = c.commander
    for i in range(3):
        learner = cm.get_learner_task()
        c.tasks.running[learner["task_id"]] = {"task": learner, "kind": "learner", "started": True}
        collector = cm.get_collector_task()
        c.tasks.running[collector["task_id"]] = {"task": collector, "kind": "collector", "started": True}
        c.router.route({"type": "failed", "task_id": learner["task_id"], "task_type": "learner", "error": "boom"})
        c.router.route(_finish_info(collector))
    assert c.tasks.failures_in_a_row == {"collector": 0, "learner": 3}
    # A learner that reports progress is not failing in a row any more.
    learner = cm.get_learner_task()
    c.tasks.running[learner["task_id"]] = {"task": learner, "kind": "learner", "started": True}
    c.router.route({"type": "learner_info", "task_id": learner["task_id"], "task_type": "learner", "train_iter": 5,
              "consumed_env_steps": 100})
    assert c.tasks.failures_in_a_row["learner"] == 0
    c.tb.close()


def test_the_wrap_ups_writes_refused_by_a_full_redis_are_logged_whatever_form_the_refusal_takes(
        tmp_path, fake_redis, small_cfg):
    """The wrap-up is best effort on a full Redis: an OOM reply to a single write and a MULTI/EXEC
    aborted because Redis was full by its EXEC are logged; any other error is raised."""
    c = Coordinator(EasyDict(copy.deepcopy(small_cfg)), fake_redis, tmp_path)
    logged = []
    c.wrapup.log = mock.Mock(error=lambda fmt, *args: logged.append(fmt % args))

    def refuse(error):
        def write():
            raise error
        return write

    oom = "OOM command not allowed when used memory > 'maxmemory'."
    assert not c.wrapup._best_effort("write a", refuse(redis.OutOfMemoryError(oom)))
    assert not c.wrapup._best_effort("write b", refuse(redis.exceptions.ExecAbortError(
        f"Transaction discarded because of: {oom}")))
    assert [line.split(":")[0] for line in logged] == ["could not write a", "could not write b"]
    with pytest.raises(redis.exceptions.ExecAbortError):
        c.wrapup._best_effort("write c", refuse(redis.exceptions.ExecAbortError(
            "Transaction discarded because of: unknown command 'X'")))
    c.tb.close()
