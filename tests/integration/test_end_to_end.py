"""End to end: real processes, real Redis, real CartPole training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.connection import connect
from tests.conftest import (REPO, kill_leftovers, rq_bin, run_rqrl, stop_workers, wait_event, wait_gone,
                            worker_env)

# The runs are bounded by env steps; the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


_rqrl = run_rqrl


def test_rqrl_train_converges_and_leaves_nothing_behind(tmp_path, redis_server):
    exp = f"e2e_{os.getpid()}"
    # Short collector tasks, so some finish (and log collector scalars) before convergence.
    res = _rqrl("train", CONFIG, "--set", f"exp_name={exp}", "--set", "env.stop_value=150", "--seed", "1",
                "--set", "commander.max_wall_seconds=0", "--set", "commander.max_env_step=60000",
                "--set", "policy.collect.collector.task_env_steps=200", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    assert "converged" in res.stdout
    out = tmp_path / exp / "latest"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["last_eval_reward_mean"] >= 150
    # The phases the run recorded (unix seconds, common/phases.py), in the order each causes the next.
    ph = summary["phases"]
    for chain in (("launch", "redis_up", "first_policy", "first_train_step"),
                  ("first_policy", "first_eval", "passing_eval", "final_pt"), ("launch", "workers_up")):
        assert all(ph[a] <= ph[b] for a, b in zip(chain, chain[1:])), (chain, ph)
    # The closing progress line carries the summary's numbers (one set of figures per run).
    closing = [ln for ln in res.stderr.replace("\r", "\n").splitlines() if ln.startswith("env steps")][-1]
    assert f"{summary['envstep']:,} | train iter {summary['train_iter']:>7,}" in closing, (closing, summary)
    # Exactly the weights the converging eval played; best.pt beside it.
    final = torch.load(out / "final.pt", weights_only=True)
    assert final["algorithm"] == "dqn" and final["spaces"]["action_n"] == 2
    assert final["train_iter"] == summary["final_policy_version"] and (out / "best.pt").is_file()
    # `rqrl curve` after the run, whose private Redis is gone: from the run folder.
    curve = _rqrl("curve", "--exp", exp, "--out", str(tmp_path / "again.png"), cwd=tmp_path)
    assert curve.returncode == 0 and "evals" in curve.stdout, curve.stdout + curve.stderr
    assert (tmp_path / "again.png").stat().st_size > 1000
    assert "encoder.0.weight" in final["weights"] and final["weights"]["encoder.0.weight"].device.type == "cpu"
    assert final["train_iter"] > 0
    # curve.png is drawn after summary.json, and the children stop, after rqrl train returned.
    assert wait_gone(exp) == [], "child processes outlived rqrl train's teardown"
    assert (out / "curve.png").stat().st_size > 1000
    # TensorBoard: the seed's scalar names, read back from the run's one event file (the
    # learner's scalars travel to it through Redis).
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard")).Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("collector_iter/reward_mean", "collector_step/avg_step_per_episode", "evaluator_iter/reward_mean",
                "evaluator_step/reward_mean", "collector_iter/avg_time_per_episode"):
        assert tag in tags, (tag, tags)
    assert {"learner_iter/total_loss", "learner_step/q_value", "learner_iter/cur_lr"} <= tags
    assert acc.Scalars("learner_iter/total_loss")[-1].step > 0


def test_by_hand_coordinator_and_stock_rq_workers(tmp_path, redis_server):
    """The multi-terminal recipe of the README with plain `rq worker` (no -w; -S for rqrl's JSON
    job payloads, README "Security"): the stock forking
    worker rebuilds envs at every task, so 50-step tasks per env cut CartPole's episodes, and the
    run still converges; each collector worker's log says once that it cannot keep envs."""
    url = redis_server.url
    conn = connect(url)
    conn.flushall()
    exp = f"byhand_{os.getpid()}"
    env = worker_env(url)
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    workers = [subprocess.Popen([rq_bin(), "worker", q, "--url", url, "--name", f"{exp}-{q}-{i}",
                                 "-S", "rq.serializers.JSONSerializer"], env=env, cwd=tmp_path,
                                stdout=open(logs[i], "wb"), stderr=subprocess.STDOUT)
               for i, q in enumerate(["learner", "collector", "collector"])]
    try:
        coord = subprocess.run([sys.executable, "-m", "coordinator", CONFIG, "--redis-url", url, "--set", f"exp_name={exp}",
                                "--set", "env.stop_value=120", "--set", "commander.max_wall_seconds=0",
                                "--set", "commander.max_env_step=60000",
                                "--set", "policy.collect.collector.task_env_steps=400"],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert coord.returncode == 0, coord.stdout + coord.stderr[-3000:]
        # Readable metadata on the buffer stream, as `redis-cli XRANGE` shows it.
        summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
        entries = conn.xrange(f"rqrl:{exp}/{summary['run_name']}:buffer:{summary['buffer_id']}:meta", count=1)
        fields = {k.decode(): v.decode() for k, v in entries[0][1].items()}
        assert {"data_id", "policy_version", "n_samples", "env_steps"} <= set(fields)
        assert int(fields["n_samples"]) > 0
        for w in workers:  # RQ's warm shutdown: a worker ends once its job has (the learner's may still save)
            w.send_signal(signal.SIGTERM)
        for w in workers:
            w.wait(timeout=180)  # a hang guard: a loaded box (CI beside two soaks) once needed more than 20 s
        for log in logs[1:]:  # the collector workers
            text = log.read_text()
            assert text.count("envs are built and reset at every task") == 1, text[-3000:]
    finally:
        stop_workers(workers)


def test_limit_without_convergence_exits_2_and_a_rerun_starts_fresh(tmp_path, redis_server):
    exp = f"limit_{os.getpid()}"
    # Twice against the same Redis: the second run must not mistake the first run's stop flag for its own.
    for attempt in range(2):
        res = _rqrl("train", CONFIG, "--redis-url", redis_server.url, "--set", f"exp_name={exp}",
                    "--set", "commander.max_train_iter=50", "--set", "commander.eval_every_train_iter=0",
                    "--set", "commander.eval_interval=0.0", cwd=tmp_path, timeout=120)
        assert res.returncode == 2, (attempt, res.stdout + res.stderr[-3000:])
        assert "max_train_iter 50 reached without convergence" in res.stdout
        assert "exited with code" not in res.stderr  # no false alarms about workers we stopped
        assert wait_gone(exp) == []


def test_a_run_that_ends_on_its_env_step_budget_has_its_last_eval_at_the_budget(tmp_path, redis_server):
    """Issue 34's done-when at a quarter of its 20,000 env steps (the closing eval is the same at
    any budget): an unreachable stop value, so the run stops on max_env_step, with a closing eval."""
    exp = f"closing_{os.getpid()}"
    res = _rqrl("train", CONFIG, "--redis-url", redis_server.url, "--set", f"exp_name={exp}",
                "--set", "commander.max_env_step=5000", "--set", "env.stop_value=100000",
                "--set", "commander.max_wall_seconds=0", cwd=tmp_path, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr[-3000:]
    run = tmp_path / exp / "latest"
    evals = [json.loads(ln) for ln in (run / "evals.jsonl").read_text().splitlines() if ln.strip()]
    assert evals[-1]["envstep"] >= 5000, evals
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval"]["task_id"] == evals[-1]["task_id"] and summary["final_eval"]["closing"] is True
    assert summary["final_eval"]["envstep"] >= 5000 and summary["exit_code"] == 2
    assert f"the closing eval at {summary['final_eval']['envstep']} env steps" in res.stdout, res.stdout


# rqrl train's stop is bounded by design: the coordinator's wrap-up (closing eval at most 10 s,
# the learner's last report at most 10 s) within 30 s, then at most 15 s of grace and 5 s after
# SIGKILL for its children. The guard leaves a busy machine room above that.
_STOP_GUARD_S = 90


def _stuck_stop_report(p: subprocess.Popen, sig: signal.Signals, run_dir) -> str:
    """Why ``rqrl train`` (``p``) did not stop: the Python stacks of its threads (SIGABRT makes
    faulthandler print them; PYTHONFAULTHANDLER is set), its output and the run's logs."""
    exited = p.poll() is not None  # then a process it forked holds its pipes open
    masks = "" if exited else _signal_masks(p.pid)
    p.send_signal(signal.SIGABRT)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # Popen keeps what was read: the stacks are in it
        p.kill()
        out, err = p.communicate(timeout=10)
    what = "exited, but its pipes stayed open" if exited else "still ran"
    logs = "".join(f"\n--- {f.name}\n" + f.read_text(errors="replace")[-3000:]
                   for f in sorted((run_dir / "log").glob("*.log")))
    return f"rqrl train {what} {_STOP_GUARD_S} s after {sig.name}\n{masks}{out}\n{err[-8000:]}{logs}"


def _signal_masks(pid: int) -> str:
    """Each thread's pending, blocked, ignored and caught signal masks (/proc, Linux): whether a
    signal that did not stop the process was lost, is still pending, or was handled."""
    lines = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
        except OSError:  # the thread ended meanwhile
            continue
        masks = " ".join(f"{k}={status.get(k, '').strip()}" for k in ("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))
        lines.append(f"thread {task.name} {status.get('Name', '').strip()}: {masks}")
    return "signal masks (SIGINT is bit 2, SIGTERM bit 15, from 1):\n" + "\n".join(lines) + "\n"


def _block_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})


# blocked: started with the stop signals blocked, as a parent's mask is inherited through exec.
@pytest.mark.parametrize("sig,blocked", [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)])
def test_ctrl_c_or_sigterm_stops_everything(tmp_path, redis_server, sig, blocked):
    exp = f"sig{int(sig)}{'b' if blocked else ''}_{os.getpid()}"
    env = {**worker_env(redis_server.url), "PYTHONFAULTHANDLER": "1"}
    p = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "train", CONFIG, "--redis-url", redis_server.url,
                          "--name", "r1", "--set", f"exp_name={exp}", "--set", "env.stop_value=100000"],
                         cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_block_stop_signals if blocked else None)
    try:
        # Interrupted while it trains: the learner has reported a train iteration.
        wait_event(connect(redis_server.url), f"{exp}/r1",
                   lambda e: e.get("type") == "learner_info" and int(e.get("train_iter", 0)) > 0, 120)
        p.send_signal(sig)
        try:
            out, err = p.communicate(timeout=_STOP_GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(_stuck_stop_report(p, sig, tmp_path / exp / "r1"))
        assert p.returncode == 128 + int(sig), out + err[-3000:]
        # The closing block reaches the terminal too: why it stopped and where final.pt is.
        assert f"interrupted by {signal.Signals(signal.SIGINT).name}" in out and "final policy" in out, out
        assert wait_gone(exp) == []
    finally:
        # Whatever failed above, nothing of this run may take the next tests' tasks off their queues.
        if p.poll() is None:
            p.kill()
        kill_leftovers(exp)
