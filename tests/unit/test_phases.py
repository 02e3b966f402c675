"""A run's phases (common/phases.py): recorded in Redis by the process that passed them, shown as
seconds after launch by ``rqrl status`` (and the closing lines), with launch taken from the
process's own start time."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from common import keys, phases
from coordinator.status import collect_status, render
from tests.conftest import REPO

RUN = "exp_a/20261130T021500Z-s1"


def test_record_keeps_the_first_unless_told_and_refuses_unknown_names(fake_redis):
    phases.record(fake_redis, RUN, "first_train_step", 100.0)
    phases.record(fake_redis, RUN, "first_train_step", 105.0)  # a replacement learner's: not the run's
    phases.record(fake_redis, RUN, "passing_eval", 110.0)
    phases.record(fake_redis, RUN, "passing_eval", 120.0, first_only=False)  # a later eval passed
    phases.record(fake_redis, RUN, "launch", 99.0)
    assert phases.read(fake_redis, RUN) == {"launch": 99.0, "first_train_step": 100.0, "passing_eval": 120.0}
    assert list(phases.read(fake_redis, RUN)) == ["launch", "first_train_step", "passing_eval"]  # run order
    with pytest.raises(ValueError, match="unknown phase 'first_step'"):
        phases.record(fake_redis, RUN, "first_step")
    assert fake_redis.exists(keys.phases(RUN))


def test_rendered_as_seconds_after_launch_and_wrapped_between_phases():
    ph = {name: 1000.0 + i * 0.5 for i, name in enumerate(phases.NAMES)}
    assert phases.seconds(ph)["exit"] == 4.5
    line = phases.render(ph)
    assert line.startswith("launch 0.00 s | redis up 0.50 | workers up 1.00 |") and line.endswith("exit 4.50")
    wrapped = phases.render(ph, width=40, indent="    ")
    assert wrapped.replace("\n    ", " ") == line
    assert all(len(ln) <= 40 for ln in ("    " + wrapped).splitlines()) and wrapped.count("\n") >= 3
    assert phases.render({}) == "none"
    assert phases.render({"first_eval": 7.0, "exit": 9.5}) == "first eval 0.00 s | exit 2.50"  # no launch: first


def test_status_shows_the_phases(fake_redis):
    fake_redis.sadd(keys.runs(), RUN)
    for i, name in enumerate(("launch", "redis_up", "workers_up", "first_policy", "first_train_step")):
        phases.record(fake_redis, RUN, name, 50.0 + i)
    st = collect_status(fake_redis)
    assert st["runs"][RUN]["phases"]["first_train_step"] == 54.0
    assert "  phases launch 0.00 s | redis up 1.00 | workers up 2.00 |" in render(st)


def test_process_start_time_is_when_the_process_started():
    """Launch is the process's start (/proc), not when rqrl's code first ran: the interpreter's
    own start-up counts."""
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "import time; from common.phases import process_start_time; "
                          "print(process_start_time(), time.time())"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    started, printed = map(float, out.stdout.split())
    assert before - 0.02 <= started <= printed, (before, started, printed)  # /proc has 10 ms ticks
    assert abs(phases.process_start_time() - phases.process_start_time()) < 0.02
