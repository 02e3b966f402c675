"""The scaling benchmark's own arithmetic (tests/bench/bench_scaling.py): efficiency against one
worker, the steady window of a run's records, process roles, the memory check and its command line."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.bench.bench_scaling import (efficiency, episode_points, fits, parse_args, role, steady_rate, table,
                                       what_binds, window)


def test_efficiency_is_against_n_times_one_worker():
    assert efficiency({1: 150.0, 2: 300.0, 4: 540.0, 32: 2400.0}) == {1: 1.0, 2: 1.0, 4: 0.9, 32: 0.5}
    assert efficiency({2: 300.0, 4: 600.0}) == {2: None, 4: None}  # no base: no figure, never a guess
    assert efficiency({1: 0.0, 2: 10.0}) == {1: None, 2: None}


def test_steady_rate_leaves_out_the_start_and_the_stop():
    # 10 s of start-up at 0, then 100 steps/s for 100 s, then a slow tail: only the middle counts.
    points = [(0.0, 0.0)] + [(10.0 + t, 100.0 * t) for t in range(101)] + [(200.0, 10_100.0)]
    assert steady_rate(points) == pytest.approx(100.0)
    assert window(points) == (21.0, 100.0)  # 10 % and 90 % of 10,100 env steps: 1,100 .. 9,000
    assert steady_rate(points) != pytest.approx(points[-1][1] / points[-1][0])  # not the wall-clock average


def test_steady_rate_needs_two_points_inside():
    assert steady_rate([]) is None and window([]) is None
    assert steady_rate([(0.0, 0.0), (1.0, 100.0)]) is None  # nothing between 10 % and 90 %
    assert steady_rate([(5.0, 50.0), (5.0, 60.0), (5.0, 100.0)]) is None  # no time passed


def test_episode_points_add_lengths_in_receipt_order(tmp_path):
    rows = [{"time": 2.0, "length": 10}, {"time": 1.0, "length": 5}, {"time": 2.0, "length": 7}]
    (tmp_path / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert episode_points(tmp_path / "episodes.jsonl") == [(1.0, 5), (2.0, 22)]
    assert episode_points(tmp_path / "missing.jsonl") == []


@pytest.mark.parametrize("title, expected", [
    ("rqrl coordinator bench_scaling/n4", "coordinator"),
    ("rqrl collector12 bench_scaling/n4", "collector"),
    ("rq:worker:bench_scaling-collector3-4242: busy", "collector"),
    ("rq:worker:bench_scaling-collector3-4242-r1: idle", "collector"),  # restarted by the launcher
    ("rq:worker:bench_scaling-learner-4242: busy", "learner"),
    ("rq:worker:collector_exp-learner-4242: busy", "learner"),  # an experiment named like a role
    ("python -m coordinator.cli train", "other"),
])
def test_roles_from_process_titles(title, expected):
    assert role(title) == expected


def test_fits_names_the_measured_reason():
    assert fits(64, None, 1) is None  # nothing measured yet: run it
    assert fits(64, 50.0, 20 * 2**30) is None  # 3.1 GiB + 4 GiB reserve of 20 GiB
    reason = fits(64, 200.0, 10 * 2**30)
    assert reason is not None and "200 MiB PSS each, measured" in reason and "10.0 GiB is available" in reason


def test_what_binds_names_the_cpu_or_the_busiest_process():
    busy = {"cpu_share": {"collectors": 1.6, "coordinator": 0.2, "redis": 0.15, "learner": 0.05}}
    assert what_binds(busy, 2).startswith("the CPU: 2.00 of 2 cores busy (collectors 1.60")
    others = {"cpu_share": {"collectors": 0.8, "outside_run": 1.0, "per_collector": 0.05}}
    assert what_binds(others, 2) == "the CPU: 1.80 of 2 cores busy (outside_run 1.00, collectors 0.80)"
    # The machine's own figure decides when it was read: here the run's processes alone look idle.
    machine = {"cpu_share": {"collectors": 0.5, "machine": 1.95, "outside_run": 1.45}}
    assert what_binds(machine, 2).startswith("the CPU: 1.95 of 2 cores busy (outside_run 1.45, collectors 0.50)")
    coord = {"cpu_share": {"collectors": 0.3, "coordinator": 0.95, "redis": 0.1}}
    assert what_binds(coord, 16).startswith("the coordinator: 0.95 of one core")
    waits = {"cpu_share": {"collectors": 0.3}, "limiter_wait_share": 0.2}
    assert what_binds(waits, 2).startswith("the replay-ratio limiter")
    assert what_binds({"cpu_share": {}}, 2).startswith("none measured")


def test_table_shows_skipped_points():
    text = table([{"workers": 1, "env_steps_per_s": 150.0, "efficiency": 1.0, "cpu_share": {"collectors": 0.1},
                   "collector_pss_mib": 40.0},
                  {"workers": 64, "skipped": "64 collector workers need about 20 GiB"}])
    assert "| 1 | 150 | - | 1 | 0.1 |" in text and "40 MiB" in text
    assert text.splitlines()[-1].endswith("| 64 collector workers need about 20 GiB |")


@pytest.mark.parametrize("argv", [["--workers", "2", "4"], ["--workers", "1", "4", "2"], ["--workers", "1", "1"],
                                  ["--steps-per-worker", "100"], ["--env", "mujoco"]])
def test_bad_command_lines_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and "error" in capsys.readouterr().err


def test_command_line_defaults():
    args = parse_args([])
    assert args.workers == [1, 2, 4, 8, 16, 32, 64] and args.env == "slow" and args.steps_per_worker == 4000


def test_the_device_script_refuses_without_cuda_or_out(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would run the curve")
    script = Path(__file__).resolve().parents[2] / "tests" / "bench" / "device_scaling.sh"
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    res = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "set OUT" in res.stderr
    res = subprocess.run(["bash", str(script)], env={**env, "OUT": str(tmp_path)}, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "refusing: no CUDA device" in res.stderr
    assert not list(tmp_path.glob("scaling-*"))  # nothing ran
