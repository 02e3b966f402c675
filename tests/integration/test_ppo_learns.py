"""End to end for the algorithm seam: PPO trains CartPole, DQN trains Acrobot (3 actions read from the env),
and ``rqrl eval`` plays both final.pt files. Real processes, a private Redis, a tmp cwd."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import torch

from tests.conftest import REPO, run_rqrl

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.server_agnostic]

PPO_CONFIG = str(REPO / "deploy" / "configs" / "cartpole_ppo.py")
DQN_CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
RETURN_LINE = re.compile(r"^-?[0-9.]+ ± [0-9.]+ return over (\d+) episodes", re.M)


_rqrl = run_rqrl


def _eval(final_pt, cwd, episodes: int = 3) -> tuple[subprocess.CompletedProcess, float]:
    res = _rqrl("eval", str(final_pt), "--episodes", str(episodes), cwd=cwd, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    m = RETURN_LINE.search(res.stdout)
    assert m and int(m.group(1)) == episodes, res.stdout
    return res, float(res.stdout[m.start():].split()[0])


@pytest.mark.timeout(600)
def test_ppo_trains_cartpole_and_rqrl_eval_plays_it(tmp_path, redis_server):
    exp = f"ppo_e2e_{os.getpid()}"
    t0 = time.monotonic()
    res = _rqrl("train", PPO_CONFIG, "--seed", "0", "--set", f"exp_name={exp}", cwd=tmp_path, timeout=420)
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "converged" in res.stdout
    out = tmp_path / exp / "latest"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["status"].startswith("converged"), summary
    assert float(summary["last_eval_reward_mean"]) >= 195
    assert "learner_stale_chunks" in summary, summary
    if int(summary["learner_stale_chunks"]) == 0 and "learner_policy_lag_max" in summary:
        # Every chunk was ingested while its version was the one being trained: no lag at all.
        assert float(summary["learner_policy_lag_max"]) == 0.0, summary
    print(f"PPO CartPole seed 0: {elapsed:.1f} s launch to exit, {summary['envstep']} env steps, "
          f"{summary['train_iter']} train iters, stale chunks {summary['learner_stale_chunks']}")

    bundle = torch.load(out / "final.pt", weights_only=True)
    assert bundle["algorithm"] == "ppo" and bundle["env_id"] == "CartPole-v1"
    # final.pt holds exactly the weights the converging eval played (the eval task's own report).
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    converged = next(e for e in evals if e["task_id"] == summary["final_eval_task"])
    assert bundle["train_iter"] == converged["policy_version"]
    _, mean = _eval(out / "final.pt", tmp_path)
    print(f"rqrl eval of the PPO final.pt (train_iter {bundle['train_iter']}): {mean:.1f}")
    assert mean > 50  # trained (an untrained greedy policy scores ~10)


@pytest.mark.timeout(900)
def test_dqn_trains_acrobot_with_actions_read_from_the_env_and_rqrl_eval_plays_it(tmp_path, redis_server):
    """The README's Acrobot command, bounded by env steps (the run's work), not wall time: the
    wall limit is only a hang guard. Acrobot's 500-step episodes outlive the collector tasks'
    ends on the kept envs, as they must for DQN to learn it reliably."""
    exp = f"acrobot_e2e_{os.getpid()}"
    t0 = time.monotonic()
    res = _rqrl("train", DQN_CONFIG, "--set", f"exp_name={exp}", "--set", "env.env_id=Acrobot-v1",
                "--set", "env.stop_value=-100.0", "--set", "commander.max_wall_seconds=0.0",
                "--set", "commander.max_env_step=150000", cwd=tmp_path, timeout=850)
    elapsed = time.monotonic() - t0
    out = tmp_path / exp / "latest"
    summary = json.loads((out / "summary.json").read_text()) if (out / "summary.json").exists() else {}
    print(f"DQN Acrobot: exit {res.returncode} after {elapsed:.1f} s, last eval {summary.get('last_eval_reward_mean')}, "
          f"{summary.get('envstep')} env steps")
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert float(summary["last_eval_reward_mean"]) >= -100

    bundle = torch.load(out / "final.pt", weights_only=True)
    assert bundle["algorithm"] == "dqn" and bundle["env_id"] == "Acrobot-v1"
    assert bundle["spaces"]["action_n"] == 3
    assert bundle["config"]["policy"]["model"]["action_shape"] == 3
    # The dueling head has one output per env action.
    assert tuple(bundle["weights"]["advantage.weight"].shape)[0] == 3
    # final.pt is the policy version the converging eval played and its confirmation replayed.
    evals = [json.loads(line) for line in (out / "evals.jsonl").read_text().splitlines()]
    converged = next(e for e in evals if e["task_id"] == summary["final_eval_task"])
    assert bundle["train_iter"] == converged["policy_version"] == summary["final_policy_version"]
    _, mean = _eval(out / "final.pt", tmp_path, episodes=5)
    print(f"rqrl eval of the Acrobot final.pt (train_iter {bundle['train_iter']}): {mean:.1f}")
    assert mean > -300  # trained: an untrained policy scores -500 (it never reaches the line)
