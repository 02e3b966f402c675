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


def _plan(tmp_path, *args: str) -> list[str]:
    res = subprocess.run(["make", "-n", "-C", str(REPO), f"VENV={tmp_path / 'venv'}", *args], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    return [ln.rstrip() for ln in res.stdout.splitlines() if not ln.startswith("make")]


def test_the_first_make_train_makes_the_venv_torch_first_then_trains(tmp_path):
    lines = _plan(tmp_path, "train")
    venv = tmp_path / "venv"
    assert lines[0] == f"python3 -m venv {venv}"
    torch = next(i for i, ln in enumerate(lines) if 'pip install "torch==2.13.0"' in ln)
    rqrl = next(i for i, ln in enumerate(lines) if re.search(r'pip install -e "\.\[test,[a-z0-9,]*\]"', ln))
    assert torch < rqrl, lines
    for extra in ("test", "video", "box2d", "mujoco", "atari", "minatar", "dashboard"):
        assert extra in lines[rqrl]
    assert lines[-1] == f"{venv}/bin/rqrl train deploy/configs/cartpole_dqn.py"


def test_a_made_venv_is_reused_and_presets_and_args_pass_through(tmp_path):
    (tmp_path / "venv").mkdir()
    stamp = tmp_path / "venv" / ".rqrl-installed"
    stamp.touch()
    newer = (REPO / "pyproject.toml").stat().st_mtime + 10
    os.utime(stamp, (newer, newer))
    venv = tmp_path / "venv"
    assert _plan(tmp_path, "test") == [f"{venv}/bin/python -m pytest"]
    assert _plan(tmp_path, "train", "ENV=ALE/Breakout-v5", "ALGO=ppo") == [
        f"{venv}/bin/rqrl train --env ALE/Breakout-v5 --algo ppo"]
    assert _plan(tmp_path, "test", "ARGS=tests/unit -x") == [f"{venv}/bin/python -m pytest tests/unit -x"]
    # an older environment than pyproject.toml installs again
    os.utime(stamp, (newer - 3600, newer - 3600))
    assert any("pip install -e" in ln for ln in _plan(tmp_path, "test"))


def test_the_readme_and_ci_use_the_two_commands():
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## The two commands\n.*?```bash\n(.*?)```", readme, re.S).group(1)
    assert [ln.split("#")[0].strip() for ln in block.strip().splitlines()] == ["make train", "make test"]
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    # The README's command comes first, on the fresh clone's own .venv; no install or test before it.
    first = min(i for i, ln in enumerate(ci) if "pip install" in ln or "pytest" in ln or ln == "make test")
    assert ci[first] == "make test", ci
