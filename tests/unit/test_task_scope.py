"""workers.task.task_scope: a task whose write a revoked lease refused is dropped with a log line."""

from __future__ import annotations

import copy
import logging
from dataclasses import replace

import pytest
from easydict import EasyDict

from common import keys, streams
from common.lease import LeaseRevoked
from coordinator.commander import SoloCommander
from workers.task import task_scope, validate_task


@pytest.fixture
def ctx(small_cfg, fake_redis):
    cm = SoloCommander(EasyDict(copy.deepcopy(small_cfg)), run_id="r1", run_name="run-a")
    cm.get_learner_task()
    return replace(validate_task(cm.get_collector_task(), "collector"), conn=fake_redis)


def _failed(ctx) -> list[dict]:
    return [e for e in (streams.decode_fields(f) for _, f in ctx.conn.xrange(keys.events(ctx.ns)))
            if e["type"] == "failed"]


@pytest.mark.parametrize("wrapped", [False, True], ids=["direct", "as-cause"])
def test_a_revoked_lease_drops_the_task_with_a_line(ctx, caplog, wrapped):
    revoked = LeaseRevoked(f"lease {keys.lease(ctx.ns, ctx.task_id)} was revoked; this task was replaced")
    with caplog.at_level(logging.WARNING, logger="workers.task"), pytest.raises(Exception):
        with task_scope(ctx, lambda _e: {}):
            if wrapped:  # as the learner's data source re-raises its buffer reader's error
                raise RuntimeError("buffer reader failed") from revoked
            raise revoked
    assert [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()] == [
        f"task {ctx.task_id} dropped: {revoked} (it was declared dead while this process was stopped, and a "
        "replacement runs it; nothing more of this one is written)"]
    assert len(_failed(ctx)) == 1  # still reported: the coordinator ignores it for a task it replaced


def test_other_errors_are_not_called_a_drop(ctx, caplog):
    with caplog.at_level(logging.WARNING, logger="workers.task"), pytest.raises(ValueError):
        with task_scope(ctx, lambda _e: {}):
            raise ValueError("bad chunk")
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]
    assert "ValueError: bad chunk" in _failed(ctx)[0]["error"]
