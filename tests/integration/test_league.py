"""The league commander end to end: real Redis, real rq workers, Connect Four self-play with PPO.

A coordinator SIGKILLed mid-run and started again with the same command adopts the league from
Redis (players, payoff table, Elo) and counts every training task's games once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from common import keys, streams
from common.connection import connect
from tests.conftest import (REPO, WORKER_CLASS, kill_leftovers, rq_bin, start_rq_workers, stop_workers, wait_event,
                            worker_env)

pytest.importorskip("pettingzoo")
pytestmark = [pytest.mark.redis_server, pytest.mark.slow]

CONFIG = str(REPO / "deploy" / "configs" / "connect_four_ppo.py")


def _coordinator(url: str, exp: str, cwd: Path) -> subprocess.Popen:
    """The run, small: 512-row updates, 512-move tasks, a snapshot every 2 train iterations,
    ended by 40,000 env steps (no eval reaches the stop value that soon)."""
    argv = [sys.executable, "-m", "coordinator", CONFIG, "--redis-url", url, "--run-name", "r1",
            "--set", f"exp_name={exp}", "--set", "policy.collect.n_sample=512", "--set", "policy.learn.batch_size=128",
            "--set", "policy.collect.collector.task_env_steps=512", "--set", "commander.league.snapshot_every=2",
            "--set", "commander.league.self_play_share=0.2", "--set", "commander.max_env_step=40000",
            "--set", "commander.eval_every_train_iter=10", "--set", "env.n_evaluator_episode=10",
            "--set", "commander.collector_task_space=2"]
    return subprocess.Popen(argv, cwd=cwd, env=worker_env(url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _games_in_finished_events(conn, ns: str) -> tuple[int, set[str]]:
    """Games (wins + draws + losses) of every finished training task on the run's event stream up
    to the last event the coordinator routed (a task that finishes after the run's end is not
    counted), and the opponents met."""
    games, met = 0, set()
    last = json.loads(conn.hget(keys.commander(ns), "state"))["last_event_id"]
    for _, raw in conn.xrange(keys.events(ns), max=last):
        ev = streams.decode_fields(raw)
        if ev.get("type") == "finished" and "opponent" in ev:
            games += int(ev["wins"]) + int(ev["draws"]) + int(ev["losses"])
            met.add(ev["opponent"])
    return games, met


@pytest.mark.timeout(600)
def test_a_killed_coordinator_resumes_the_league_and_counts_each_game_once(tmp_path, redis_server):
    conn = connect(redis_server.url)
    exp = f"league_{uuid.uuid4().hex[:6]}"
    ns = keys.namespace(exp, "r1")
    env = worker_env(redis_server.url)
    workers = start_rq_workers(conn, [[rq_bin(), "worker", q, "-w", WORKER_CLASS[q], "--name", f"{exp}-{q}-{i}"]
                                      for i, q in enumerate(["collector", "collector", "collector", "learner"])],
                               env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    coordinator = _coordinator(redis_server.url, exp, tmp_path)
    try:
        # A task against a snapshot finished: the league has snapshots and a payoff row for one.
        wait_event(conn, ns, lambda ev: ev.get("type") == "finished" and ev.get("opponent", "main") != "main", 300)
        os.killpg(coordinator.pid, signal.SIGKILL)
        coordinator.wait()
        before = json.loads(conn.hget(keys.commander(ns), "state"))["commander"]["league"]
        assert len(before["players"]) >= 2
        coordinator = _coordinator(redis_server.url, exp, tmp_path)
        assert coordinator.wait(timeout=400) == 2  # the env-step budget, not a crash
    finally:
        if coordinator.poll() is None:
            os.killpg(coordinator.pid, signal.SIGKILL)
        stop_workers(workers)
        kill_leftovers(exp)
    summary = json.loads((tmp_path / exp / "r1" / "summary.json").read_text())
    table = summary["league"]
    # Resumed, not restarted: every player from before the kill is still there, rated as it was or since.
    assert {p["player_id"] for p in before["players"]} <= set(table["players"])
    counted = sum(r["wins"] + r["draws"] + r["losses"] for r in table["payoff"].values())
    games, met = _games_in_finished_events(conn, ns)
    assert counted == games > 0  # each finished task's games once, across the restart
    assert met <= set(table["players"]) and len(met - {"main"}) >= 1
    # redis-cli's view: Elo and payoff hashes, and each snapshot a versioned blob.
    elo = {k.decode(): float(v) for k, v in conn.hgetall(keys.league_elo(ns)).items()}
    assert set(elo) == set(table["players"])
    payoff = {k.decode(): json.loads(v) for k, v in conn.hgetall(keys.league_payoff(ns)).items()}
    assert payoff == table["payoff"]
    for snapshot in set(table["players"]) - {"main"}:
        assert conn.hget(keys.league_snapshot(ns, snapshot), "version") is not None, snapshot
    status = subprocess.run([sys.executable, "-m", "coordinator.cli", "status", "--redis-url", redis_server.url,
                             "--exp", ns], capture_output=True, text=True, env=env, timeout=60)
    assert f"league: main Elo {table['players']['main']['elo']:.0f}" in status.stdout, status.stdout
