"""Training-episode returns as they happen (issue 34): the shipped CartPole DQN run, short as it is
(~10-20 s, converging before most collector tasks end), has every finished training episode in
TensorBoard (``train/episode_return``, ``train/episode_length``) and in ``episodes.jsonl``, and
its progress line and summary carry their mean."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO, run_rqrl

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.server_agnostic]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def test_a_short_cartpole_run_logs_every_training_episode(tmp_path, redis_server):
    exp = f"episodes_{os.getpid()}"
    res = run_rqrl("train", CONFIG, "--set", f"exp_name={exp}", cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    out = tmp_path / exp / "latest"
    lines = [json.loads(ln) for ln in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(lines) >= 20 and all(d["length"] >= 1 and d["return"] == d["length"] for d in lines)  # CartPole: +1 a step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0}).Reload()  # 0: keep every point
    returns = acc.Scalars("train/episode_return")
    assert len(returns) == len(lines) == len(acc.Scalars("train/episode_length"))
    assert sorted((p.step, p.value) for p in returns) == sorted((d["envstep"], d["return"]) for d in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train_episodes"] == len(lines)
    closing = [ln for ln in res.stderr.replace("\r", "\n").splitlines() if ln.startswith("env steps")][-1]
    assert f"return {summary['train_return_mean']:>6.1f} |" in closing, closing
