"""Security end to end: an ACL user with a password over TLS (``rediss://``), secrets never shown.

The test makes a throw-away CA and server certificate with ``openssl``, starts a private
redis-server with TLS only (no plain port), an ACL user and the default user disabled, then
runs a real ``rqrl train`` over it and greps every log and output for the password.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from common.embedded_redis import find_redis_server, free_port
from tests.conftest import REPO, worker_env

# The runs are bounded by env steps; the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(900)]

SECRET = "pw-Zq81xT"
CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _certs(d: Path) -> None:
    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
         "-subj", "/CN=rqrl-test-ca")
    ossl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf")


@pytest.fixture
def tls_redis(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not found")
    d = tmp_path / "tls"
    d.mkdir()
    _certs(d)
    (d / "users.acl").write_text(f"user default off\nuser rqrl on >{SECRET} ~* &* +@all\n")
    port = free_port()
    candidates = [b for b in ("/usr/bin/redis-server", shutil.which("redis-server"), find_redis_server()) if b]
    for exe in dict.fromkeys(candidates):
        proc = subprocess.Popen([exe, "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(d / "server.crt"),
                                 "--tls-key-file", str(d / "server.key"), "--tls-ca-cert-file", str(d / "ca.crt"),
                                 "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", str(d),
                                 "--aclfile", str(d / "users.acl")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"rediss://rqrl:{SECRET}@127.0.0.1:{port}/0?ssl_ca_certs={d / 'ca.crt'}"
        for _ in range(50):
            if proc.poll() is not None:
                break
            try:
                redis.Redis.from_url(url).ping()
                yield url
                proc.terminate()
                proc.wait(timeout=10)
                return
            except redis.RedisError:
                time.sleep(0.1)
        proc.kill()
        proc.wait()
    pytest.skip("no redis-server with TLS support")


def test_train_over_tls_with_acl_user_and_no_secret_leaks(tmp_path, tls_redis):
    exp = f"tls_{os.getpid()}"
    run = tmp_path / "run"
    run.mkdir()
    # The URL travels in the environment, not on command lines (visible in `ps`).
    env = dict(worker_env(tls_redis))
    res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--set", f"exp_name={exp}",
                          "--set", "env.stop_value=120", "--set", "commander.max_wall_seconds=0",
                          "--set", "commander.max_env_step=60000",
                          "--redis-url", tls_redis], cwd=run, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    status = subprocess.run([sys.executable, "-m", "coordinator.cli", "status", "--redis-url", tls_redis, "--json"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert exp in status.stdout
    shown = res.stdout + res.stderr + status.stdout + status.stderr
    for f in (run / exp).rglob("*"):
        if f.is_file() and f.suffix in (".log", ".txt", ".json"):
            shown += f.read_text(errors="replace")
    assert SECRET not in shown


def test_wrong_password_is_a_clear_error_at_once(tls_redis, tmp_path):
    bad = tls_redis.replace(SECRET, "bad-Pw-93kq")
    res = subprocess.run([sys.executable, "-m", "coordinator", CONFIG, "--redis-url", bad], cwd=tmp_path,
                         capture_output=True, text=True, timeout=10, env=worker_env(bad))  # no retry loop
    assert res.returncode == 1
    assert "Redis at rediss://rqrl:***@127.0.0.1" in res.stderr and "refused" in res.stderr
    assert "bad-Pw-93kq" not in res.stderr
