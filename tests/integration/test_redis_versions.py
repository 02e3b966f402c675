"""rqrl on every supported Redis (6.2 and newer): the version check at start and ``rqrl status``.

Tests here are marked ``every_redis``: they run once per distinct redis-server version found on
the machine (tests/conftest.py).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import common.connection
from common.connection import RedisTooOld, check_server_version, connect_checked
from common.embedded_redis import binary_version
from tests.conftest import REPO, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.every_redis]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def test_a_supported_server_passes_the_check(real_redis, redis_server, redis_exe):
    assert check_server_version(real_redis, redis_server.url) == binary_version(redis_exe)
    connect_checked(redis_server.url).close()


def test_an_older_server_is_refused_in_one_line(redis_server, monkeypatch, capsys):
    """No Redis older than 6.2 is installed here: the server's INFO answer is replaced."""
    monkeypatch.setattr(common.connection, "server_version", lambda conn: "6.0.16")
    with pytest.raises(RedisTooOld) as e:
        connect_checked(redis_server.url)
    assert str(e.value) == f"Redis at {redis_server.url} is version 6.0.16; rqrl needs Redis 6.2 or newer"
    from coordinator.__main__ import main

    assert main([CONFIG, "--redis-url", redis_server.url]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "6.0.16" in err and "6.2" in err, err


def test_status_prints_the_server_version(redis_server, redis_exe):
    res = subprocess.run([sys.executable, "-m", "coordinator.cli", "status", "--redis-url", redis_server.url],
                         env=worker_env(redis_server.url), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"redis {binary_version(redis_exe)} " in res.stdout, res.stdout
