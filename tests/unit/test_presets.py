"""The preset table of ``rqrl train --env ID [--algo NAME]`` (common/presets.py): every preset's
file builds, names the env id and algorithm the table gives it, sets its own stop value, and its
policy acts in its env (the network's input is the env's observation, its output an action the
env takes). A preset whose env needs an extra that is not installed is skipped, naming it.
"""

from __future__ import annotations

import importlib.util
import re
import runpy
import subprocess
import sys

import numpy as np
import pytest

from common import envs, presets, spaces
from common.config import load_config
from common.policy import algorithm_of, create_policy
from tests.conftest import REPO

def _skip_without_extra(preset: presets.Preset) -> None:
    if preset.missing_extra:
        pytest.skip(f"{preset.env_id} needs the {preset.extra} extra (pip install -e \".[{preset.extra}]\")")


@pytest.mark.parametrize("preset", presets.PRESETS, ids=lambda p: f"{p.env_id}-{p.algo}")
def test_each_preset_builds_and_its_policy_acts_in_its_env(preset):
    _skip_without_extra(preset)
    cfg = load_config(preset.path)
    assert cfg.env.env_id == preset.env_id
    assert algorithm_of(cfg).name == preset.algo
    # The stop value is the file's own (not the default's), and a number a return can reach.
    own = runpy.run_path(str(preset.path))["main_config"]
    assert "stop_value" in own["env"], f"{preset.config} sets no env.stop_value"
    assert np.isfinite(float(cfg.env.stop_value))
    doc = runpy.run_path(str(preset.path)).get("__doc__") or ""
    assert len(doc) > 200, f"{preset.config}: its docstring must say where its hyperparameters come from"

    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)  # the network's shapes are the env's
    policy = create_policy(cfg, spec, modes=("eval",), device="cpu")
    env = envs.make(cfg.env, train=False)
    try:
        obs, _ = env.reset(seed=0)
        action = policy.act_eval(np.asarray(obs)[None], np.random.default_rng(0))[0]
        if spec.action_kind == "discrete":
            action = int(action) + spec.action_start
        assert env.action_space.contains(np.asarray(action, dtype=env.action_space.dtype)
                                         if spec.action_kind == "box" else action), (action, env.action_space)
        env.step(action)
    finally:
        env.close()


def test_the_table_has_one_preset_per_env_and_algorithm_and_every_file_exists():
    pairs = [(p.env_id, p.algo) for p in presets.PRESETS]
    assert len(pairs) == len(set(pairs))
    assert all(p.path.is_file() for p in presets.PRESETS)
    families = {p.family for p in presets.PRESETS}
    assert {"classic control", "MinAtar", "Atari", "MuJoCo"} <= families
    assert len({p.env_id for p in presets.PRESETS if p.family == "Atari"}) >= 2
    assert len({p.env_id for p in presets.PRESETS if p.family == "MuJoCo"}) >= 2


def test_the_listing_names_an_extra_only_where_it_is_missing(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "Box2D" else real(name, *a))
    lines = {ln.split()[0]: ln for ln in presets.listing().splitlines()}
    assert 'needs the box2d extra: pip install -e ".[box2d]"' in lines["LunarLander-v3"]
    assert "needs" not in lines["CartPole-v1"]
    if importlib.util.find_spec("ale_py") is not None:
        assert "needs" not in lines["ALE/Pong-v5"]


def test_the_listing_says_what_ends_each_presets_run_as_the_readme_table_does():
    """`rqrl presets` shows each preset's stop value and budget, from its config file; the README's
    presets table (| env | algo | config | stop value | budget | ...) says the same."""
    assert presets.goal(presets.find("Acrobot-v1")) == "stop -100, 100k env steps"
    assert presets.goal(presets.find("CartPole-v1")) == "stop 195, 300 s"
    readme = (REPO / "README.md").read_text()
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^\| ([A-Za-z/0-9-]+-v\d) \| [^|]+ \| [^|]+ \| (-?\d+(?:\.\d+)?) \| ([^|]+) \|", readme, re.M)}
    listed = {ln.split()[0]: ln for ln in presets.listing().splitlines()}
    assert set(rows) == {p.env_id for p in presets.PRESETS}
    for env_id, (stop, budget) in rows.items():
        budget = "no budget" if budget.strip() == "none" else budget.strip()
        assert f"stop {stop}, {budget}" in listed[env_id], (env_id, listed[env_id])


def test_find_takes_the_envs_first_preset_without_algo_and_the_named_one_with_it():
    assert presets.find("CartPole-v1").config == "cartpole_dqn.py"
    assert presets.find("CartPole-v1", "ppo").config == "cartpole_ppo.py"
    assert presets.find("CartPole-v1", "PPO").config == "cartpole_ppo.py"
    assert presets.find("ALE/Breakout-v5", "ppo").config == "breakout_ppo.py"


def test_no_preset_is_one_error_listing_the_presets_with_the_closest_id():
    with pytest.raises(presets.NoPreset) as e:
        presets.find("Cartpole-v1")
    text = str(e.value)
    assert "did you mean 'CartPole-v1'?" in text
    assert all(p.env_id in text for p in presets.PRESETS)
    # Cartpole-v1 is no gymnasium id either: the config-file route is not suggested with it.
    assert "--set env.env_id=Cartpole-v1" not in text and "not with 'Cartpole-v1': " in text
    with pytest.raises(presets.NoPreset) as e:
        presets.find("Pong-v5")
    assert "did you mean 'ALE/Pong-v5'?" in str(e.value) and "env.env_id=Pong-v5" not in str(e.value)
    with pytest.raises(presets.NoPreset, match=r"--set env.env_id=Blackjack-v1 "):
        presets.find("Blackjack-v1")  # a registered env without a preset: the config-file route
    with pytest.raises(presets.NoPreset, match=r"not with 'Acrobot-v0': .*Acrobot-v1"):
        presets.find("Acrobot-v0")  # gymnasium's own word on a retired version
    with pytest.raises(presets.NoPreset, match=r"no 'sac' preset for --env 'Acrobot-v1' \(it has: dqn\)"):
        presets.find("Acrobot-v1", "sac")


def _rqrl(*argv: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=180)


def test_rqrl_train_env_algo_checks_the_preset_as_a_launch_would(tmp_path):
    res = _rqrl("train", "--env", "CartPole-v1", "--algo", "ppo", "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "preset for CartPole-v1: ppo, config" in res.stderr and "cartpole_ppo.py" in res.stderr
    assert "would start a run in ./cartpole_ppo/" in res.stdout
    assert list(tmp_path.iterdir()) == []  # a dry run creates nothing


def test_rqrl_train_refuses_a_config_and_env_together_or_neither(tmp_path):
    both = _rqrl("train", str(REPO / "deploy" / "configs" / "cartpole_dqn.py"), "--env", "CartPole-v1", "--dry-run",
                 cwd=tmp_path)
    assert both.returncode == 1 and "not both" in both.stderr
    neither = _rqrl("train", "--dry-run", cwd=tmp_path)
    assert neither.returncode == 1 and "--env ID" in neither.stderr and "Hopper-v5" in neither.stderr
    algo_alone = _rqrl("train", "--algo", "ppo", "--dry-run", cwd=tmp_path)
    assert algo_alone.returncode == 1 and "give --env too" in algo_alone.stderr
    unknown = _rqrl("train", "--env", "NoSuchEnv-v0", "--dry-run", cwd=tmp_path)
    assert unknown.returncode == 1 and unknown.stderr.startswith("config error: no preset for --env 'NoSuchEnv-v0'")



def test_the_run_folders_of_every_shipped_config_are_ignored_by_git():
    """`rqrl train deploy/configs/X.py` (or --env) in the checkout writes ./<exp_name>/...: none of it
    shows up in `git status`."""
    import shutil

    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    names = sorted(runpy.run_path(str(p))["main_config"]["exp_name"] for p in presets.CONFIG_DIR.glob("*.py"))
    paths = [f"{n}/20261130T021500Z-s0/summary.json" for n in names] + [f"{n}/latest" for n in names]
    res = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True)
    assert sorted(res.stdout.split()) == sorted(paths), set(paths) - set(res.stdout.split())
