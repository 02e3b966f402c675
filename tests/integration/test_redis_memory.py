"""Redis memory: eviction policies are refused at start, a small maxmemory is warned about, and a
Redis that runs out of memory mid-run stops the run cleanly (reason, summary.json), leaves the rq
workers alive and ``rqrl status`` answering."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from common import keys, streams
from common.connection import connect
from common.embedded_redis import EmbeddedRedis, find_redis_server
from tests.conftest import REPO, WORKER_CLASS, rq_bin, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


@pytest.fixture
def server(request):
    if find_redis_server() is None:
        pytest.skip("no redis-server binary")
    with EmbeddedRedis(list(getattr(request, "param", []))) as s:
        yield s


def _cli(*args, cwd, url, timeout=120):
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=worker_env(url), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("server", [["--maxmemory-policy", "allkeys-lru", "--maxmemory", "200mb"]], indirect=True)
def test_an_evicting_redis_is_refused_unless_allowed(tmp_path, server):
    url = server.url
    for argv in (["coordinator", CONFIG, "--redis-url", url],
                 ["coordinator.cli", "train", CONFIG, "--redis-url", url, "--set", "exp_name=evict_t"]):
        res = _cli(*argv, cwd=tmp_path, url=url)
        assert res.returncode == 1, res.stderr[-2000:]
        assert "maxmemory-policy is 'allkeys-lru'" in res.stderr and "--allow-eviction" in res.stderr, res.stderr
    res = _cli("coordinator", CONFIG, "--redis-url", url, "--allow-eviction", "--set", "commander.max_wall_seconds=1",
               cwd=tmp_path, url=url)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "(allowed by --allow-eviction)" in res.stderr


@pytest.mark.parametrize("server", [["--maxmemory", "1300kb"]], indirect=True)
def test_a_maxmemory_below_the_estimate_is_refused_naming_both_figures(tmp_path, server):
    for argv in (["coordinator", CONFIG, "--redis-url", server.url],
                 ["coordinator.cli", "train", CONFIG, "--redis-url", server.url, "--set", "exp_name=small_t"]):
        res = _cli(*argv, cwd=tmp_path, url=server.url)
        assert res.returncode == 1, res.stderr[-2000:]
        assert "Redis maxmemory 1.3 MB leaves" in res.stderr and "this run needs ~" in res.stderr, res.stderr
    assert not (tmp_path / "small_t").exists()  # refused before any folder is made


def test_out_of_memory_mid_run_stops_cleanly(tmp_path, server):
    url, exp = server.url, f"oom_{os.getpid()}"
    conn = connect(url)
    env = worker_env(url)
    workers = [subprocess.Popen([rq_bin(), "worker", q, "--url", url, "-w", WORKER_CLASS[q],
                                 "--name", f"{exp}-{q}-{i}"], env=env, cwd=tmp_path,
                                stdout=open(tmp_path / f"w{i}.log", "wb"), stderr=subprocess.STDOUT)
               for i, q in enumerate(["learner", "collector", "collector"])]
    coord = subprocess.Popen([sys.executable, "-m", "coordinator", CONFIG, "--redis-url", url, "--set", f"exp_name={exp}",
                              "--run-name", "r1",
                              "--set", "env.stop_value=100000", "--set", "commander.max_wall_seconds=120"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        last = b"0"
        deadline = time.monotonic() + 90
        trained = False
        while not trained and time.monotonic() < deadline:  # until the learner has trained a while
            for _, entries in conn.xread({keys.events(f"{exp}/r1"): last}, block=1000) or []:
                for eid, raw in entries:
                    last = eid
                    ev = streams.decode_fields(raw)
                    trained |= ev.get("type") == "learner_info" and int(ev.get("train_iter", 0)) >= 200
        assert trained, "the run never trained"
        used = conn.info("memory")["used_memory"]
        conn.config_set("maxmemory", used + 64 * 1024)  # full within seconds
        out, _ = coord.communicate(timeout=120)
        summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
        assert coord.returncode == 1, out[-3000:]
        assert summary["status"].startswith("Redis out of memory (used "), summary["status"]
        assert "/ maxmemory" in summary["status"]
        assert "Traceback" not in out, out[-3000:]
        conn.config_set("maxmemory", 1024 * 1024)  # below what is used: every write refused
        status = _cli("coordinator.cli", "status", "--redis-url", url, cwd=tmp_path, url=url, timeout=60)
        assert status.returncode == 0, status.stderr[-2000:]
        assert f"RUN {exp}/r1" in status.stdout and "FULL: writes refused" in status.stdout, status.stdout
        # The workers lived through the stop and the status call's seconds of a Redis refusing writes.
        logs = "".join((tmp_path / f"w{i}.log").read_text()[-3000:] for i in range(3))
        assert [w.poll() for w in workers] == [None, None, None], "an rq worker died:\n" + logs
        assert "the worker process died" not in out, out[-3000:]
    finally:
        conn.config_set("maxmemory", 0)
        for p in [coord, *workers]:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [coord, *workers]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
