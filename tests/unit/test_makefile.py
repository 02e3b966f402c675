"""The README's two commands, `make train` and `make test`, do the whole set-up (Makefile): a
virtual environment made on first use, torch installed before rqrl, reused after; `.ci/run` runs
the README's test command. Checked with `make -n` (what make would run), nothing installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


_OUTER_MAKE = {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES",
               "ARGS", "ENV", "ALGO", "CONFIG", "PYTHON", "VENV", "TORCH", "EXTRAS"}


def _plan(tmp_path, *args: str) -> list[str]:
    # Under `make test ARGS=...` the outer make's command-line variables reach this nested make
    # (through MAKEFLAGS and the environment): the plan asked for here must be a user's first call's.
    env = {k: v for k, v in os.environ.items() if k not in _OUTER_MAKE}
    res = subprocess.run(["make", "-n", "-C", str(REPO), f"VENV={tmp_path / 'venv'}", *args], capture_output=True,
                         text=True, timeout=30, env=env)
    assert res.returncode == 0, res.stderr
    return [ln.rstrip() for ln in res.stdout.splitlines() if not ln.startswith("make")]


def _install_line(lines: list[str]) -> int:
    return next(i for i, ln in enumerate(lines) if re.search(r'pip install -e "\.(\[[a-z0-9,]*\])?"', ln))


def test_the_first_make_train_makes_the_venv_torch_first_then_installs_only_what_the_preset_needs(tmp_path):
    lines = _plan(tmp_path, "train")
    venv = tmp_path / "venv"
    assert lines[0] == f"python3 -m venv {venv}"
    torch = next(i for i, ln in enumerate(lines) if 'pip install "torch==2.13.0"' in ln)
    rqrl = _install_line(lines)
    assert torch < rqrl, lines
    assert lines[rqrl].endswith('pip install -e "."'), lines  # CartPole: no MuJoCo, ALE, Box2D
    assert lines[-1] == f"{venv}/bin/rqrl train deploy/configs/cartpole_dqn.py"
    for target, extra in (("ENV=LunarLander-v3", "box2d"), ("ENV=ALE/Pong-v5", "atari"),
                          ("CONFIG=deploy/configs/hopper_sac.py", "mujoco")):
        plan = _plan(tmp_path, "train", target)
        assert plan[_install_line(plan)].endswith(f'pip install -e ".[{extra}]"'), (target, plan)


def test_the_first_make_test_installs_the_test_set(tmp_path):
    lines = _plan(tmp_path, "test")
    rqrl = _install_line(lines)
    for extra in ("test", "video", "box2d", "mujoco", "atari", "minatar", "dashboard"):
        assert extra in lines[rqrl]
    assert lines[-1] == f"{tmp_path / 'venv'}/bin/python -m pytest"


def _stamps(tmp_path, *names: str, age_s: float = -10) -> None:
    """Stamp files ``names`` in the venv, ``age_s`` seconds older than pyproject.toml (negative: newer)."""
    (tmp_path / "venv").mkdir(exist_ok=True)
    t = (REPO / "pyproject.toml").stat().st_mtime - age_s
    for i, name in enumerate(names):
        (tmp_path / "venv" / name).touch()
        os.utime(tmp_path / "venv" / name, (t + i, t + i))  # each later than the one before


def test_a_made_venv_is_reused_and_presets_and_args_pass_through(tmp_path):
    _stamps(tmp_path, ".rqrl-venv", ".rqrl-installed")
    venv = tmp_path / "venv"
    assert _plan(tmp_path, "test") == [f"{venv}/bin/python -m pytest"]
    assert _plan(tmp_path, "test", "ARGS=tests/unit -x") == [f"{venv}/bin/python -m pytest tests/unit -x"]
    # An environment made by make test has every extra: make train installs nothing more.
    plan = _plan(tmp_path, "train", "ENV=ALE/Breakout-v5", "ALGO=ppo")
    assert plan[-1] == f"{venv}/bin/rqrl train --env ALE/Breakout-v5 --algo ppo"
    assert plan[0].startswith(f"[ {venv}/.rqrl-installed -nt {venv}/.rqrl-venv ] ||"), plan
    _stamps(tmp_path, ".rqrl-venv", ".rqrl-train-atari")
    assert _plan(tmp_path, "train", "ENV=ALE/Breakout-v5", "ALGO=ppo") == [
        f"{venv}/bin/rqrl train --env ALE/Breakout-v5 --algo ppo"]
    # an older environment than pyproject.toml installs again
    _stamps(tmp_path, ".rqrl-venv", ".rqrl-installed", age_s=3600)
    assert any("pip install -e" in ln for ln in _plan(tmp_path, "test"))


def test_the_readme_and_ci_use_the_two_commands():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## The two commands\n.*?```bash\n(.*?)```", readme, re.S).group(1)
    assert [ln.split("#")[0].strip() for ln in block.strip().splitlines()] == ["make train", "make test"]
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    # The README's command comes first, on the fresh clone's own .venv; no install or test before it.
    first = min(i for i, ln in enumerate(ci) if "pip install" in ln or "pytest" in ln or ln == "make test")
    assert ci[first] == "make test", ci
