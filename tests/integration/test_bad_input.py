"""Bad input reaching workers: a clear error naming the env / task, and the rest keeps going."""

from __future__ import annotations

import pytest
from rq import Queue
from rq.job import Job

from common import keys, streams
from common.config import apply_overrides
from coordinator.commander import SoloCommander
from tests.integration.test_tasks_rq import _worker
from workers.collector import run_collector_task
from workers.envs import EnvError
from common import lease
from tests.conftest import initial_weights
from common.rq_json import TaskSerializer

pytestmark = pytest.mark.redis_server


def _collector_task(conn, cfg, url):
    commander = SoloCommander(cfg, run_id="run-bad")
    conn.set(keys.run(cfg.exp_name), "run-bad")
    commander.get_learner_task()
    task = commander.get_collector_task()
    lease.grant(conn, cfg.exp_name, task["task_id"], 600)
    # Published weights, so the task does not wait for a learner.
    from workers.publication import publish_policy

    publish_policy(conn, cfg.exp_name, task["policy_id"],
                   initial_weights(cfg), 0, 10**9)
    return dict(task, redis_url=url)


@pytest.mark.parametrize("env_id,expected", [
    ("tests.fixtures.bad_envs:NaNCartPole-v0", "non-finite value"),
    ("tests.fixtures.bad_envs:RaisingCartPole-v0", "simulator crashed"),
])
def test_misbehaving_env_fails_the_task_with_a_clear_event(real_redis, redis_server, small_cfg, env_id, expected):
    cfg = apply_overrides(small_cfg, [f"env.env_id={env_id}"])
    task = _collector_task(real_redis, cfg, redis_server.url)
    with pytest.raises(Exception) as err:
        run_collector_task(task)
    assert expected in str(err.value)
    assert isinstance(err.value, EnvError) and env_id in str(err.value)
    failed = [streams.decode_fields(f) for _, f in real_redis.xrange(keys.events(cfg.exp_name))]
    failed = [e for e in failed if e["type"] == "failed"]
    assert failed and failed[-1]["task_id"] == task["task_id"] and expected in failed[-1]["error"]


def test_hand_enqueued_bad_tasks_fail_and_the_worker_keeps_serving(real_redis, redis_server, small_cfg, tmp_path):
    conn, url = real_redis, redis_server.url
    q = Queue(keys.COLLECTOR_QUEUE, connection=conn, serializer=TaskSerializer)
    q.enqueue_call("workers.collector.run_collector_task", args=({"task_id": "t_missing", "exp_name": "x"},),
                   job_id="t_missing", timeout=60)
    q.enqueue_call("workers.collector.run_collector_task",
                   args=({"task_id": "t_type", "task_type": "learner", "exp_name": "x"},), job_id="t_type", timeout=60)
    q.enqueue_call("workers.collector.run_collector_task", args=("not a dict",), job_id="t_str", timeout=60)
    good = _collector_task(conn, small_cfg, url)
    q.enqueue_call("workers.collector.run_collector_task", args=(good,), job_id=good["task_id"], timeout=120)
    w = _worker(url, keys.COLLECTOR_QUEUE, tmp_path)
    out, _ = w.communicate(timeout=180)
    assert w.returncode == 0, out
    errors = {j: Job.fetch(j, connection=conn).latest_result().exc_string for j in ("t_missing", "t_type", "t_str")}
    assert "t_missing: missing keys" in errors["t_missing"]
    assert "task_type 'learner' sent to the collector job function" in errors["t_type"]
    assert "collector task must be a dict" in errors["t_str"]
    # The valid task queued after them still ran to completion.
    assert Job.fetch(good["task_id"], connection=conn).get_status() == "finished"


@pytest.mark.parametrize("eval_flag", [False, True])
def test_a_hung_env_step_fails_the_task_naming_the_env(real_redis, redis_server, small_cfg, eval_flag):
    """An env that hangs inside step: the task fails after policy.collect.collector.step_timeout_s
    with a ``failed`` event naming the env (the coordinator frees the slot, an eval included),
    and the worker's thread is freed rather than held until the job timeout."""
    import time

    from workers.step_watch import EnvStalled

    env_id = "tests.fixtures.bad_envs:HangingCartPole-v0"
    cfg = apply_overrides(small_cfg, [f"env.env_id={env_id}", "policy.collect.collector.step_timeout_s=1.0"])
    task = dict(_collector_task(real_redis, cfg, redis_server.url), eval_flag=eval_flag)
    t0 = time.monotonic()
    with pytest.raises(EnvStalled) as err:
        run_collector_task(task)
    assert time.monotonic() - t0 < 30  # not the hour the env would sleep
    assert env_id in str(err.value) and "step_timeout_s" in str(err.value)
    failed = [streams.decode_fields(f) for _, f in real_redis.xrange(keys.events(cfg.exp_name))]
    failed = [e for e in failed if e["type"] == "failed"]
    assert failed and f"env {env_id!r} made no step for 1 s" in failed[0]["error"]
    assert failed[0]["eval_flag"] is eval_flag
