"""``rqrl status`` reads only Redis: queues, live workers, runs, throughput, last eval."""

from __future__ import annotations

import json
import time

from rq import Queue

from common import events, keys, streams
from coordinator.status import collect_status, render


RUN = "exp_a/20261130T021500Z-s1"  # a run's namespace, as the coordinator makes it


def _seed(conn, ns=RUN):
    conn.sadd(keys.runs(), ns)
    conn.hset(keys.commander(ns), mapping=streams.encode_fields({
        "envstep": 12000, "train_iter": 3400, "last_eval_reward_mean": 187.5, "stop_value": 195.0,
        "converged": False, "wall_seconds": 42.0}))
    conn.set(keys.coordinator_alive(ns), "coordinator-host-1", px=5000)
    conn.set(keys.heartbeat(ns, "collector_task_1"), "w", px=4000)
    # The coordinator's running tasks: collector_task_1 executes; collector_task_0 finished (its
    # heartbeat key lingers until the TTL runs out); collector_task_2 is queued, not started.
    conn.set(keys.heartbeat(ns, "collector_task_0"), "w", px=4000)
    conn.hset(keys.tasks(ns), mapping={
        "collector_task_1": json.dumps({"kind": "collector", "started": True}),
        "collector_task_2": json.dumps({"kind": "collector", "started": False})})
    conn.hset(keys.commander(ns), "state", json.dumps({"commander": {}, "t0": 1.0}))
    now = time.time()
    # Two learner reports 10 s apart: 5,000 env steps and 1,000 iterations in between.
    for ts, it, env in ((now - 10, 1000, 5000), (now, 2000, 10000)):
        conn.xadd(keys.events(ns), streams.encode_fields({
            "type": "learner_info", "task_id": "learner_task_1", "task_type": "learner", "ts": ts,
            "train_iter": it, "consumed_env_steps": env}), id=f"{int(ts * 1000)}-0")


def test_collect_status_reports_everything_from_redis(fake_redis):
    _seed(fake_redis)
    Queue(keys.COLLECTOR_QUEUE, connection=fake_redis).enqueue_call("builtins.len", args=([1],))
    st = collect_status(fake_redis)
    assert st["queues"]["collector"]["queued"] == 1 and st["queues"]["learner"]["queued"] == 0
    exp = st["runs"][RUN]
    assert exp["summary"]["train_iter"] == 3400 and exp["summary"]["last_eval_reward_mean"] == 187.5
    assert exp["coordinator"] == "coordinator-host-1" and exp["stopped"] == ""
    assert [t["task_id"] for t in exp["tasks_alive"]] == ["collector_task_1"]  # executing only
    assert exp["tasks_alive"][0]["heartbeat_ttl_s"] > 0 and "state" not in exp["summary"]
    assert abs(exp["throughput_1min"]["env_steps_per_s"] - 500.0) < 1
    assert abs(exp["throughput_1min"]["train_iter_per_s"] - 100.0) < 1
    # --json output is plain JSON: no value is itself a JSON document
    def no_nested_json(obj):
        if isinstance(obj, dict):
            return all(no_nested_json(v) for v in obj.values())
        if isinstance(obj, list):
            return all(no_nested_json(v) for v in obj)
        return not (isinstance(obj, str) and obj[:1] in ("{", "["))
    assert no_nested_json(json.loads(json.dumps(st)))


def test_status_without_redis_fails_within_two_seconds(capsys):
    import socket

    from coordinator.status import run_status

    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    assert run_status(f"redis://127.0.0.1:{port}/0", None) == 1
    assert time.monotonic() - t0 < 2.0
    assert "cannot reach Redis" in capsys.readouterr().err


def test_render_fits_80_columns_and_shows_the_figures(fake_redis):
    _seed(fake_redis)
    fake_redis.set(keys.stop(RUN), "converged: eval reward_mean 201.00 >= stop_value 195.0")
    text = render(collect_status(fake_redis))
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert f"RUN {RUN}" in text and "stopped: converged" in text
    assert "187.5 / stop_value 195.0" in text and "12,000" in text
    assert "collector_task_1" in text


def test_render_shows_the_policy_lag_and_a_queueing_sources_lag_when_trained_on(fake_redis):
    _seed(fake_redis)
    fake_redis.xadd(keys.events(RUN), streams.encode_fields({
        "type": "learner_info", "task_id": "learner_task_1", "task_type": "learner", "ts": time.time(),
        "train_iter": 2001, "consumed_env_steps": 10005, "policy_lag_mean": 0.75, "policy_lag_p50": 0.0,
        "policy_lag_p95": 1.0, "policy_lag_max": 2.0, "stale_chunks": 123456, "data_lag_mean": 1.25}))
    text = render(collect_status(fake_redis))
    assert "policy lag (train iters) mean 0.75  p50 0  p95 1  max 2\n  stale chunks dropped 123456" in text
    assert "data lag when trained on (train iters) mean 1.25" in text
    assert all(len(line) <= 80 for line in text.splitlines()), text


def test_status_of_an_empty_redis(fake_redis):
    text = render(collect_status(fake_redis))
    assert "no runs in this Redis" in text


def test_events_emit_validates(fake_redis):
    import pytest

    with pytest.raises(ValueError, match="event type"):
        events.emit(fake_redis, "e", "bogus", "t", "collector")


def test_status_lists_runs_of_one_experiment_or_one_run(fake_redis):
    other_seed, other_exp = "exp_a/20261130T021500Z-s2", "exp_b/20261130T021500Z-s1"
    for ns in (RUN, other_seed, other_exp):
        _seed(fake_redis, ns)
    assert sorted(collect_status(fake_redis)["runs"]) == [RUN, other_seed, other_exp]
    assert sorted(collect_status(fake_redis, "exp_a")["runs"]) == [RUN, other_seed]
    assert list(collect_status(fake_redis, other_seed)["runs"]) == [other_seed]


def test_status_shows_the_time_left_of_the_budget_that_binds_first(fake_redis):
    """As the progress line of rqrl train: at 500 env steps/s, 18,000 env steps are left of
    max_env_step 30,000 (36 s), sooner than the wall-clock budget's 558 s."""
    _seed(fake_redis)
    fake_redis.hset(keys.commander(RUN), mapping=streams.encode_fields(
        {"max_env_step": 30000, "max_train_iter": 0, "max_wall_seconds": 600.0}))
    text = render(collect_status(fake_redis))
    assert "  last minute: 500 env steps/s, 100.0 train iter/s\n  ~36s left (max_env_step 30,000)" in text
    assert all(len(line) <= 80 for line in text.splitlines()), text
    fake_redis.hset(keys.commander(RUN), mapping=streams.encode_fields({"max_env_step": 0, "max_wall_seconds": 0.0}))
    assert "train iter/s\n  no budget: runs to stop_value" in render(collect_status(fake_redis))
