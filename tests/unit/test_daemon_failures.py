"""The coordinator's give-up rule counts failures in a row per task kind."""

from __future__ import annotations

import copy
import json
import logging
from unittest import mock

import pytest
import redis
from easydict import EasyDict

from common import blobstore, keys
from coordinator.daemon import Coordinator
from coordinator.records import BestEffort


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


def test_the_wrap_ups_writes_refused_by_a_full_redis_are_logged_whatever_form_the_refusal_takes():
    """The wrap-up is best effort on a full Redis: an OOM reply to a single write and a MULTI/EXEC
    aborted because Redis was full by its EXEC are logged; any other error is raised."""
    logged = []
    writes = BestEffort(mock.Mock(error=lambda fmt, *args: logged.append(fmt % args)))

    def refuse(error):
        def write():
            raise error
        return write

    oom = "OOM command not allowed when used memory > 'maxmemory'."
    assert not writes("write a", refuse(redis.OutOfMemoryError(oom)))
    assert not writes("write b", refuse(redis.exceptions.ExecAbortError(
        f"Transaction discarded because of: {oom}")))
    assert [line.split(":")[0] for line in logged] == ["could not write a", "could not write b"]
    with pytest.raises(redis.exceptions.ExecAbortError):
        writes("write c", refuse(redis.exceptions.ExecAbortError(
            "Transaction discarded because of: unknown command 'X'")))
    # Once Redis lost the run, no write is tried at all.
    assert not BestEffort(mock.Mock(), redis_lost=True)("write d", refuse(AssertionError("tried")))


class _Lines(logging.Handler):
    """The coordinator's log lines (its logger does not propagate to caplog)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelname, record.getMessage()))


def _spy(steps, name, fn):
    def step(*args, **kwargs):
        steps.append(name)
        return fn(*args, **kwargs)
    return step


def test_the_stop_sequence_stops_the_tasks_then_exports_then_writes_the_records_then_tears_down(
        tmp_path, fake_redis, small_cfg, capsys):
    """Coordinator._finish: the stop flag is set and the queued tasks cancelled before final.pt
    is exported, final.pt before summary.json, and the teardown comes last."""
    c = Coordinator(EasyDict(copy.deepcopy(small_cfg)), fake_redis, tmp_path, run_name="r1")
    blobstore.put_versioned(fake_redis, keys.ckpt(c.exp, "final_model"), b"trained bundle", 4)
    steps = []
    for part, name in ((c.tasks, "cancel_queued"), (c.records, "write_end"), (c.records, "signal_done"),
                       (c.tb, "close"), (c.ownership, "release")):
        setattr(part, name, _spy(steps, name, getattr(part, name)))
    export_final = c.exports.export_final

    def export_after_the_stop_flag(*args, **kwargs):
        steps.append(("export_final", fake_redis.get(keys.stop(c.exp))))
        return export_final(*args, **kwargs)

    c.exports.export_final = export_after_the_stop_flag
    c._finish(2, "max_train_iter 4 reached")
    assert steps == ["cancel_queued", ("export_final", b"max_train_iter 4 reached"), "write_end", "signal_done",
                     "close", "release"]
    summary = json.loads((c.out / "summary.json").read_text())
    assert summary["final_pt"] == str(c.out / "final.pt") and summary["final_policy_version"] == 4
    assert f"  final policy   {c.out / 'final.pt'} (policy version 4)" in capsys.readouterr().out


def test_a_failing_export_is_logged_and_the_records_are_still_written(tmp_path, fake_redis, small_cfg, capsys):
    """A final.pt export that raises (here a full disk) no longer ends the stop sequence:
    summary.json and the closing lines say there is no final.pt, and the teardown runs."""
    c = Coordinator(EasyDict(copy.deepcopy(small_cfg)), fake_redis, tmp_path, run_name="r1")
    lines = _Lines()
    c.log.addHandler(lines)
    steps = []

    def disk_gone(*_args, **_kwargs):
        steps.append("export_final")
        raise OSError("No space left on device")

    c.exports.export_final = disk_gone
    c.ownership.release = _spy(steps, "release", c.ownership.release)
    try:
        c._finish(2, "max_train_iter 4 reached")
    finally:
        c.log.removeHandler(lines)
    assert ("ERROR", "could not export final.pt: OSError: No space left on device") in lines.lines
    summary = json.loads((c.out / "summary.json").read_text())
    assert summary["status"] == "max_train_iter 4 reached" and summary["exit_code"] == 2
    assert summary["final_pt"] == "" and "final_policy_version" not in summary
    assert "final policy   not saved" in capsys.readouterr().out
    assert steps == ["export_final", "release"]  # and the teardown still ran
