"""A config file that registers its own env by importing a module: the import travels in the config.

Workers never see the config file; they get the compiled config (``env.import_names``) and
import those modules before building the env (common/spaces.py ``probe`` / ``import_env_modules``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from common import spaces
from common.config import load_config
from tests.conftest import REPO

ENV_MODULE = """
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class {cls}(gym.Env):
    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(4, start=2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {{}}

    def step(self, action):
        return np.zeros(3, np.float32), 1.0, True, False, {{}}


gym.register(id="{env_id}", entry_point={cls})
"""


def write_env_module(tmp_path, monkeypatch):
    """A fresh module (unique name, so no test sees another's import) that registers a fresh env id."""
    tag = uuid.uuid4().hex[:8]
    mod, env_id = f"rqrl_custom_env_{tag}", f"RqrlCustom{tag}-v0"
    (tmp_path / f"{mod}.py").write_text(ENV_MODULE.format(cls=f"Custom{tag}", env_id=env_id))
    monkeypatch.syspath_prepend(str(tmp_path))
    return mod, env_id


def write_config(tmp_path, header: str, env_id: str, extra_env: str = ""):
    path = tmp_path / "custom_config.py"
    path.write_text(header + textwrap.dedent(f"""

        main_config = dict(
            exp_name="custom_env",
            env=dict(env_id={env_id!r}, stop_value=1.0{extra_env}),
        )
        create_config = dict(policy=dict(type="dqn"))
        """))
    return path


def test_config_import_registers_the_env_and_lands_in_import_names(tmp_path, monkeypatch):
    mod, env_id = write_env_module(tmp_path, monkeypatch)
    path = write_config(tmp_path, f"import os\nimport math\nimport {mod}\nfrom collections import OrderedDict\n", env_id)
    cfg = load_config(path)
    assert list(cfg.env.import_names) == [mod]  # stdlib imports (os, math, collections) are not added
    spec = spaces.probe(cfg)
    assert spec.env_id == env_id and spec.obs_shape == (3,)
    assert (spec.action_n, spec.action_start) == (4, 2)
    spaces.check_model(cfg, spec)
    assert cfg.policy.model.obs_shape == 3 and cfg.policy.model.action_shape == 4


def test_from_import_and_explicit_import_names_are_merged_without_duplicates(tmp_path, monkeypatch):
    mod, env_id = write_env_module(tmp_path, monkeypatch)
    path = write_config(tmp_path, f"import math\nfrom {mod} import *  # noqa\nimport {mod}\n", env_id,
                        extra_env=f", import_names=[{mod!r}]")
    cfg = load_config(path)
    assert list(cfg.env.import_names) == [mod]


def test_a_fresh_process_with_only_the_compiled_config_builds_the_env(tmp_path, monkeypatch):
    """What a worker does: it never saw the config file, only the compiled config (as JSON here)."""
    mod, env_id = write_env_module(tmp_path, monkeypatch)
    cfg = load_config(write_config(tmp_path, f"import {mod}\n", env_id))
    code = textwrap.dedent("""
        import json, sys
        from easydict import EasyDict
        from common import spaces
        cfg = EasyDict(json.loads(sys.argv[1]))
        try:
            spec = spaces.probe(cfg)
        except spaces.SpaceError as e:
            print("SpaceError:", e)
            sys.exit(3)
        print(json.dumps(spec.to_dict()))
        """)

    def run(cfg_dict, pythonpath):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
        # A cwd other than tmp_path, so the module is importable only through PYTHONPATH.
        return subprocess.run([sys.executable, "-c", code, json.dumps(cfg_dict)], capture_output=True, text=True,
                              env=env, cwd=str(REPO), timeout=60)

    res = run(cfg, [str(REPO), str(tmp_path)])
    assert res.returncode == 0, res.stdout + res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["env_id"] == env_id and got["action_n"] == 4 and got["action_start"] == 2

    # Without import_names the fresh process cannot know the env: refused naming its id.
    bare = json.loads(json.dumps(cfg))
    bare["env"]["import_names"] = []
    res = run(bare, [str(REPO), str(tmp_path)])
    assert res.returncode == 3, res.stdout + res.stderr
    assert env_id in res.stdout and "env.env_id" in res.stdout

    # The module missing on the worker's path: refused naming the module and the config key.
    res = run(cfg, [str(REPO)])
    assert res.returncode == 3, res.stdout + res.stderr
    assert mod in res.stdout and "env.import_names" in res.stdout


def test_rqrl_config_show_reads_shapes_from_the_custom_env(tmp_path, monkeypatch, capsys):
    from coordinator.cli import main as rqrl_main

    mod, env_id = write_env_module(tmp_path, monkeypatch)
    path = write_config(tmp_path, f"import {mod}\n", env_id)
    assert rqrl_main(["config", "show", str(path)]) == 0
    out, err = capsys.readouterr()
    shown = json.loads(out)
    assert shown["env"]["import_names"] == [mod]
    assert shown["policy"]["model"]["obs_shape"] == 3 and shown["policy"]["model"]["action_shape"] == 4
    assert env_id not in err  # no space note: the spaces were read from the env
    # The env sets no time limit: the eval cap may cut an eval, and stock forking workers every episode.
    assert "warning: config key 'policy.eval.evaluator.max_env_steps' = 100,000 can cut evals short" in err
    assert "note: on a stock forking `rq worker collector`" in err


def test_unimportable_import_name_refused_naming_key_and_module():
    with pytest.raises(spaces.SpaceError, match=r"env\.import_names.*no_such_module_rqrl"):
        spaces.import_env_modules(["no_such_module_rqrl"])


def test_rqrl_console_script_imports_an_env_module_from_the_cwd(tmp_path, monkeypatch):
    from pathlib import Path

    mod, env_id = write_env_module(tmp_path, monkeypatch)
    write_config(tmp_path, f"import {mod}\n", env_id)
    rqrl = Path(sys.executable).with_name("rqrl")
    if not rqrl.exists():
        pytest.skip("no rqrl console script beside this interpreter")
    env = dict(os.environ, PYTHONPATH=str(REPO))  # the repo importable; tmp_path only as the cwd
    res = subprocess.run([str(rqrl), "config", "show", "custom_config.py"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["env"]["import_names"] == [mod]
