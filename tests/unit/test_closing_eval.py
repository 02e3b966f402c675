"""The closing eval: a run that stops on a budget ends with one eval of its newest policy version."""

from __future__ import annotations

import copy
import json
import signal
import threading

from easydict import EasyDict

from common import events, keys
from coordinator import lifeline
from coordinator.daemon import EXIT_INTERRUPTED, EXIT_LIMIT, Coordinator, wait_for_closing_eval
from coordinator.eval_judge import ClosingEval, closing_eval_seconds

BUDGET = 1000


def _eval_finish(task: dict, reward: float) -> dict:
    return {"eval_flag": True, "buffer_id": task["buffer_id"], "policy_version": 7, "real_episode_count": 4,
            "env_steps": 100, "avg_step_per_episode": 25.0, "avg_time_per_step": 0.01, "avg_time_per_episode": 0.2,
            "reward_mean": reward, "reward_std": 1.0, "policy_envstep": BUDGET + 50}


def _training_run(tmp_path, fake_redis, small_cfg, **commander) -> Coordinator:
    """A claimed run at its env-step budget: a learner at train iter 7 and training collectors,
    every task started and beating; evals by trigger are off; the stop waits for no learner."""
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(max_env_step=BUDGET, eval_every_train_iter=0, eval_interval=0.0, eval_every_env_step=0,
                         collector_task_space=2, finish_timeout=0, **commander)
    c = Coordinator(cfg, fake_redis, tmp_path, run_name="r1")
    c._claim()
    c._dispatch()
    for tid, entry in c.tasks.running.items():
        entry["started"] = True
        fake_redis.set(keys.heartbeat(c.exp, tid), "w:1")
    learner = next(t for t, e in c.tasks.running.items() if e["kind"] == "learner")
    events.emit(fake_redis, c.exp, "learner_info", learner, "learner", train_iter=7, consumed_env_steps=BUDGET + 50)
    c._process_events(block_ms=1)
    assert c.commander.total_envstep >= BUDGET
    return c


def _worker(c: Coordinator, on_eval) -> list[dict]:
    """Answer each eval task the coordinator dispatches with ``on_eval(task)`` (right after the
    dispatch, as a fast collector would); returns the eval tasks seen."""
    seen: list[dict] = []
    dispatch = c._dispatch

    def dispatch_and_answer() -> None:
        dispatch()
        for tid, entry in c.tasks.running.items():
            task = entry["task"]
            if task.get("eval_flag") and tid not in {t["task_id"] for t in seen}:
                seen.append(task)
                c.conn.set(keys.heartbeat(c.exp, tid), "w:1")
                on_eval(task)

    c._dispatch = dispatch_and_answer
    return seen


def test_a_budget_stop_waits_for_one_closing_eval_and_records_it_last(tmp_path, fake_redis, small_cfg, capsys):
    c = _training_run(tmp_path, fake_redis, small_cfg)
    stop_value = float(c.cfg.env.stop_value)
    seen = _worker(c, lambda task: events.emit(c.conn, c.exp, "finished", task["task_id"], "collector",
                                               **_eval_finish(task, stop_value + 1)))
    reason = f"max_env_step {BUDGET} reached without convergence"
    # Reaching stop_value at the closing eval keeps the exit a budget stop (eval_judge.EvalJudge.judge).
    assert c._close(EXIT_LIMIT, reason) == (EXIT_LIMIT, reason)
    assert len(seen) == 1 and "eval_policy_key" not in seen[0]
    (closing_id,) = [t["task_id"] for t in seen]
    records = [json.loads(ln) for ln in (c.out / "evals.jsonl").read_text().splitlines()]
    assert records[-1]["task_id"] == closing_id and records[-1]["envstep"] >= BUDGET
    assert json.loads(fake_redis.lindex(keys.evals(c.exp), -1))["task_id"] == closing_id
    # No training task was handed out while it ran.
    assert all(e["kind"] == "learner" or e["task"]["eval_flag"] or e["started"] for e in c.tasks.running.values())
    c._finish(EXIT_LIMIT, reason)
    summary = json.loads((c.out / "summary.json").read_text())
    assert summary["exit_code"] == EXIT_LIMIT and summary["final_eval_task"] == ""
    assert summary["final_eval"] == {"task_id": closing_id, "policy_version": 7, "envstep": records[-1]["envstep"],
                                     "reward_mean": stop_value + 1, "closing": True}
    assert summary["last_eval_reward_mean"] == stop_value + 1 and "status" in summary


def test_a_further_signal_skips_the_closing_eval(tmp_path, fake_redis, small_cfg):
    c = _training_run(tmp_path, fake_redis, small_cfg)
    c._on_signal(signal.SIGINT, None)  # the first Ctrl-C stopped the loop
    seen = _worker(c, lambda _task: c._on_signal(signal.SIGINT, None))  # the second comes while the eval runs
    reason = "interrupted by SIGINT"
    assert c._close(EXIT_INTERRUPTED, reason) == (EXIT_INTERRUPTED, reason)
    assert len(seen) == 1 and not (c.out / "evals.jsonl").exists()
    c._finish(EXIT_INTERRUPTED, reason)
    assert json.loads((c.out / "summary.json").read_text())["final_eval"] is None


def test_closing_eval_timeout_0_stops_at_once_as_before(tmp_path, fake_redis, small_cfg):
    c = _training_run(tmp_path, fake_redis, small_cfg, closing_eval_timeout=0)
    seen = _worker(c, lambda _task: None)
    assert c._close(EXIT_LIMIT, "budget") == (EXIT_LIMIT, "budget")
    assert seen == [] and c.commander._judge.closing is None


def test_a_coordinator_whose_rqrl_train_died_runs_no_closing_eval(tmp_path, fake_redis, small_cfg, monkeypatch):
    """The lifeline's SIGTERM (coordinator/lifeline.py): the workers are shutting down as well and
    the process group is killed GRACE_S later, which the stop sequence alone needs."""
    c = _training_run(tmp_path, fake_redis, small_cfg)
    seen = _worker(c, lambda _task: None)
    monkeypatch.setattr(lifeline, "_BROKEN", threading.Event())
    lifeline._BROKEN.set()
    assert c._close(EXIT_INTERRUPTED, "interrupted by SIGTERM") == (EXIT_INTERRUPTED, "interrupted by SIGTERM")
    assert seen == [] and c.commander._judge.closing is None


def test_an_error_stop_has_no_closing_eval(tmp_path, fake_redis, small_cfg):
    c = _training_run(tmp_path, fake_redis, small_cfg)
    seen = _worker(c, lambda _task: None)
    assert c._close(1, "10 tasks failed in a row") == (1, "10 tasks failed in a row")
    assert seen == [] and c.commander._judge.closing is None


def test_the_wait_is_bounded_by_its_timeout():
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    steps = []
    outcome = wait_for_closing_eval(ClosingEval(task_id="t"), lambda: steps.append(1) or False, 5.0,
                                    lambda: False, clock)
    assert outcome == "timed out" and len(steps) == 4
    assert wait_for_closing_eval(ClosingEval(over=True), lambda: True, 5.0, lambda: False) == "over"


def test_an_interrupted_run_waits_at_most_10_s_for_its_closing_eval(small_cfg):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.closing_eval_timeout = 60.0
    assert closing_eval_seconds(cfg, interrupted=False) == 60.0
    assert closing_eval_seconds(cfg, interrupted=True) == 10.0
    cfg.commander.closing_eval_timeout = 0
    assert closing_eval_seconds(cfg, interrupted=True) == 0.0
