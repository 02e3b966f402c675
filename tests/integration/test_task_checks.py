"""Hand-enqueued or duplicated tasks: every field is checked before anything runs, stale and
unknown tasks fail with that reason, and a copy of a live task's id never touches the live task."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from common import keys, streams
from tests.integration.test_bad_input import _collector_task
from workers.callbacks import report_job_failure
from workers.collector import run_collector_task
from workers.learner import run_learner_task
from workers.task import DuplicateTask, Heartbeat, StaleTask, TaskError, validate_task

pytestmark = pytest.mark.redis_server


def _events(conn, exp):
    return [streams.decode_fields(f) for _, f in conn.xrange(keys.events(exp))]


@pytest.mark.parametrize("field,value,says", [
    ("task_id", 123, "field 'task_id' = 123 is int, must be a string"),
    ("task_id", "a:b", "field 'task_id'"),
    ("exp_name", ["x"], "field 'exp_name'"),
    ("run_id", None, "field 'run_id'"),
    ("run_name", "a/b", "field 'run_name'"),
    ("run_name", 7, "field 'run_name'"),
    ("eval_flag", "yes", "field 'eval_flag' = 'yes' is str, must be true or false"),
    ("collect_setting", "abc", "field 'collect_setting' is str"),
    ("collect_setting", {"eps": "0.1"}, "field 'collect_setting.eps'"),
    ("collect_setting", {"eps": float("nan")}, "field 'collect_setting.eps'"),
    ("collect_setting", {"eps": 7.0}, "'collect_setting.eps' = 7.0 must be in [0, 1]"),
    ("seed", -1, "field 'seed'"),
    ("seed", True, "field 'seed'"),
    ("envstep", "12", "field 'envstep'"),
    ("config", "cfg", "field 'config'"),
    ("surprise", 1, "unknown fields ['surprise']"),
    ("exp_name", "other_exp", "differs from config.exp_name"),
])
def test_every_field_is_checked_and_named(real_redis, redis_server, small_cfg, field, value, says):
    task = dict(_collector_task(real_redis, small_cfg, redis_server.url), **{field: value})
    with pytest.raises(TaskError) as err:
        validate_task(task, "collector")
    assert says in str(err.value)
    with pytest.raises(TaskError):
        run_collector_task(task)
    assert not [e for e in _events(real_redis, small_cfg.exp_name) if e["type"] in ("started", "failed")]


def test_unknown_experiment_and_stale_run_fail_with_their_reason(real_redis, redis_server, small_cfg):
    task = _collector_task(real_redis, small_cfg, redis_server.url)
    stale = dict(task, run_id="run-old")
    with pytest.raises(StaleTask, match="belongs to run 'run-old'.*current run is 'run-bad'"):
        run_collector_task(stale)
    real_redis.delete(keys.run(small_cfg.exp_name))
    with pytest.raises(StaleTask, match="unknown run 'test_exp'"):
        run_collector_task(task)
    learner = dict(task, task_type="learner", resume=False)
    for k in ("eval_flag", "collect_setting", "envstep"):
        learner.pop(k)
    with pytest.raises(StaleTask, match="unknown run"):
        run_learner_task(learner)


def test_a_duplicate_of_a_live_task_never_touches_it(real_redis, redis_server, small_cfg):
    conn, exp = real_redis, small_cfg.exp_name
    live = _collector_task(conn, small_cfg, redis_server.url)
    tid = live["task_id"]
    with Heartbeat(conn, exp, tid, 30.0, worker="live-runner"):
        owner = conn.get(keys.heartbeat(exp, tid))
        # A copy with a bad field, and a valid copy: both refused, neither reports under tid.
        with pytest.raises(TaskError):
            run_collector_task(dict(live, collect_setting="abc"))
        with pytest.raises(DuplicateTask, match=f"task {tid} already runs elsewhere"):
            run_collector_task(dict(live))
        # RQ's on_failure for such copies (another job id, or a refused task) says nothing either.
        for job_id, exc in ((f"copy-of-{tid}", RuntimeError), (tid, DuplicateTask)):
            report_job_failure(SimpleNamespace(id=job_id, args=(dict(live),)), conn, exc, exc("x"), None)
        assert conn.get(keys.heartbeat(exp, tid)) == owner
        assert conn.exists(keys.lease(exp, tid))
        assert not [e for e in _events(conn, exp) if e["task_id"] == tid]
        # The coordinator's own job failing does report.
        report_job_failure(SimpleNamespace(id=tid, args=(dict(live),)), conn, RuntimeError, RuntimeError("boom"), None)
        assert [e["error"] for e in _events(conn, exp) if e["type"] == "failed"] == ["RuntimeError: boom"]
