"""A learner task's learner, assembled in one place (workers/learner.py ``assemble`` / ``task_hooks``):
its hooks run in the documented order, config is only read, and its own resumable checkpoint
is the task's ``ckpt_name``."""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import replace
from types import SimpleNamespace

import pytest
from easydict import EasyDict

from common import blobstore, keys, lease
from coordinator.commander import SoloCommander
from tests.unit.test_prioritized_replay import CARTPOLE, dqn_batch
from workers.learner import BaseLearner, LearnerRole, assemble, task_hooks
from workers.learner_hooks import LearnerHook, PhaseHook
from workers.task import TaskError, task_namespace, validate_task

LOG = logging.getLogger("test_learner_assembly")

# docs/architecture.md's learner paragraph and task_hooks' docstring: the order the hooks run in.
DOCUMENTED_ORDER = [
    "load_ckpt_before_run", "broadcast_state_before_run", "publish_policy_before_run", "phase_first_policy_before_run",
    "phase_first_train_step_after_iter", "source_feedback_after_iter", "save_ckpt_after_iter",
    "publish_policy_after_iter", "log_show_after_iter", "send_info_after_iter",
    "save_ckpt_after_run", "send_info_after_run",
]


def _hook_names(lcfg, role, group=None, publish_every_iter=False):
    source = SimpleNamespace(publish_every_iter=publish_every_iter, envstep_limit=lambda it: 0, feedback=lambda p: None)
    first_step = PhaseHook(None, "ns", "first_train_step", "after_iter")
    hooks = task_hooks(lcfg, role, None, "ns", "t1", SimpleNamespace(), source, group, first_step, dict)
    return [h.name for h in hooks], hooks


def test_a_lead_learners_hooks_run_in_the_documented_order(small_cfg):
    lcfg = copy.deepcopy(small_cfg.policy.learn.learner)
    lcfg.hook.update(save_ckpt_after_iter=7, save_ckpt_after_run=True, log_show_after_iter=5)
    names, hooks = _hook_names(lcfg, LearnerRole(lead=True, resume_from="latest"), group=SimpleNamespace())
    assert names == DOCUMENTED_ORDER
    freq = {h.name: h.freq for h in hooks}
    assert (freq["save_ckpt_after_iter"], freq["log_show_after_iter"]) == (7, 5)
    assert (freq["publish_policy_after_iter"], freq["send_info_after_iter"]) == (lcfg.send_policy_freq, lcfg.send_info_freq)


def test_another_rank_loads_trains_and_logs_but_neither_publishes_checkpoints_nor_reports(small_cfg):
    lcfg = copy.deepcopy(small_cfg.policy.learn.learner)
    names, _ = _hook_names(lcfg, LearnerRole(lead=False, resume_from="latest"), group=SimpleNamespace())
    assert names == ["load_ckpt_before_run", "broadcast_state_before_run", "phase_first_train_step_after_iter",
                     "source_feedback_after_iter", "log_show_after_iter"]


def test_an_on_policy_learner_publishes_and_reports_every_iteration(small_cfg):
    lcfg = copy.deepcopy(small_cfg.policy.learn.learner)
    names, hooks = _hook_names(lcfg, LearnerRole(lead=True), publish_every_iter=True)
    assert "load_ckpt_before_run" not in names and "broadcast_state_before_run" not in names
    assert {h.name: h.freq for h in hooks if h.name in ("publish_policy_after_iter", "send_info_after_iter")} == \
        {"publish_policy_after_iter": 1, "send_info_after_iter": 1}


def test_hooks_at_one_position_run_in_the_order_they_were_registered(small_cfg, tmp_path):
    """No priority reorders them: the list task_hooks builds is the order they run."""
    ran: list[str] = []

    class Note(LearnerHook):
        def __call__(self, learner):
            ran.append(self.name)

    lcfg = copy.deepcopy(small_cfg.policy.learn.learner)
    hooks = [Note(n, p) for n, p in (("b", "after_iter"), ("z", "before_run"), ("a", "after_iter"), ("y", "before_run"))]
    learner = BaseLearner(lcfg, exp_name="assembly_test", log_dir=str(tmp_path / "log"), hooks=hooks)
    try:
        learner.call_hook("before_run")
        learner.call_hook("after_iter")
    finally:
        learner.close()
    assert ran == ["z", "y", "b", "a"]


def _task(small_cfg, **fields):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.learn.learner.hook.update(save_ckpt_after_iter=1, log_show_after_iter=0)
    task = SoloCommander(cfg, run_id="r1").get_learner_task()
    task.update(fields)
    return task, validate_task(task, "learner").cfg


def _learner(conn, task, cfg):
    ctx = replace(validate_task(task, "learner"), conn=conn, cfg=cfg)
    lease.grant(conn, ctx.ns, ctx.task_id, 60)
    role = LearnerRole.of(ctx.task, cfg.policy.learn.learner.hook)
    return role, assemble(ctx, CARTPOLE, role, LOG).learner


def _feed(learner, batches, then=None):
    """``get_data`` handing out ``batches`` DQN batches, then None (or raising ``then``)."""
    it = iter([dqn_batch(n=16, seed=i) for i in range(batches)])

    def get_data():
        batch = next(it, None)
        if batch is None and then is not None:
            raise then
        return batch
    return get_data


def _versions(conn, ns):
    """Checkpoint name -> train_iter of each learner checkpoint in Redis."""
    prefix = keys.ckpt(ns, "x")[:-1]
    return {k.decode()[len(prefix):]: int(blobstore.get_versioned(conn, k.decode())[0]["version"])
            for k in conn.scan_iter(prefix + "*")}


def test_a_learner_task_checkpoints_under_its_ckpt_name_and_resumes_from_it(fake_redis, small_cfg):
    task, cfg = _task(small_cfg, ckpt_name="p1_latest")
    cfg_before = json.dumps(cfg, sort_keys=True)
    ns = task_namespace(task)
    role, learner = _learner(fake_redis, task, cfg)
    assert role == LearnerRole(lead=True, ckpt_name="p1_latest", resume_from=None)
    learner.get_data = _feed(learner, 3)
    learner.start()
    learner.close()
    # Its final checkpoints are its player's too: a second player's learner never overwrites them.
    assert _versions(fake_redis, ns) == {"p1_latest": 3, "p1_latest_final": 3, "p1_latest_final_model": 3}
    # The replacement learner loads p1_latest before its first publication.
    again, cfg = _task(small_cfg, ckpt_name="p1_latest", resume=True, task_id=task["task_id"] + "_again",
                       policy_id=task["policy_id"], buffer_id=task["buffer_id"])
    role, learner = _learner(fake_redis, again, cfg)
    assert role.resume_from == "p1_latest"
    learner.get_data = _feed(learner, 0)
    learner.start()
    learner.close()
    assert learner.train_iter == 3
    assert int(blobstore.get_versioned(fake_redis, keys.policy(ns, task["policy_id"]))[0]["version"]) == 3
    assert json.dumps(cfg, sort_keys=True) == cfg_before, "assembling or running the learner wrote to its config"
    assert "latest" not in _versions(fake_redis, ns)


def test_a_failed_iteration_saves_the_tasks_ckpt_name(fake_redis, small_cfg):
    task, cfg = _task(small_cfg, ckpt_name="p1_latest")
    cfg.policy.learn.learner.hook.save_ckpt_after_iter = 0
    _, learner = _learner(fake_redis, task, cfg)
    learner.get_data = _feed(learner, 2, then=RuntimeError("the reader died"))
    with pytest.raises(RuntimeError, match="the reader died"):
        learner.start()
    learner.close()
    assert _versions(fake_redis, task_namespace(task)) == {"p1_latest": 2}


def test_a_task_without_ckpt_name_keeps_latest(fake_redis, small_cfg):
    """Tasks of an older coordinator carry no ckpt_name: the learner's checkpoint stays ``latest``."""
    task, cfg = _task(small_cfg)
    task.pop("ckpt_name", None)
    _, learner = _learner(fake_redis, task, cfg)
    learner.get_data = _feed(learner, 1)
    learner.start()
    learner.close()
    assert set(_versions(fake_redis, task_namespace(task))) == {"latest", "final", "final_model"}


@pytest.mark.parametrize("value,why", [("p:1", "is empty or contains ':'"), (7, "must be a string"),
                                       ("", "is empty or contains ':'")])
def test_a_bad_ckpt_name_is_refused_by_name(small_cfg, value, why):
    task, _ = _task(small_cfg)
    task["ckpt_name"] = value
    with pytest.raises(TaskError, match=f"field 'ckpt_name' = .* {why}"):
        validate_task(task, "learner")


def test_send_info_reports_every_time_but_writes_tensorboard_at_most_once_per_interval(fake_redis, monkeypatch):
    from workers import learner_hooks

    clock = [100.0]
    monkeypatch.setattr(learner_hooks.time, "monotonic", lambda: clock[0])
    written = []
    tb = SimpleNamespace(add_scalar=lambda tag, v, step: written.append((tag, step)))
    learner = SimpleNamespace(learn_info={"train_iter": 0}, tb_logger=tb, train_iter=0)
    hook = learner_hooks.SendInfoHook(fake_redis, "ns", "t1", 20, lambda: {"buffer_size": 5, "policy_lag_p50": 1.0},
                                      tb_every_s=1.0)
    for it, dt in ((20, 0.0), (40, 0.3), (60, 0.3), (80, 0.5), (100, 0.2)):  # 0, 0.3, 0.6, 1.1, 1.3 s
        clock[0] += dt
        learner.train_iter = it
        hook(learner)
    assert fake_redis.xlen(keys.events("ns")) == 5  # every report reaches the coordinator
    assert sorted({step for _, step in written}) == [20, 80]  # TensorBoard: the first, then 1.1 s later
    assert {tag for tag, _ in written} == {"learner_info/buffer_size", "learner_info/policy_lag_p50"}
    learner.train_iter = 120  # the run ends: the last report's figures (train iter 100) are written
    learner_hooks.SendInfoAfterRunHook(hook)(learner)
    assert sorted({step for _, step in written}) == [20, 80, 100]
    learner_hooks.SendInfoAfterRunHook(hook)(learner)  # nothing left: nothing twice
    assert len(written) == 6
