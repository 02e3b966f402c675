"""``rqrl train --resume``: a run stopped by its budget continues from its last checkpoint (train
iteration, env steps, eval history), its private Redis long gone."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO, run_rqrl, wait_gone

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
# Evals by env steps and every 2 s. Budgets: training starts at replay_start_size (256) env steps
# and collectors lead the learner by max_env_step_lead (256), so 1,000 env steps give ~240 train
# iterations; the resumed learner refills 256 env steps before it trains again, then gains 0.5 an env step.
SMALL = ["--set", "env.stop_value=100000", "--set", "commander.eval_every_train_iter=0",
         "--set", "commander.eval_every_env_step=150", "--set", "commander.eval_interval=2.0", "--set", "policy.learn.learner.hook.save_ckpt_after_iter=50",
         "--set", "commander.max_wall_seconds=120", "--collectors", "1"]


def test_a_stopped_run_resumes_from_its_checkpoint(tmp_path):
    first = run_rqrl("train", CONFIG, "--seed", "4", "--set", "commander.max_env_step=1000", *SMALL, cwd=tmp_path)
    assert first.returncode == 2, first.stdout + first.stderr[-3000:]
    run = (tmp_path / "cartpole_dqn" / "latest").resolve()
    before = json.loads((run / "summary.json").read_text())
    point = json.loads((run / "resume.json").read_text())
    evals_before = (run / "evals.jsonl").read_text().splitlines()
    assert point["ckpt_train_iter"] > 0 and evals_before

    # The seed comes from the run; a larger budget lets it go on.
    second = run_rqrl("train", CONFIG, "--resume", run.name, "--set", "commander.max_env_step=2400", *SMALL,
                      cwd=tmp_path)
    assert second.returncode == 2, second.stdout + second.stderr[-3000:]
    assert [p.name for p in (tmp_path / "cartpole_dqn").iterdir() if not p.is_symlink()
            and p.name != "tensorboard"] == [run.name]
    after = json.loads((run / "summary.json").read_text())
    assert after["run_id"] == before["run_id"] and after["envstep"] >= 2400 > before["envstep"]
    assert after["train_iter"] > before["train_iter"]
    # The learner started from the copied checkpoint, not from 0.
    learner_log = (run / "log" / "learner" / "learner.txt").read_text()
    loaded = [int(m) for m in re.findall(r"loaded checkpoint 'latest': train_iter (\d+)", learner_log)]
    assert loaded == [point["ckpt_train_iter"]], learner_log[-2000:]
    # One eval history: the first part unchanged, the rest after the checkpoint, in order.
    evals_after = (run / "evals.jsonl").read_text().splitlines()
    assert evals_after[:len(evals_before)] == evals_before and len(evals_after) > len(evals_before)
    new = [json.loads(x) for x in evals_after[len(evals_before):]]
    old_last = json.loads(evals_before[-1])
    assert all(e["run_id"] == before["run_id"] for e in new)
    assert all(e["policy_version"] >= point["ckpt_train_iter"] and e["envstep"] >= old_last["envstep"] for e in new)
    assert wait_gone(str(tmp_path), in_cwd=True) == []  # curve.png is drawn after rqrl train returned
    assert (run / "curve.png").is_file() and (run / "final.pt").is_file()


def test_resume_refuses_what_it_cannot_continue(tmp_path):
    res = run_rqrl("train", CONFIG, "--resume", "nosuch", cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and "--resume: no run folder 'nosuch'" in res.stderr, res.stderr
    (tmp_path / "cartpole_dqn" / "r0").mkdir(parents=True)
    res = run_rqrl("train", CONFIG, "--resume", "r0", cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and "resume.json does not exist" in res.stderr, res.stderr
    # A converged run is over: resuming it would train on and replace its final.pt.
    (tmp_path / "cartpole_dqn" / "r0" / "resume.json").write_text('{"seed": 0}')
    (tmp_path / "cartpole_dqn" / "r0" / "summary.json").write_text('{"exit_code": 0}')
    res = run_rqrl("train", CONFIG, "--resume", "r0", cwd=tmp_path, timeout=60)
    assert res.returncode == 1 and "converged" in res.stderr and "start a new run" in res.stderr, res.stderr
