"""Training that diverges to NaN: the learner stops at the first non-finite value, nothing
non-finite is published or exported, the run ends with that reason, ``rqrl eval`` refuses NaN."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from common import blobstore, keys, serialization
from common.connection import connect
from common.finite import NonFiniteError, check_arrays
from tests.conftest import REPO, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def _rqrl(*args, cwd, env, timeout=180):
    return subprocess.run([sys.executable, "-m", "coordinator.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_diverging_run_stops_at_the_first_nan_and_publishes_none(tmp_path, redis_server):
    exp = f"nan_{os.getpid()}"
    conn = connect(redis_server.url)
    conn.flushall()
    env = worker_env(redis_server.url)
    res = _rqrl("train", CONFIG, "--redis-url", redis_server.url, "--set", f"exp_name={exp}",
                "--set", "policy.learn.learning_rate=1e12", "--set", "policy.learn.grad_clip_norm=0.0",
                "--set", "commander.max_wall_seconds=90", "--collectors", "1", cwd=tmp_path, env=env)
    summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
    reason = summary["status"]
    exp = keys.namespace(exp, summary["run_name"])  # the run's keys
    assert res.returncode == 1, res.stdout + res.stderr[-3000:]
    assert "NonFiniteError: train iter" in reason and "non-finite" in reason, reason
    stopped_at = int(reason.split("train iter ")[1].split(":")[0])
    # Every policy a collector could read and every checkpoint is finite and older than the NaN.
    got = blobstore.get_versioned(conn, keys.policy(exp, summary["policy_id"]))
    assert got is not None and int(got[0]["version"]) < stopped_at
    check_arrays(serialization.loads(got[1]), "published policy")
    for name in ("latest", "final", "final_model"):
        ckpt = blobstore.get_versioned(conn, keys.ckpt(exp, name))
        if ckpt is not None:
            import io
            check_arrays(torch.load(io.BytesIO(ckpt[1]), weights_only=True), name)
    final = tmp_path / exp / "latest" / "final.pt"
    if final.exists():
        check_arrays(torch.load(final, weights_only=True), "final.pt")
    # One learner failure ended the run: no replacement learner retried the same divergence.
    assert "1 tasks failed in a row" not in reason


def test_rqrl_eval_refuses_non_finite_weights(tmp_path):
    from common import spaces
    from common.config import compile_config
    from common.policy import create_policy, export

    cfg = compile_config({"exp_name": "e"})
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    bundle = export.bundle(create_policy(cfg, spec, modes=("eval",), device="cpu"), 3)
    name = sorted(bundle["weights"])[0]
    bundle["weights"][name][0] = float("nan")
    torch.save(bundle, tmp_path / "final.pt")
    res = _rqrl("eval", str(tmp_path / "final.pt"), "--episodes", "1", cwd=tmp_path, env=dict(os.environ))
    assert res.returncode == 1
    assert f"non-finite weight {name}" in res.stderr and "refusing to evaluate" in res.stderr, res.stderr


def test_step_check_names_the_iteration_and_tensor():
    from common import spaces
    from common.config import compile_config
    from common.policy import create_policy

    cfg = compile_config({"exp_name": "e"})
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    policy = create_policy(cfg, spec, modes=("learn",), device="cpu")
    from common.finite import StepCheck

    # One check, built before the gradients exist, as the learner's: it reads them at each call.
    check = StepCheck(policy)
    with pytest.raises(NonFiniteError, match="train iter 7: non-finite total_loss = nan"):
        check({"total_loss": float("nan")}, 7)
    p = next(policy.model.parameters())
    p.grad = torch.full_like(p, float("inf"))
    with pytest.raises(NonFiniteError, match=r"train iter 8: non-finite gradient model\.\S+ \("):
        check({"total_loss": 1.0}, 8)
    for q in policy.model.parameters():  # an iteration that stepped every weight of the model
        q.grad = torch.zeros_like(q)
    last_name, last = list(policy.model.named_parameters())[-1]
    last.grad.view(-1)[-1] = float("nan")  # the last tensor's last value: every gradient is looked at
    with pytest.raises(NonFiniteError, match=rf"train iter 9: non-finite gradient model\.{last_name} \(1 of"):
        check({"total_loss": 1.0}, 9)
    last.grad = None
    with torch.no_grad():
        last[0] = float("nan")
    check({"total_loss": 1.0}, 10)  # weights are left to check_arrays, where they leave the learner
    with pytest.raises(NonFiniteError, match=rf"non-finite weight {last_name}"):
        check_arrays({k: v.detach() for k, v in policy.model.state_dict().items()}, "published policy")
    check_arrays({"a": np.ones(3, np.float32), "n": {"b": [1.0, 2]}, "i": np.arange(3)}, "fine")
    # Finite values whose sum overflows float32 are finite: the check looks closer and passes.
    with torch.no_grad():
        last[0] = 0.0
    for q in policy.model.parameters():
        q.grad = torch.full_like(q, 3e38)
    check({"total_loss": 1.0}, 11)
    p.grad.view(-1)[0] = float("-inf")  # an inf beside values that overflow is still named
    with pytest.raises(NonFiniteError, match=r"train iter 12: non-finite gradient model\.\S+ \(1 of"):
        check({"total_loss": 1.0}, 12)
