"""Image observations on the full stack: the conv DQN and PPO learn ``LitCell-v0`` (a uint8 image env of
tests/fixtures/image_envs.py) through ``rqrl train`` with real rq workers and a private Redis, and a conv
torso that does not fit the image is refused at start in one line."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tests.conftest import REPO, run_rqrl

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.server_agnostic]

CONFIGS = {"dqn": str(REPO / "tests" / "fixtures" / "litcell_dqn.py"),
           "ppo": str(REPO / "tests" / "fixtures" / "litcell_ppo.py")}


@pytest.mark.timeout(900)  # a hang guard: the configs bound the runs by env steps
@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_conv_policy_learns_the_lit_cell_on_the_full_stack(tmp_path, algo):
    exp = f"litcell_{algo}_{os.getpid()}"
    t0 = time.monotonic()
    res = run_rqrl("train", CONFIGS[algo], "--set", f"exp_name={exp}", cwd=tmp_path, timeout=800)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
    assert summary["status"].startswith("converged"), summary
    # A random policy returns 2 of 8: 7 needs the lit band read from the pixels.
    assert float(summary["last_eval_reward_mean"]) >= 7.0
    bundle = torch.load(tmp_path / exp / "latest" / "final.pt", weights_only=True)
    assert bundle["spaces"]["obs_kind"] == "image" and bundle["spaces"]["obs_layout"] == "chw"
    assert any(k.endswith(".weight") and v.dim() == 4 for k, v in bundle["weights"].items())  # conv kernels
    print(f"{algo} LitCell: {elapsed:.1f} s launch to exit, {summary['envstep']} env steps, "
          f"{summary['train_iter']} train iters, last eval {summary['last_eval_reward_mean']}")


def test_a_conv_torso_larger_than_the_image_fails_at_start_in_one_line(tmp_path):
    res = run_rqrl("train", CONFIGS["dqn"], "--set", "env.env_kwargs={'size': 20}", cwd=tmp_path, timeout=60)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "policy.model.conv" in lines[0] and "(1, 20, 20)" in lines[0], res.stderr
    assert not (tmp_path / "litcell_dqn").exists()  # nothing was launched


@pytest.mark.timeout(120)
def test_a_replay_buffer_that_cannot_fit_ends_the_run_naming_replay_buffer_size(tmp_path):
    exp = f"litcell_oom_{os.getpid()}"
    res = run_rqrl("train", CONFIGS["dqn"], "--set", f"exp_name={exp}",
                   "--set", "policy.other.replay_buffer.replay_buffer_size=1000000000", cwd=tmp_path, timeout=100)
    assert res.returncode == 1, res.stdout + res.stderr[-3000:]
    summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
    reason = summary["status"]
    assert "MemoryBudgetError" in reason and "replay_buffer_size' = 1000000000 needs ~" in reason, reason
    assert "tasks failed in a row" not in reason  # fatal at once: no learner retried the same allocation
