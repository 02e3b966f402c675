"""A run's record is always true (issue 20), end to end: refusals come before anything is made
(item 4), and what a run leaves behind (its clocks, counters, TensorBoard events and logs) is
the run's own (item 7)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from tests.conftest import REPO, run_rqrl, worker_env

DQN = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _free_port() -> int:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed(*args, cwd):
    t0 = time.monotonic()
    res = run_rqrl(*args, cwd=cwd, timeout=120)
    return res, time.monotonic() - t0


def test_refusals_come_before_anything_is_launched_or_made(tmp_path):
    """A DQN config on Pendulum's Box actions, and a Redis URL nobody answers: each refused in one
    line within 3 s (interpreter start included), leaving no run folder, no `latest` link, no
    process (16 s and 10 failed tasks, and 31-33 s and an empty run folder, before)."""
    for args, expected in (
            (["--set", "env.env_id=Pendulum-v1"], "'dqn' needs Discrete actions"),
            (["--redis-url", f"redis://127.0.0.1:{_free_port()}/0"], "cannot reach Redis at redis://127.0.0.1"),
            (["--set", "env.wrappers=[{'type': 'gymnasium.wrappers:NormalizeObservation'}]"], "running statistics")):
        res, seconds = _timed("train", DQN, *args, cwd=tmp_path)
        assert res.returncode == 1, res.stderr[-2000:]
        assert expected in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert seconds < 3.0, (args, seconds)
        assert list(tmp_path.iterdir()) == [], (args, list(tmp_path.rglob("*")))
    res, seconds = _timed("sweep", DQN, "--seeds", "0-1", "--redis-url", f"redis://127.0.0.1:{_free_port()}/0",
                          cwd=tmp_path)
    assert res.returncode == 1 and "cannot reach Redis" in res.stderr and seconds < 3.0
    assert list(tmp_path.iterdir()) == []


def test_eval_of_a_missing_file_answers_before_importing_torch(tmp_path):
    code = ("import sys, time; t = time.monotonic(); from coordinator.cli import main; rc = main(['eval', "
            "'/missing.pt']); print(rc, 'torch' in sys.modules, round(time.monotonic() - t, 2))")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=worker_env(""))
    rc, torch_imported, seconds = res.stdout.split()
    assert (rc, torch_imported) == ("1", "False"), res.stdout + res.stderr
    assert "policy file '/missing.pt' does not exist" in res.stderr and float(seconds) < 3.0


def test_a_coordinator_given_an_unreachable_redis_gives_up_in_the_documented_10_s(tmp_path):
    """common.connection.PATIENCE_S: a restarting Redis is waited for 10 s, then one clear line (no run
    folder); nested client retries made it 31-33 s before."""
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "coordinator", DQN, "--redis-url", f"redis://127.0.0.1:{_free_port()}/0"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=worker_env(""))
    seconds = time.monotonic() - t0
    assert res.returncode == 1 and "cannot reach Redis at redis://127.0.0.1" in res.stderr, res.stderr[-2000:]
    assert 9.0 <= seconds < 13.0, seconds
    assert list(tmp_path.iterdir()) == []
