"""common/messages.py: wire forms round-trip, each bad field is named, old wire forms read, and
the tasks main's SoloCommander makes are read and written back exactly."""

from __future__ import annotations

import copy
import json

import pytest
from easydict import EasyDict

from common import keys, streams
from common.messages import (ChunkMeta, CollectorFinish, CollectorTask, EvalRecord, LearnerFinish, LearnerTask,
                             MessageError)
from coordinator.commander import SoloCommander
from coordinator.eval_log import eval_record
from workers.task import TaskError, validate_task


def _commander(small_cfg, **commander):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(commander)
    return SoloCommander(cfg, run_id="r1", run_name="run-a")


def _finish_eval(cm, task, reward):
    cm.finish_collector_task(task["task_id"], {"eval_flag": True, "policy_version": 1, "env_steps": 40,
                                               "real_episode_count": 2, "reward_mean": reward, "reward_std": 1.0})


def _commander_tasks(small_cfg):
    """Every shape of task the solo commander makes: a learner (fresh and resumed), a training
    collector task, an eval and a confirmation eval (with eval_policy_key and eval_episodes)."""
    cm = _commander(small_cfg, eval_every_train_iter=1, confirm_eval_episodes=3, eval_task_space=1)
    learner = cm.get_learner_task()
    collector = cm.get_collector_task()
    cm.update_learner_info(learner["task_id"], {"train_iter": 5, "consumed_env_steps": 100})
    evaluation = cm.get_collector_task()
    _finish_eval(cm, evaluation, reward=10_000.0)
    confirmation = cm.get_collector_task()
    cm.notify_fail_learner_task(learner)
    resumed = cm.get_learner_task()
    assert evaluation["eval_flag"] and "eval_policy_key" in confirmation and resumed["resume"]
    return [learner, resumed], [collector, evaluation, confirmation]


def test_the_commanders_tasks_round_trip_exactly(small_cfg):
    learners, collectors = _commander_tasks(small_cfg)
    for d in learners:
        task = LearnerTask.from_dict(d)
        assert task.to_dict() == d and task.ns == keys.namespace("test_exp", "run-a")
        assert task.ckpt_name == "latest" and "ckpt_name" not in task.to_dict()  # a worker of main reads it
    for d in collectors:
        assert CollectorTask.from_dict(d).to_dict() == d
        assert json.loads(json.dumps(d)) == d  # what RQ carries
    confirmation = CollectorTask.from_dict(collectors[2])
    assert confirmation.eval_episodes == 3 and confirmation.eval_policy_key.endswith(":evaluated")


def test_a_learner_groups_ranks_round_trip(small_cfg):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.learn.learner_num = 2
    cm = SoloCommander(cfg, run_id="r1")
    for d in (cm.get_learner_task(), cm.get_learner_task()):
        task = LearnerTask.from_dict(d)
        assert task.to_dict() == d and task.world_size == 2 and task.rank in (0, 1)


def test_ckpt_name_is_read_and_checked(small_cfg):
    d = _commander(small_cfg).get_learner_task()
    assert LearnerTask.from_dict(dict(d, ckpt_name="main_0")).to_dict()["ckpt_name"] == "main_0"
    with pytest.raises(MessageError, match="field 'ckpt_name' = 'a:b' is empty or contains ':'") as err:
        LearnerTask.from_dict(dict(d, ckpt_name="a:b"))
    assert err.value.field == "ckpt_name"


@pytest.fixture
def collector_task(small_cfg):
    cm = _commander(small_cfg)
    cm.get_learner_task()
    return cm.get_collector_task()


@pytest.mark.parametrize("name", ["task_id", "exp_name", "run_id", "buffer_id", "policy_id", "eval_flag",
                                  "collect_setting", "config"])
def test_a_missing_collector_task_field_is_named(collector_task, name):
    d = {k: v for k, v in collector_task.items() if k != name}
    with pytest.raises(MessageError, match=rf"missing keys \['{name}'\]"):
        CollectorTask.from_dict(d)


@pytest.mark.parametrize("name,value", [
    ("task_id", 7), ("exp_name", None), ("run_id", "a b"), ("buffer_id", "x" * 201), ("policy_id", ["p"]),
    ("eval_flag", 1), ("collect_setting", [0.1]), ("collect_setting", {"eps": "0.1"}), ("config", "cfg"),
    ("run_name", "a/b"), ("envstep", -1), ("envstep", 1.5), ("seed", True), ("redis_url", 6379),
    ("eval_episodes", 0), ("eval_policy_key", "rqrl:other:task:t:evaluated"),
])
def test_an_ill_typed_collector_task_field_is_named(collector_task, name, value):
    with pytest.raises(MessageError) as err:
        CollectorTask.from_dict(dict(collector_task, **{name: value}))
    assert err.value.field == name
    assert f"field {name!r}" in str(err.value) or f"field '{name}." in str(err.value)
    tid = collector_task["task_id"] if name != "task_id" else repr(value)
    assert str(err.value).startswith(f"task {tid}: ")


def test_collector_task_refusals_of_the_whole_task(collector_task):
    with pytest.raises(MessageError, match="collector task must be a dict, got str"):
        CollectorTask.from_dict("a task")
    with pytest.raises(MessageError, match=r"unknown fields \['surprise'\] for a collector task"):
        CollectorTask.from_dict(dict(collector_task, surprise=1))
    with pytest.raises(MessageError, match="task_type 'learner' is not 'collector'"):
        CollectorTask.from_dict(dict(collector_task, task_type="learner"))
    with pytest.raises(MessageError, match="'eval_policy_key'.* is only for eval tasks"):
        key = keys.evaluated_policy(keys.namespace("test_exp", "run-a"), "collector_task_x")
        CollectorTask.from_dict(dict(collector_task, eval_policy_key=key))


@pytest.mark.parametrize("name", ["task_id", "exp_name", "run_id", "buffer_id", "policy_id", "config"])
def test_a_missing_learner_task_field_is_named(small_cfg, name):
    d = _commander(small_cfg).get_learner_task()
    with pytest.raises(MessageError, match=rf"^task .*: missing keys \['{name}'\]"):
        LearnerTask.from_dict({k: v for k, v in d.items() if k != name})


@pytest.mark.parametrize("name,value,says", [
    ("seed", -2, r"'seed' = -2 must be an integer in \[0, 2\*\*63\)"),
    ("resume", "no", "is str, must be true or false"),
    ("world_size", 0, r"must be an integer in \[1, 1024\]"),
    ("rank", 1, r"'world_size' = None must be an integer in \[1, 1024\]"),  # a group needs all three
    ("group_id", "g", r"'world_size' = None must be an integer in \[1, 1024\]"),
])
def test_an_ill_typed_learner_task_field_is_named(small_cfg, name, value, says):
    d = _commander(small_cfg).get_learner_task()
    with pytest.raises(MessageError, match=says):
        LearnerTask.from_dict(dict(d, **{name: value}))


def test_a_task_without_task_type_reads_and_is_written_with_it(collector_task):
    d = {k: v for k, v in collector_task.items() if k != "task_type"}
    assert CollectorTask.from_dict(d).to_dict() == collector_task


def test_task_error_is_a_message_error_naming_the_field(collector_task):
    with pytest.raises(TaskError) as err:
        validate_task(dict(collector_task, seed=-1), "collector")
    assert isinstance(err.value, MessageError) and err.value.field == "seed"
    ctx = validate_task(collector_task, "collector")
    assert ctx.ns == "test_exp/run-a" and ctx.task.task_id == collector_task["task_id"] and ctx.conn is None
    assert ctx.algorithm.name == "dqn" and ctx.cfg.exp_name == "test_exp"


def _collector_info(**extra):
    info = {"real_episode_count": 2, "env_steps": 256, "avg_time_per_step": 0.001, "policy_version": 3,
            "eval_flag": False, "duration": 0.3, "reward_mean": 20.0, "reward_std": 2.0,
            "avg_step_per_episode": 21.0, "avg_time_per_episode": 0.02, "min_step_per_episode": 19,
            "max_step_per_episode": 23, "policy_envstep": 200, "cpu_s": 0.25, "env_built": True,
            "setup_s": 0.01, "episodes_cut": 0, "limiter_wait_s": 0.0, "policy_errors": 0}
    return {**info, **extra}


def test_finish_infos_round_trip_through_the_events_stream():
    ev = {"type": "finished", "task_id": "collector_task_1", "task_type": "collector", "ts": 12.5,
          "buffer_id": "buffer_1", "worker": "w1", **_collector_info()}
    wire = streams.decode_fields({k.encode(): v.encode() for k, v in streams.encode_fields(ev).items()})
    fin = CollectorFinish.from_dict(wire)
    assert fin.to_dict() == ev and fin.env_steps == 256 and fin.extra["cpu_s"] == 0.25
    learner = {"type": "finished", "task_id": "learner_task_1", "task_type": "learner", "buffer_id": "buffer_1",
               "train_iter": 70, "consumed_env_steps": 700, "learner_done": True, "chunks": 9, "wait_share": 0.1}
    assert LearnerFinish.from_dict(learner).to_dict() == learner


def test_an_eval_that_finished_no_episode_has_no_reward():
    info = {k: v for k, v in _collector_info(eval_flag=True, real_episode_count=0, confirmation=False).items()
            if k not in ("reward_mean", "reward_std", "avg_step_per_episode", "avg_time_per_episode")}
    fin = CollectorFinish.from_dict(info)
    assert fin.reward_mean is None and "reward_mean" not in fin.to_dict() and fin.to_dict() == info


def test_old_finish_info_names_read():
    old = {k: v for k, v in _collector_info().items() if k != "env_steps"}
    fin = CollectorFinish.from_dict(dict(old, step_count=128))
    assert fin.env_steps == 128 and fin.to_dict() == dict(old, env_steps=128)
    seed = LearnerFinish.from_dict({"buffer_id": "b", "train_iter": 4, "collector_envstep": 40})
    assert seed.consumed_env_steps == 40 and seed.to_dict() == {"buffer_id": "b", "train_iter": 4,
                                                                "consumed_env_steps": 40}


@pytest.mark.parametrize("name,value,says", [
    ("policy_version", None, "'policy_version' = None is missing"),
    ("env_steps", None, "'env_steps' = None is missing"),
    ("eval_flag", None, "'eval_flag' = None is missing"),
    ("eval_flag", "true", "'eval_flag' = 'true' is str, must be true or false"),
    ("env_steps", -3, r"'env_steps' = -3 must be an integer in \[0"),
    ("reward_mean", "high", "'reward_mean' = 'high' must be a number"),
    ("confirmation", 1, "'confirmation' = 1 is int, must be true or false"),
])
def test_a_bad_collector_finish_field_is_named(name, value, says):
    info = _collector_info(task_id="collector_task_1", **({} if value is None else {name: value}))
    if value is None:
        del info[name]
    with pytest.raises(MessageError, match=f"finish info of collector task collector_task_1: field {says}") as err:
        CollectorFinish.from_dict(info)
    assert err.value.field == name


def test_a_bad_learner_finish_field_is_named():
    with pytest.raises(MessageError, match="'buffer_id' = None must be a string"):
        LearnerFinish.from_dict({"task_id": "l1", "train_iter": 3})
    with pytest.raises(MessageError, match="'train_iter' = 'x' must be an integer"):
        LearnerFinish.from_dict({"buffer_id": "b", "train_iter": "x"})
    with pytest.raises(MessageError, match="'consumed_env_steps' = 1.5 must be an integer"):
        LearnerFinish.from_dict({"buffer_id": "b", "consumed_env_steps": 1.5})


def test_chunk_metadata_round_trips_and_names_a_bad_field():
    meta = {"data_id": "t_1a2b", "task_id": "t", "policy_version": 4, "n_samples": 32, "env_steps": 32,
            "nbytes": 900, "envstep": 320, "ts": 5.25}
    assert ChunkMeta.from_dict(meta).to_dict() == meta
    minimal = {"data_id": "d", "policy_version": 0, "n_samples": 1, "env_steps": 0}
    assert ChunkMeta.from_dict(minimal).to_dict() == minimal  # a collector that sent only what the reader needs
    for name in ("data_id", "n_samples", "env_steps", "policy_version"):
        with pytest.raises(MessageError, match=f"entry 1-0: field '{name}'"):
            ChunkMeta.from_dict({k: v for k, v in meta.items() if k != name}, where="entry 1-0")
    with pytest.raises(MessageError, match="field 'n_samples' = '32' must be an integer"):
        ChunkMeta.from_dict(dict(meta, n_samples="32"))


def test_eval_records_round_trip_as_the_coordinator_writes_them():
    ev = {"task_id": "collector_task_1", **_collector_info(eval_flag=True, confirmation=True)}
    rec = eval_record(ev, "r1", 1000, 12.0).to_dict()
    assert EvalRecord.from_dict(rec).to_dict() == rec and EvalRecord.from_dict(rec).reward_mean == 20.0
    none = eval_record(dict(ev, real_episode_count=0), "r1", 1000, 12.0).to_dict()
    assert "reward_mean" not in EvalRecord.from_dict(none).to_dict() == none
    with pytest.raises(MessageError, match="eval record of task collector_task_1: field 'envstep' = None is missing"):
        EvalRecord.from_dict({k: v for k, v in rec.items() if k != "envstep"})


def _running_coordinator(tmp_path, fake_redis, small_cfg):
    from coordinator.daemon import Coordinator

    c = Coordinator(EasyDict(copy.deepcopy(small_cfg)), fake_redis, tmp_path)
    learner = c.commander.get_learner_task()
    collector = c.commander.get_collector_task()
    for t in (learner, collector):
        c.tasks.running[t["task_id"]] = {"task": t, "kind": t["task_type"], "started": True}
    return c, learner, collector


def test_the_router_drops_a_malformed_finish_whole_and_reads_an_old_one(tmp_path, fake_redis, small_cfg):
    c, learner, collector = _running_coordinator(tmp_path, fake_redis, small_cfg)
    tid = collector["task_id"]
    ev = {"type": "finished", "task_id": tid, "task_type": "collector", **_collector_info()}
    with pytest.raises(MessageError, match=f"finish info of collector task {tid}: field 'eval_flag' = 'no'"):
        c.router.route(dict(ev, eval_flag="no"))
    # Nothing changed: the task still runs (the liveness pass frees its space once its heartbeat stops).
    assert tid in c.tasks.running and c.commander.summary()["collector_tasks_running"] == 1
    old = {k: v for k, v in ev.items() if k != "env_steps"}
    assert c.router.route(dict(old, step_count=300)) is False  # a collector before the glossary's names
    assert tid not in c.tasks.running and c.commander.total_envstep == 300
    with pytest.raises(MessageError, match="field 'buffer_id' = None must be a string"):
        c.router.route({"type": "finished", "task_id": learner["task_id"], "task_type": "learner", "train_iter": 3})
    assert learner["task_id"] in c.tasks.running
    c.router.route({"type": "finished", "task_id": learner["task_id"], "task_type": "learner",
                    "buffer_id": learner["buffer_id"], "train_iter": 3, "collector_envstep": 30})
    assert c.records.learner_last == {"train_iter": 3, "envstep": 30} and learner["task_id"] not in c.tasks.running
    c.tb.close()


def test_an_old_eval_record_reads_its_train_iter_as_the_policy_version():
    old = {"task_id": "t", "envstep": 10, "time": 1.0, "train_iter": 7, "reward_mean": 3.0, "reward_std": 0.0}
    rec = EvalRecord.from_dict(old)
    assert rec.policy_version == 7 and "train_iter" not in rec.to_dict() and rec.to_dict()["policy_version"] == 7


def test_a_collector_task_runs_on_the_namespace_and_algorithm_its_validation_worked_out(fake_redis, small_cfg,
                                                                                         monkeypatch):
    """run_collector_task hands its TaskContext down: nothing below the validation works out the
    run's namespace or the algorithm again (the collector's own look-ups would raise here)."""
    import workers.collector as wc
    import workers.task as wt
    from common import lease
    from tests.conftest import initial_weights
    from workers.publication import publish_policy

    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.policy.collect.collector.task_env_steps = 64
    cm = SoloCommander(cfg, run_id="r1", run_name="run-a")
    ns = keys.namespace(cfg.exp_name, "run-a")
    fake_redis.set(keys.run(ns), "r1")
    cm.get_learner_task()
    task = cm.get_collector_task()
    lease.grant(fake_redis, ns, task["task_id"], 600)
    publish_policy(fake_redis, ns, task["policy_id"], initial_weights(cfg), 1, 10**9)
    monkeypatch.setattr(wt, "task_connection", lambda _url: fake_redis)

    def again(*_a, **_k):
        raise AssertionError("worked out again below the task's validation")

    monkeypatch.setattr(wc, "algorithm_of", again)
    monkeypatch.setattr(wc, "task_namespace", again)
    info = wc.run_collector_task(task)
    assert info["env_steps"] >= 64 and info["policy_version"] == 1
    finished = [streams.decode_fields(f) for _, f in fake_redis.xrange(keys.events(ns))]
    assert [e["task_id"] for e in finished if e["type"] == "finished"] == [task["task_id"]]
