"""Data-parallel learner groups (workers/ddp.py): real Redis, real processes, real gloo."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
import torch

from common import keys, streams
from common.connection import connect
from tests.conftest import REPO, worker_env
from tests.fixtures import ddp_rank
from tests.fixtures.ddp_rank import TinyPolicy, data
from workers.ddp import GroupError, join

# The runs are bounded by env steps; the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.timeout(900), pytest.mark.server_agnostic]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


def test_two_ranks_average_gradients_start_alike_and_stop_together(redis_server):
    # Reference in one process: rank 0's init, SGD on the mean of both ranks' losses (the mean of
    # their gradients, as the batches are the same size). Computed first, so the forked ranks
    # find torch.optim's lazy imports done (seconds on a busy machine).
    ref = TinyPolicy(seed=0)
    batches = [data(0), data(1)]
    for _ in range(4):
        ref.optimizer.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(ref.model(x), y) for x, y in batches) / 2
        loss.backward()
        ref.optimizer.step()
    expected = torch.cat([p.detach().reshape(-1) for p in ref.model.parameters()])
    gid = f"g{uuid.uuid4().hex[:8]}"
    # Forked; rank 1's source runs dry after 4 batches, rank 0's never: both must train exactly 4 steps.
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=ddp_rank.main, args=(redis_server.url, gid, rank, 4 if rank else 1000, pipes[rank][1]))
             for rank in (0, 1)]
    for p in procs:
        p.start()
    outs = []
    for p, (recv, _) in zip(procs, pipes):
        assert recv.poll(60), "a rank sent no result within 60 s"
        outs.append(recv.recv())
        p.join(10)
        assert p.exitcode == 0
    assert [o["steps"] for o in outs] == [4, 4]
    for o in outs:
        assert torch.allclose(torch.tensor(o["weights"]), expected, atol=1e-5), (o, expected)
    # Rank 1 started from another init (seed 1): only the broadcast makes it match.
    assert not torch.allclose(TinyPolicy(seed=1).model.weight, TinyPolicy(seed=0).model.weight)


def test_a_rank_without_rank_0_fails_in_time_naming_the_key(real_redis):
    t0 = time.monotonic()
    with pytest.raises(GroupError, match=r"rank 0 published no address on rqrl:ddp_test:learner_group:g1 within 1 s"):
        join(real_redis, "ddp_test", "g1", 1, 2, 1.0, torch.device("cpu"))
    assert time.monotonic() - t0 < 5


def test_a_rank_of_another_world_size_is_refused(real_redis):
    real_redis.rpush(keys.learner_group("ddp_test", "g2"), "127.0.0.1:1 3")
    with pytest.raises(GroupError, match="group of 3 ranks.*expects 2"):
        join(real_redis, "ddp_test", "g2", 1, 2, 1.0, torch.device("cpu"))


def _events(conn, exp: str) -> list[dict]:
    return [streams.decode_fields(raw) for _, raw in conn.xrange(keys.events(exp))]


@pytest.mark.slow
def test_rqrl_train_with_two_learners_converges_and_survives_a_lost_rank(tmp_path, redis_server):
    """CartPole with learner_num=2 to stop_value 150; rank 1 is killed once it has trained, so
    the group restarts from checkpoint 'latest' and still converges."""
    exp = f"ddp_{os.getpid()}"
    ns = keys.namespace(exp, "r")  # the run's key namespace (--name r)
    conn = connect(redis_server.url)
    args = [sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", redis_server.url, "--name", "r",
            "--set", f"exp_name={exp}", "--set", "env.stop_value=150", "--seed", "1",
            "--set", "policy.learn.learner_num=2", "--set", "commander.max_wall_seconds=0",
            "--set", "commander.max_env_step=60000",
            "--set", "policy.learn.learner.hook.save_ckpt_after_iter=100"]
    proc = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=worker_env(""))
    killed, rank1, trained, last = None, None, False, b"0"
    try:
        deadline = time.monotonic() + 600  # a hang guard: the run is bounded by env steps
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            for _, entries in conn.xread({keys.events(ns): last}, block=500) or []:
                for last, raw in entries:
                    ev = streams.decode_fields(raw)
                    if ev.get("type") == "started" and ev.get("rank") == 1:
                        rank1 = ev
                    # Rank 0 has trained past checkpoint 'latest' at iteration 100.
                    trained |= ev.get("type") == "learner_info" and int(ev.get("train_iter", 0)) >= 150
            if trained and rank1 is not None:
                killed = rank1
                os.kill(int(killed["pid"]), signal.SIGKILL)  # rank 1's work-horse: the group loses a rank
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert killed is not None, "rank 1 never started or never trained: " + err[-3000:]
    assert proc.returncode == 0, out + err[-3000:]
    summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["last_eval_reward_mean"] >= 150
    coord_log = (tmp_path / exp / "latest" / "log" / "coordinator.log").read_text()
    assert "dropped with its group" in coord_log, coord_log[-3000:]
    evs = _events(conn, ns)
    started = [e for e in evs if e.get("type") == "started" and e.get("task_type") == "learner"]
    # Two groups of two ranks: the first, then the replacement after the kill.
    assert sorted(e["rank"] for e in started) == [0, 0, 1, 1], started
    # The replacement resumed from checkpoint 'latest' (iteration >= 100) rather than from scratch.
    first_rank0 = next(e["task_id"] for e in started if e["rank"] == 0)
    second = [int(e["train_iter"]) for e in evs if e.get("type") == "learner_info" and e["task_id"] != first_rank0]
    assert second and min(second) >= 100, second
    rank0_log = (tmp_path / exp / "latest" / "log" / "learner" / "learner.txt").read_text()
    assert "loaded checkpoint 'latest'" in rank0_log, rank0_log[-2000:]
