"""A corrupt or wrongly typed policy in Redis: the collector keeps acting with the weights it holds,
logs the key and the error, counts it, and takes the next good version."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from common import keys
from common.config import apply_overrides
from tests.conftest import initial_weights
from tests.integration.test_bad_input import _collector_task
from workers.collector import run_collector_task
from workers.publication import publish_policy

pytestmark = pytest.mark.redis_server


def _wait_envstep_over(conn, exp, limit, timeout=60.0):
    deadline = time.monotonic() + timeout
    while int(conn.get(keys.envstep(exp)) or 0) <= limit:
        assert time.monotonic() < deadline, f"collector never passed {limit} env steps"
        time.sleep(0.05)  # observing a counter from outside: nothing to block on


def _run(task, out):
    try:
        out["info"] = run_collector_task(task)
    except Exception as e:  # noqa: BLE001 - the test reports it
        out["error"] = e


def test_collector_survives_corrupt_and_wrongly_typed_policy(real_redis, redis_server, small_cfg, caplog):
    cfg = apply_overrides(small_cfg, ["policy.collect.collector.task_env_steps=1200"])
    conn, exp = real_redis, cfg.exp_name
    task = _collector_task(conn, cfg, redis_server.url)
    key = keys.policy(exp, task["policy_id"])
    weights = initial_weights(cfg)
    publish_policy(conn, exp, task["policy_id"], weights, 0, 64)  # the collector waits past 64 env steps
    out: dict = {}
    caplog.set_level(logging.WARNING, logger="workers.comm_collector")
    t = threading.Thread(target=_run, args=(task, out))
    t.start()
    _wait_envstep_over(conn, exp, 64)
    # Version 1 is garbage (as `HSET ... chunk:0 garbage`), announced like a real publication.
    conn.hset(key, mapping={"version": 1, "chunk:0": b"garbage", "envstep_limit": 160})
    conn.publish(keys.policy_updates(exp, task["policy_id"]), "1 160")
    _wait_envstep_over(conn, exp, 160)
    publish_policy(conn, exp, task["policy_id"], weights, 2, 256)  # a good version
    _wait_envstep_over(conn, exp, 256)
    conn.delete(key)
    conn.set(key, "not a hash")  # WRONGTYPE for every reader of the policy
    conn.publish(keys.policy_updates(exp, task["policy_id"]), "3 100000")
    t.join(timeout=120)
    assert "error" not in out, out.get("error")
    info = out["info"]
    assert info["policy_version"] == 2 and info["env_steps"] >= 1200
    assert info["policy_errors"] >= 2
    text = caplog.text
    assert f"skipping unreadable policy {key}" in text and "WRONGTYPE" in text
    assert "BlobError" in text or "DecodeError" in text


def test_eval_task_skips_a_corrupt_first_policy_and_takes_the_next(real_redis, redis_server, small_cfg):
    conn, exp = real_redis, small_cfg.exp_name
    task = dict(_collector_task(conn, small_cfg, redis_server.url), eval_flag=True)
    key = keys.policy(exp, task["policy_id"])
    conn.hset(key, mapping={"version": 5, "chunk:0": b"garbage"})
    weights = initial_weights(small_cfg)
    timer = threading.Timer(1.0, publish_policy, (conn, exp, task["policy_id"], weights, 6, 10**9))
    timer.start()
    info = run_collector_task(task)
    timer.join()
    assert info["eval_flag"] and info["policy_version"] == 6 and info["policy_errors"] == 1
