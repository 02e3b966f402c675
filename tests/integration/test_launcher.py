"""``rqrl train`` forks its coordinator and workers from one process that imported torch once
(coordinator/launcher.py); the workers are still RQ's own: registered under their names on the
``collector`` / ``learner`` queues (what ``rq info`` and rq-dashboard read), children of
``rqrl train`` whose work-horses run the tasks, and unregistered once the run is torn down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Callable

import psutil
import pytest
from rq import Worker

from common import keys
from common.connection import connect
from tests.conftest import REPO, wait_event, wait_gone, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def test_forked_workers_are_rq_workers_and_leave_with_the_run(tmp_path, redis_server):
    conn = connect(redis_server.url)
    conn.flushall()
    exp = f"fork_{os.getpid()}"
    ns = keys.namespace(exp, "r")  # the run's key namespace (--name r)
    train = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", redis_server.url,
                              "--name", "r",
                              "--set", f"exp_name={exp}", "--set", "env.stop_value=100000", "--collectors", "1"],
                             cwd=tmp_path, env=worker_env(""), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_event(conn, ns, lambda ev: ev.get("type") == "started" and ev.get("task_type") == "collector", timeout=120)
        # The learner worker imports torch._dynamo before its first task (PreloadWorker): it may start later.
        learner = wait_event(conn, ns, lambda ev: ev.get("type") == "started" and ev.get("task_type") == "learner",
                             timeout=120)
        workers = [w for w in Worker.all(connection=conn) if w.name.startswith(f"{exp}-")]
        queues = sorted(q for w in workers for q in w.queue_names())
        assert queues == ["collector", "collector", "learner"], [(w.name, w.queue_names()) for w in workers]
        assert all(w.pid for w in workers)
        # Each worker is a forked child of `rqrl train` (not an exec'd `rq` process) ...
        children = {c.pid for c in psutil.Process(train.pid).children()}
        assert {w.pid for w in workers} <= children, (children, [w.pid for w in workers])
        # named by their worker (RQ's process title), never with the parent's command line
        assert all(" ".join(psutil.Process(w.pid).cmdline()).startswith(f"rq:worker:{w.name}") for w in workers)
        # ... and the learner task (running until the stop) in a work-horse its worker forked.
        assert psutil.Process(int(learner["pid"])).ppid() in {w.pid for w in workers}
        # The collector workers yield the CPU to the learner (RQRL_COLLECTOR_NICE, default 5).
        base = psutil.Process(train.pid).nice()
        assert {psutil.Process(w.pid).nice() - base for w in workers if "collector" in w.queue_names()} == {5}
        assert psutil.Process(int(learner["pid"])).nice() == base
    finally:
        train.send_signal(signal.SIGTERM)
        out, err = train.communicate(timeout=60)
    assert train.returncode == 128 + signal.SIGTERM, out + err[-3000:]
    assert wait_gone(exp) == []  # the workers stop in rqrl train's background teardown
    assert [w.name for w in Worker.all(connection=conn) if w.name.startswith(f"{exp}-")] == []


def test_a_collector_worker_killed_by_its_env_is_started_again(tmp_path, redis_server):
    """A collector worker runs its tasks, and their envs, in its own process: an env that kills the
    process (a segfault, here SIGKILL) takes the worker down. rqrl train forks it again, the task
    is replaced, and the run goes on to its budget."""
    marker = tmp_path / "killed"
    exp = f"respawn_{os.getpid()}"
    res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", redis_server.url,
                          "--set", f"exp_name={exp}", "--set", "env.env_id=tests.fixtures.bad_envs:KillingCartPole-v0",
                          "--set", f"env.env_kwargs={{'marker': '{marker}'}}", "--set", "env.stop_value=100000",
                          "--set", "commander.max_env_step=3000", "--collectors", "1"],
                         cwd=tmp_path, env=worker_env(""), capture_output=True, text=True, timeout=240)
    assert marker.exists(), "the env never killed its worker"
    assert res.returncode == 2 and "max_env_step 3000 reached" in res.stdout, res.stdout + res.stderr[-3000:]
    assert "; starting it again" in res.stderr, res.stderr[-3000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_rqrl_train_returns_before_its_teardown_and_leaves_nothing_behind(tmp_path):
    """Once summary.json and final.pt are written, rqrl train returns: it waits neither for
    workers that are slow to stop (their envs take 120 s to close, which only the teardown's
    signals cut short) nor for the private Redis's stop or curve.png. These finish in a
    background teardown that leaves no process behind. Run under a subreaper, so every process
    rqrl train leaves is seen, in whatever session it runs."""
    exp = f"fastexit_{os.getpid()}"
    run = tmp_path / exp / "r"
    report = tmp_path / "report.json"
    res = subprocess.run(
        [sys.executable, "-m", "tests.fixtures.subreaper", str(report), "90",
         "--exists", str(run / "summary.json"), str(run / "final.pt"), "--",
         sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--name", "r", "--set", f"exp_name={exp}",
         "--set", "env.env_id=tests.fixtures.bad_envs:SlowCloseCartPole-v0", "--set", "env.stop_value=30",
         "--set", "commander.max_env_step=200000"],
        cwd=tmp_path, env=worker_env(""), capture_output=True, text=True, timeout=290)
    assert res.returncode == 0, res.stderr[-3000:]
    r = json.loads(report.read_text())
    assert r["exit_code"] == 0, res.stdout + res.stderr[-3000:]
    assert all(r["existed_at_exit"].values()), r["existed_at_exit"]
    # The exit waited neither for the workers nor for the Redis stop ...
    alive = [p["name"] for p in r["alive_at_exit"]]
    assert any(n.startswith("redis-server") for n in alive), r["alive_at_exit"]
    assert sum(1 for p in r["alive_at_exit"] if exp in p["cmdline"]) >= 2, r["alive_at_exit"]  # workers, teardown
    # ... which the background teardown saw to: nothing is left, curve.png is drawn.
    assert r["left"] == [], r["left"]
    assert (run / "curve.png").stat().st_size > 1000
    assert "the coordinator did not exit" not in (run / "log" / "teardown.log").read_text()


def _start_under_subreaper(tmp_path, report, exp: str, *extra: str, **popen) -> tuple[subprocess.Popen, str]:
    """``rqrl train`` (private Redis, run ``r``) under a subreaper; returns the subreaper and the
    private Redis's URL once rqrl train printed it."""
    reaper = subprocess.Popen(
        [sys.executable, "-m", "tests.fixtures.subreaper", str(report), "60", "--",
         sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--name", "r", "--set", f"exp_name={exp}",
         "--set", "env.stop_value=100000", "--collectors", "1", *extra],
        cwd=tmp_path, env=worker_env(""), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **popen)
    for line in reaper.stderr:
        if "started a private redis-server at " in line:
            return reaper, line.rsplit(" ", 1)[1].strip()
    raise AssertionError(f"rqrl train started no private Redis (exit {reaper.wait()})")


def _signal_rqrl_train(tmp_path, exp: str, sig: int, ready: Callable[[dict], bool], **popen) -> dict:
    """Start ``rqrl train`` under a subreaper, send it ``sig`` once an event matches ``ready``,
    and return the subreaper's report (exit code, what was alive at the exit, what was left)."""
    report = tmp_path / "report.json"
    reaper, url = _start_under_subreaper(tmp_path, report, exp, **popen)
    try:
        wait_event(connect(url), keys.namespace(exp, "r"), ready, timeout=120)
        train = [p for p in psutil.Process(reaper.pid).children() if "coordinator.cli" in " ".join(p.cmdline())]
        assert len(train) == 1
        train[0].send_signal(sig)
        reaper.communicate(timeout=120)
        assert reaper.returncode == 0
    finally:
        if reaper.poll() is None:
            reaper.kill()
    return json.loads(report.read_text())


def test_kill_9_of_rqrl_train_takes_every_child_and_the_private_redis_along(tmp_path):
    """Children run in sessions of their own, so nothing but the lifeline pipes ends them when
    rqrl train is SIGKILLed: the coordinator stops the run (summary.json), the workers exit, and
    the private Redis stops once none of them is left."""
    exp = f"kill9_{os.getpid()}"
    r = _signal_rqrl_train(tmp_path, exp, signal.SIGKILL,
                           lambda ev: ev.get("type") == "started" and ev.get("task_type") == "learner")
    assert r["exit_code"] == -signal.SIGKILL
    assert any(p["name"].startswith("redis-server") for p in r["alive_at_exit"]), r["alive_at_exit"]
    assert r["left"] == [], r["left"]
    assert r["gone_after_s"] < 30, r
    summary = json.loads((tmp_path / exp / "r" / "summary.json").read_text())
    assert summary["exit_code"] == 130 and "SIGTERM" in summary["status"]


def test_rqrl_train_started_with_sigint_ignored_still_stops_on_kill_int(tmp_path):
    """A script's `rqrl train ... &` inherits SIGINT ignored; `kill -INT` must still stop the run."""
    exp = f"bgint_{os.getpid()}"
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731 - what a shell does for `&`
    r = _signal_rqrl_train(tmp_path, exp, signal.SIGINT, lambda ev: ev.get("type") == "started",
                           preexec_fn=ignore_sigint)
    assert r["exit_code"] == 128 + signal.SIGINT and r["left"] == [], r


def test_a_launch_the_coordinator_refuses_says_why_and_leaves_no_stop_key(tmp_path, real_redis, redis_server):
    """The coordinator refuses the run (another coordinator owns its name): rqrl train shows the
    reason from the coordinator's log, and sets no stop flag on a run that never started."""
    exp = f"refused_{os.getpid()}"
    ns = keys.namespace(exp, "r")
    real_redis.set(keys.coordinator_alive(ns), "coordinator-elsewhere-1", ex=120)
    res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", redis_server.url,
                          "--name", "r", "--set", f"exp_name={exp}", "--collectors", "1"],
                         cwd=tmp_path, env=worker_env(""), capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "ended without a summary" in res.stderr and "is owned by coordinator-elsewhere-1" in res.stderr, \
        res.stderr[-3000:]
    assert not real_redis.exists(keys.stop(ns)), "a refused launch left the run's stop key behind"
    assert wait_gone(exp) == []
