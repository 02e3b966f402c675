"""Redis blips and bad input while a real run trains: nothing crashes, the run still converges."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from tests.conftest import REPO, wait_event, worker_env

# The runs are bounded by env steps; the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _train(url: str, exp: str, cwd, *extra: str) -> subprocess.Popen:
    """``rqrl train`` of run ``r1`` (key namespace ``{exp}/r1``)."""
    return subprocess.Popen([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", url, "--name", "r1",
                             "--set", f"exp_name={exp}", "--set", "commander.max_wall_seconds=0",
                             "--set", "commander.max_env_step=60000", *extra],
                            cwd=cwd, env=worker_env(url), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_redis_pause_and_dropped_connections_are_survived(tmp_path, redis_server):
    server = EmbeddedRedis().start()  # its own server: the test kills every client connection
    try:
        conn = connect(server.url)
        exp = f"blip_{os.getpid()}"
        p = _train(server.url, exp, tmp_path, "--set", "env.stop_value=250")
        wait_event(conn, f"{exp}/r1", lambda e: e["type"] == "learner_info", 90)
        conn.execute_command("CLIENT", "PAUSE", "10000", "ALL")  # every client blocks for 10 s
        # A fresh client's PING is held like everyone's: it returns when the pause is over.
        waiter = connect(server.url)
        assert waiter.ping()
        waiter.close()
        killed = conn.execute_command("CLIENT", "KILL", "TYPE", "normal") + \
            conn.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        assert killed > 0
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, out + err[-3000:]
        coord_log = (tmp_path / exp / "latest" / "log" / "coordinator.log").read_text()
        assert "Traceback" not in coord_log, coord_log[-3000:]
        assert "heartbeat checks paused" in coord_log
    finally:
        server.stop()


def test_redis_restarted_empty_is_reported_clearly(tmp_path):
    server = EmbeddedRedis().start()
    try:
        exp = f"empty_{os.getpid()}"
        p = _train(server.url, exp, tmp_path, "--set", "env.stop_value=100000")
        conn = connect(server.url)
        wait_event(conn, f"{exp}/r1", lambda e: e["type"] == "learner_info", 90)
        conn.flushall()  # what a restart without persistence looks like to clients
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1, out + err[-3000:]
        log = (tmp_path / exp / "latest" / "log" / "coordinator.log").read_text()
        assert "Redis lost the state of run" in log, log[-2000:]
        # The terminal says why, and the run folder has its summary (issue 19, item 5).
        assert f"rqrl {exp}/r1: Redis lost the state of run" in out, out[-2000:] + err[-2000:]
        summary = json.loads((tmp_path / exp / "r1" / "summary.json").read_text())
        assert summary["exit_code"] == 1 and "Redis lost the state of run" in summary["status"]
        assert summary["train_iter"] > 0
    finally:
        server.stop()


def test_unknown_env_id_fails_fast_naming_the_key(tmp_path, redis_server):
    res = subprocess.run([sys.executable, "-m", "coordinator", CONFIG, "--redis-url", redis_server.url,
                          "--set", "env.env_id=NoSuchEnv-v9"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env=worker_env(redis_server.url))
    assert res.returncode == 1
    assert "env.env_id" in res.stderr and "NoSuchEnv-v9" in res.stderr


def test_config_errors_name_the_key(tmp_path, redis_server):
    bad = tmp_path / "bad.py"
    bad.write_text("main_config = dict(exp_name='x', policy=dict(learn=dict(batch_sise=3)))\n")
    res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", str(bad), "--redis-url", redis_server.url],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, env=worker_env(redis_server.url))
    assert res.returncode == 1
    assert "policy.learn.batch_sise" in res.stderr and "policy.learn.batch_size" in res.stderr
    syntax = tmp_path / "syntax.py"
    syntax.write_text("main_config = dict(\n")
    res = subprocess.run([sys.executable, "-m", "coordinator", str(syntax), "--redis-url", redis_server.url],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60, env=worker_env(redis_server.url))
    assert res.returncode == 1 and "syntax error" in res.stderr and "syntax.py" in res.stderr
