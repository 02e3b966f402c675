"""No credential leaves the process: a password in the URL's *query* (redis-py reads it there) is
never printed by ``rqrl train`` / ``rqrl status`` / the coordinator, logged, stored in Redis or put
on a child's command line."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from common.embedded_redis import EmbeddedRedis, find_redis_server
from tests.conftest import REPO, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

SECRET = "qPw-73kzQ"
CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


@pytest.fixture
def pw_redis():
    if find_redis_server() is None:
        pytest.skip("no redis-server binary")
    with EmbeddedRedis(["--requirepass", SECRET]) as server:
        yield server


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _cmdlines_with(secret: str, stop: threading.Event, found: list[str], own: set[int]) -> None:
    """Every 0.2 s, the processes (but ``own``) whose command line holds ``secret``. rqrl train's
    forked children inherit its command line until they rename themselves (their first act) or
    exec: one is reported only if it still shows the secret at the next scan."""
    suspects: set[int] = set()
    while not stop.wait(0.2):
        now = set()
        for p in Path("/proc").iterdir():
            if p.name.isdigit() and int(p.name) not in own and secret.encode() in _cmdline(int(p.name)):
                now.add(int(p.name))
        for pid in now & suspects:
            found.append(_cmdline(pid).replace(b"\0", b" ").decode(errors="replace"))
        suspects = now


def test_query_password_never_printed_logged_stored_or_on_a_command_line(tmp_path, pw_redis):
    url = f"redis://127.0.0.1:{pw_redis.port}/0?password={SECRET}"
    exp = f"cred_{os.getpid()}"
    env = dict(worker_env(url))
    # The user's own `rqrl train --redis-url ...` carries it (their choice); no child may.
    train = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--set", f"exp_name={exp}",
                              "--set", "commander.max_wall_seconds=12", "--set", "env.stop_value=1000",
                              "--collectors", "1", "--redis-url", url],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stop, found = threading.Event(), []
    watcher = threading.Thread(target=_cmdlines_with, args=(SECRET, stop, found, {os.getpid(), train.pid}), daemon=True)
    watcher.start()
    try:
        out, err = train.communicate(timeout=180)
    finally:
        stop.set()
        watcher.join()
    res = subprocess.CompletedProcess(train.args, train.returncode, out, err)
    assert res.returncode == 2 and "rqrl status --redis-url redis://127.0.0.1" in res.stderr, res.stderr[-2000:]
    status = subprocess.run([sys.executable, "-m", "coordinator.cli", "status"], env=env, capture_output=True,
                            text=True, timeout=60)
    wrong = url.replace(SECRET, SECRET[::-1])
    refused = subprocess.run([sys.executable, "-m", "coordinator.cli", "status", "--redis-url", wrong],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "password=***" in refused.stderr, refused.stderr
    coord = subprocess.run([sys.executable, "-m", "coordinator", CONFIG, "--redis-url", wrong], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=60)
    assert coord.returncode == 1
    shown = res.stdout + res.stderr + status.stdout + status.stderr + refused.stderr + coord.stdout + coord.stderr
    for f in tmp_path.rglob("*"):
        if f.is_file():
            shown += f.read_text(errors="replace")
    assert SECRET not in shown and SECRET[::-1] not in shown
    assert not found, f"a child's command line carries the password: {found[:1]}"
    stored = redis.Redis(host="127.0.0.1", port=pw_redis.port, password=SECRET)
    for key in stored.scan_iter(count=1000):
        assert SECRET.encode() not in (stored.dump(key) or b""), f"{key!r} holds the password"
