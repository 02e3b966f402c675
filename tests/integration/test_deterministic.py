"""``rqrl train --deterministic``: the same seed gives the same run (issue 34's done-when: identical
evals.jsonl rewards), through real RQ workers, Redis and the learner's lockstep with the collector."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO, run_rqrl

# Bounded by env steps (commander.max_env_step); the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.server_agnostic, pytest.mark.timeout(600)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _run(tmp_path, seed: int, name: str, config: str = CONFIG) -> tuple[list, list]:
    exp = f"det_{os.getpid()}"
    res = run_rqrl("train", config, "--deterministic", "--seed", str(seed), "--name", name,
                   "--set", f"exp_name={exp}", "--set", "env.stop_value=1e9", "--set", "commander.max_env_step=4000",
                   "--set", "commander.max_wall_seconds=0", "--set", "commander.eval_every_env_step=2000",
                   "--set", "policy.collect.collector.task_env_steps=1000", cwd=tmp_path, timeout=540)
    assert res.returncode == 2, res.stdout + res.stderr[-3000:]  # the budget, as asked
    run = tmp_path / exp / name
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    return ([(e["envstep"], e["policy_version"], e["reward_mean"], e["reward_std"]) for e in evals],
            [(e["envstep"], e["return"], e["length"]) for e in episodes])


def test_the_same_seed_twice_gives_the_same_evals_and_episodes_and_another_seed_does_not(tmp_path):
    evals, episodes = _run(tmp_path, 3, "a")
    again = _run(tmp_path, 3, "b")
    # Evals every 2,000 env steps, the closing one at the budget: at the same env steps, of the same
    # policy versions, with the same rewards; every training episode the same.
    assert [e[0] for e in evals] == [2000, 4000], evals
    assert (evals, episodes) == again
    other = _run(tmp_path, 4, "c")
    assert other != (evals, episodes)


def test_the_same_seed_gives_the_same_ppo_run(tmp_path):
    """The on-policy data path (collectors wait for each new policy version) repeats too."""
    config = str(REPO / "deploy" / "configs" / "cartpole_ppo.py")
    first = _run(tmp_path, 3, "p1", config)
    assert [e[0] for e in first[0]] == [2000, 4000], first[0]
    assert _run(tmp_path, 3, "p2", config) == first
