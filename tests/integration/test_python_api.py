"""The Python API as a user's script runs it: ``rqrl.train`` a config, ``rqrl.load`` its final.pt, act."""

from __future__ import annotations

import os
import subprocess
import sys

import rqrl
from tests.conftest import REPO, wait_gone, worker_env


def test_train_from_python_then_load_and_act_in_a_fresh_interpreter(tmp_path, monkeypatch):
    for k, v in worker_env("").items():
        monkeypatch.setenv(k, v)
    # A user's own common.py in the run's folder must not shadow rqrl's package of that name.
    (tmp_path / "common.py").write_text("raise ImportError('the user common.py was imported')\n")
    exp = f"api_{os.getpid()}"
    result = rqrl.train(REPO / "deploy" / "configs" / "cartpole_dqn.py", cwd=tmp_path, seed=1, exp_name=exp,
                        **{"commander.max_wall_seconds": 0, "commander.max_env_step": 60000})
    assert result.exit_code == 0, result
    assert result.run_dir is not None and result.run_dir.parent == tmp_path / exp
    assert result.summary["exit_code"] == 0 and result.run_dir.name.endswith("-s1")  # run names carry the seed
    assert wait_gone(exp) == []
    # The one-liner, as a user types it in the run folder.
    line = ("import rqrl, gymnasium as g; a=rqrl.load('final.pt'); e=g.make('CartPole-v1'); o,_=e.reset(seed=0); "
            "print(a.act(o), a.act(g.vector.SyncVectorEnv([lambda: g.make('CartPole-v1')] * 3).reset(seed=0)[0]))")
    out = subprocess.run([sys.executable, "-P", "-c", line], cwd=result.run_dir, capture_output=True, text=True,
                         timeout=120, env=worker_env(""))
    assert out.returncode == 0, out.stderr
    single, batch = out.stdout.strip().split(" ", 1)
    assert single in ("0", "1") and len(batch.strip("[]").split()) == 3, out.stdout
