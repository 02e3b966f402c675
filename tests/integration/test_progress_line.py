"""The progress line of ``rqrl train`` (coordinator/progress.py), driven through a pseudo-terminal
as a user sees it and through a pipe as a log file does: rates and time left while the run goes,
and a closing line whose rates are summary.json's figures (env steps and train iterations over
the run's wall seconds).

One real run each: a private redis-server, the coordinator and real ``rq worker`` processes
forked by ``rqrl train``, CartPole DQN stopped by an env-step budget.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from tests.conftest import REPO, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
BUDGET = 3000  # env steps (commander.max_env_step): the run stops there, exit 2
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LIVE = re.compile(r"([\d,]+) env steps/s, ([\d,.]+) train iter/s \| ~(\S+) left \(max_env_step 3,000\)")
FIGURES = re.compile(r"env steps +([\d,]+) \| train iter +([\d,]+) \| eval .* \| +([\d.]+) s")
AVG = re.compile(r"avg ([\d,]+) env steps/s, ([\d,.]+) train iter/s")


def _argv(url: str) -> list[str]:
    return [sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", url, "--collectors", "1",
            "--set", "env.stop_value=100000", "--set", f"commander.max_env_step={BUDGET}",
            "--set", "commander.max_wall_seconds=0", "--set", "commander.eval_every_train_iter=500",
            "--set", "policy.learn.learner.send_info_freq=10"]


_HALF_TENTH = 0.05 + 1e-9


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _check_final(figures: str, avg: str, run_dir) -> None:
    """The closing line's figures and rates are summary.json's."""
    summary = json.loads((run_dir / "summary.json").read_text())
    m, a = FIGURES.search(figures), AVG.search(avg)
    assert m and a, (figures, avg)
    envstep, train_iter, secs, env_rate, iter_rate = (_number(g) for g in (*m.groups(), *a.groups()))
    assert (envstep, train_iter) == (summary["envstep"], summary["train_iter"])
    # Printed rounded (to 0.1 s, 1 env step/s and 0.1 train iterations/s): off by at most half the last
    # digit, plus the float error of that half (12.75 prints as 12.8, and 12.8 - 12.75 > 0.05 in binary).
    assert secs == pytest.approx(summary["wall_seconds"], abs=_HALF_TENTH)
    assert summary["envstep"] >= BUDGET
    assert env_rate == pytest.approx(summary["envstep"] / summary["wall_seconds"], abs=0.5 + 1e-9)
    assert iter_rate == pytest.approx(summary["train_iter"] / summary["wall_seconds"], abs=_HALF_TENTH)


def test_on_a_terminal_the_line_is_drawn_in_place_with_rates_and_time_left(tmp_path, real_redis, redis_server):
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a terminal's usual 80 columns
    env = dict(worker_env(""), TERM="xterm-256color")
    proc = subprocess.Popen(_argv(redis_server.url), cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, env=env,
                            close_fds=True)
    os.close(slave)
    raw = b""
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal's other end has closed it
                    break
                if not chunk:
                    break
                raw += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = raw.decode(errors="replace")
    assert code == 2, text[-3000:]
    # rich hides the cursor while the line is live; the closing line shows it again.
    assert "\x1b[?25l" in text and "\x1b[?25h" in text[text.rindex("\x1b[?25l"):]
    # Drawn in place: each state of the line (two lines on 80 columns) rewritten over the last.
    assert text.count("\x1b[2K") >= 6
    states = [ANSI.sub("", s).strip() for s in re.split(r"[\r\n]", text)]
    ours = [s for s in states if FIGURES.search(s) or "env steps/s" in s]
    assert all(len(s) <= 80 for s in ours) and "\u2026" not in text, "nothing is cut off or wrapped"
    live = [LIVE.search(s) for s in states if LIVE.search(s)]
    assert len(live) >= 3, states[-20:]
    rates = [(_number(m.group(1)), _number(m.group(2))) for m in live]
    assert any(env_rate > 0 and iter_rate > 0 for env_rate, iter_rate in rates), rates
    # The closing state: the last figures and the average rates (rich draws it again as it stops).
    figures = [s for s in states if FIGURES.search(s)]
    avg = [s for s in states if AVG.search(s)]
    assert avg and len(set(avg)) == 1, avg
    _check_final(figures[-1], avg[-1], (tmp_path / "cartpole_dqn" / "latest").resolve())


def test_without_a_terminal_the_line_is_plain_text_with_the_same_rates(tmp_path, real_redis, redis_server):
    res = subprocess.run(_argv(redis_server.url), cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=worker_env(""))
    assert res.returncode == 2, res.stderr[-3000:]
    assert "\x1b" not in res.stderr and "\r" not in res.stderr
    lines = res.stderr.splitlines()
    final = [ln for ln in lines if AVG.search(ln)]
    assert len(final) == 1, lines[-10:]
    _check_final(final[0], final[0], (tmp_path / "cartpole_dqn" / "latest").resolve())
