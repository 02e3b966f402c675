"""``rqrl coordinator`` and ``rqrl worker collector|learner``: the many-machines recipe without
``python -m`` or ``rq worker``'s cwd first on sys.path, so a user's own module named like one of
rqrl's packages in the folder they start in shadows nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.connection import connect
from tests.conftest import REPO, start_rq_workers, stop_workers, worker_env

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
RQRL = Path(sys.executable).with_name("rqrl")


@pytest.mark.skipif(not RQRL.exists(), reason="the rqrl console script is not installed beside this python")
def test_the_recipe_with_rqrl_commands_trains_from_a_folder_with_shadowing_modules(tmp_path, redis_server):
    url = redis_server.url
    connect(url).flushall()
    for name in ("common", "workers", "coordinator"):
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the folder\\'s own {name}.py was imported')\n")
    exp = f"fleet_{os.getpid()}"
    env = worker_env(url)
    env.pop("PYTHONPATH")  # as a user's shell: rqrl is installed, the repo is not on the path
    log = tmp_path / "workers.log"
    workers = start_rq_workers(connect(url), [[str(RQRL), "worker", q, "--url", url, "--name", f"{exp}-{q}-{i}"]
                                              for i, q in enumerate(["learner", "collector", "collector"])],
                               env=env, cwd=tmp_path, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        coord = subprocess.run([str(RQRL), "coordinator", CONFIG, "--redis-url", url, "--set", f"exp_name={exp}",
                                "--set", "commander.max_wall_seconds=0", "--set", "commander.max_env_step=60000"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert coord.returncode == 0, coord.stdout + coord.stderr[-3000:] + log.read_text()[-3000:]
        summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
        assert summary["exit_code"] == 0
    finally:
        stop_workers(workers)
    assert "was imported" not in log.read_text()
