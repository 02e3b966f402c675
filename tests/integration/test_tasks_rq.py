"""Collector and learner tasks through real ``rq worker --burst`` subprocesses on a private Redis."""

from __future__ import annotations

import subprocess

import pytest
from rq import Queue
from rq.job import Job
from rq.registry import FailedJobRegistry

from common import keys, streams
from common.config import apply_overrides
from coordinator.commander import SoloCommander
from tests.conftest import WORKER_CLASS, rq_bin, wait_event, worker_env
from common import lease
from tests.conftest import initial_weights
from common.rq_json import TaskSerializer

pytestmark = pytest.mark.redis_server


def _worker(url: str, queue: str, cwd, burst: bool = True) -> subprocess.Popen:
    argv = [rq_bin(), "worker", queue, "--url", url, "-w", WORKER_CLASS[queue]]
    if burst:
        argv.append("--burst")
    return subprocess.Popen(argv, env=worker_env(url), cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def setup(real_redis, redis_server, small_cfg, tmp_path):
    # A small lead makes collectors wait for the learner, so the policy version must advance mid-task.
    cfg = apply_overrides(small_cfg, ["policy.learn.max_env_step_lead=64", "policy.learn.learner.send_policy_freq=1"])
    commander = SoloCommander(cfg, run_id="run-1")
    real_redis.set(keys.run(cfg.exp_name), "run-1")
    return real_redis, redis_server.url, cfg, commander, tmp_path


def test_collector_and_learner_through_rq_workers(setup):
    conn, url, cfg, commander, cwd = setup
    exp = cfg.exp_name
    learner_task = commander.get_learner_task()
    collector_task = commander.get_collector_task()
    for t in (learner_task, collector_task):
        lease.grant(conn, exp, t["task_id"], 600)
    assert not collector_task["eval_flag"]
    Queue(keys.LEARNER_QUEUE, connection=conn, serializer=TaskSerializer).enqueue_call(
        "workers.learner.run_learner_task", args=(learner_task,), job_id=learner_task["task_id"], timeout=300)
    Queue(keys.COLLECTOR_QUEUE, connection=conn, serializer=TaskSerializer).enqueue_call(
        "workers.collector.run_collector_task", args=(collector_task,), job_id=collector_task["task_id"], timeout=300)
    learner = _worker(url, keys.LEARNER_QUEUE, cwd)
    collector = _worker(url, keys.COLLECTOR_QUEUE, cwd)
    try:
        out, _ = collector.communicate(timeout=180)
        assert collector.returncode == 0, out
        finished = wait_event(conn, exp, lambda e: e["type"] == "finished" and e["task_type"] == "collector", 10)
        assert finished["task_id"] == collector_task["task_id"]
        assert finished["env_steps"] >= cfg.policy.collect.collector.task_env_steps

        meta = [streams.decode_fields(f) for _, f in conn.xrange(keys.buffer_meta(exp, collector_task["buffer_id"]))]
        assert meta, "no metadata on the buffer stream"
        sent = sum(m["n_samples"] for m in meta)
        assert sum(m["env_steps"] for m in meta) == finished["env_steps"]
        # The collector acted with weights the learner kept publishing while it ran.
        iters = [m["policy_version"] for m in meta]
        assert min(iters) >= 0 and max(iters) > min(iters), iters

        # Wait until the learner has consumed every chunk, then stop it.
        wait_event(conn, exp, lambda e: e["type"] == "learner_info" and e["chunks"] == len(meta), 60)
        conn.set(keys.stop(exp), "test done")
        out, _ = learner.communicate(timeout=60)
        assert learner.returncode == 0, out
    finally:
        for p in (learner, collector):
            if p.poll() is None:
                p.kill()
    done = wait_event(conn, exp, lambda e: e["type"] == "finished" and e["task_type"] == "learner", 10)
    # Every transition arrived exactly once: inserted == sent, chunks == entries, nothing pending.
    assert done["pushed"] == sent
    assert done["chunks"] == len(meta)
    assert done["expired"] == done["corrupt"] == done["malformed"] == 0
    pending = conn.xpending(keys.buffer_meta(exp, collector_task["buffer_id"]), keys.LEARNER_GROUP)
    assert pending["pending"] == 0
    assert done["train_iter"] > 0
    assert conn.hget(keys.ckpt(exp, "final"), "version") is not None
    left = [conn.get(k) for k in conn.scan_iter(match=f"{keys.exp_prefix(exp)}:data:*")]
    assert left and set(left) == {b""}, "consumed blobs should be emptied (tombstones until their TTL)"


def test_eval_task_counts_episodes_once_and_sends_no_data(setup):
    conn, url, cfg, commander, cwd = setup
    exp = cfg.exp_name
    commander.get_learner_task()
    commander.update_learner_info("learner_x", {"train_iter": 500, "consumed_env_steps": 1000})
    task = commander.get_collector_task()
    assert task["eval_flag"]
    lease.grant(conn, exp, task["task_id"], 600)
    # A published policy is all an eval task needs (no learner running).
    from workers.publication import publish_policy

    publish_policy(conn, exp, task["policy_id"], initial_weights(cfg), 500, 10**9)
    Queue(keys.COLLECTOR_QUEUE, connection=conn, serializer=TaskSerializer).enqueue_call(
        "workers.collector.run_collector_task", args=(task,), job_id=task["task_id"], timeout=120)
    w = _worker(url, keys.COLLECTOR_QUEUE, cwd)
    out, _ = w.communicate(timeout=120)
    assert w.returncode == 0, out
    ev = wait_event(conn, exp, lambda e: e["type"] == "finished", 10)
    assert ev["eval_flag"] is True
    assert ev["real_episode_count"] == cfg.env.n_evaluator_episode
    assert ev["policy_version"] == 500
    assert conn.xlen(keys.buffer_meta(exp, task["buffer_id"])) == 0


def test_malformed_task_fails_with_clear_error(setup):
    conn, url, cfg, _, cwd = setup
    bad = {"task_id": "collector_task_bad", "exp_name": cfg.exp_name}
    q = Queue(keys.COLLECTOR_QUEUE, connection=conn, serializer=TaskSerializer)
    q.enqueue_call("workers.collector.run_collector_task", args=(bad,), job_id="collector_task_bad", timeout=60)
    w = _worker(url, keys.COLLECTOR_QUEUE, cwd)
    w.communicate(timeout=120)
    assert "collector_task_bad" in FailedJobRegistry(queue=q).get_job_ids()
    job = Job.fetch("collector_task_bad", connection=conn)
    err = job.latest_result().exc_string
    assert "TaskError" in err and "collector_task_bad" in err and "missing keys" in err
