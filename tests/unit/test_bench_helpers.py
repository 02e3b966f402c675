"""The benchmark suite's own arithmetic: spreads and goal verdicts, stream-id order, first-use lags."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bench.bench_components import _first_use_lags
from tests.bench.bench_coordinator import stream_id
from tests.bench.stats import fmt, rank_test_p, spread, verdict


def test_spread_keeps_every_repeat():
    s = spread([3.0, 1.0, 2.0, None])
    assert s == {"min": 1.0, "median": 2.0, "max": 3.0, "n": 3, "values": [3.0, 1.0, 2.0]}
    assert spread([])["median"] is None


@pytest.mark.parametrize("values, goal, expected", [
    ([0.9, 0.85, 1.0], ">= 0.8", "met"),
    ([0.5, 0.7], ">= 0.8", "not met"),
    ([0.77, 0.95], ">= 0.8", "spread crosses the goal"),  # a median above the goal is not enough
    ([40, 60], "<= 50", "spread crosses the goal"),
    ([10, 12], "<= 12", "met"),
])
def test_verdict_judges_the_whole_spread(values, goal, expected):
    assert verdict(spread(values), goal) == expected


def test_verdict_and_fmt_without_figure():
    assert verdict(None, ">= 1") == "no figure" and fmt(None) == "-"
    assert fmt(spread([1.0, 2.0, 4.0]), "ms") == "2 ms (1–4, n=3)"


def test_the_rank_test_counts_every_split_of_the_runs_and_ties_as_half():
    # 5 against 5 all apart: only the observed split and its mirror are that extreme, 2 of C(10, 5) = 252.
    assert rank_test_p([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    assert rank_test_p([6, 7, 8, 9, 10], [1, 2, 3, 4, 5]) == pytest.approx(2 / 252)
    # U = 13, half a step from its mean 12.5, where every split of distinct values lies.
    assert rank_test_p([1, 4, 5, 8, 10], [2, 3, 6, 7, 9]) == 1.0
    assert rank_test_p([1], [2]) is None  # one run a side: no test
    assert rank_test_p([500, 500], [500, 500]) == 1.0
    # 2 against 2: U = 4 or 0 in 2 of the C(4, 2) = 6 splits.
    assert rank_test_p([400, 500], [200, 300]) == pytest.approx(2 / 6)
    # A tie across the sides counts half: U = 3.5 of 4; |U - 2| >= 1.5 in the 2 extreme splits and
    # in the 2 that swap the tied pair's members (each 3.5 or 0.5).
    assert rank_test_p([300, 500], [200, 300]) == pytest.approx(4 / 6)


def test_the_rank_test_of_twenty_runs_a_side_takes_the_normal_approximation_near_the_permutations():
    from scipy import stats

    rng = np.random.default_rng(0)
    a, b = list(rng.normal(0.0, 1.0, 20)), list(rng.normal(0.8, 1.0, 20))
    a[:3] = b[:3] = [0.5, 0.5, 0.5]  # ties across the sides, as capped returns give
    # C(40, 20) = 1.4e11 splits: not enumerated (that would not end); 20,000 random splits instead.
    sampled = stats.permutation_test(
        (a, b), lambda x, y, axis=-1: stats.mannwhitneyu(x, y, axis=axis).statistic, vectorized=True,
        permutation_type="independent", n_resamples=20_000, random_state=1).pvalue
    p = rank_test_p(a, b)
    assert p == pytest.approx(sampled, abs=0.01) and p < 0.05


def test_stream_ids_compare_as_integers():
    assert stream_id(b"1700-13") < stream_id(b"1700-120")
    assert b"1700-13" > b"1700-120"  # what comparing the bytes would conclude
    assert stream_id(b"999-5") < stream_id(b"1000-0")
    assert stream_id("5-10") > stream_id("5-9") and stream_id(b"7") == (7, 0)


def test_first_use_lags():
    published = [(4, 1.0), (8, 2.0), (12, 3.0), (16, 9.0)]
    # (time, version acted with): version 4 first used at 1.5, 8 never directly (12 at 3.5 covers it),
    # 12 at 3.5; 16 is published after the last action.
    acts = [(0.5, 0), (1.2, 0), (1.5, 4), (2.5, 4), (3.5, 12), (4.0, 12)]
    lags, censored = _first_use_lags(published, acts)
    assert lags == pytest.approx([0.5, 1.5, 0.5]) and censored == 1


def test_first_use_lags_grow_when_collectors_look_rarely():
    """The figure the old benchmark could not produce: a collector that refreshes every 0.5 s."""
    published = [(v, v * 0.005) for v in range(1, 201)]  # a version every 5 ms for 1 s
    acts = [(t / 1000, 0 if t < 500 else 100 if t < 1000 else 200) for t in range(0, 1100, 1)]
    lags, _ = _first_use_lags(published, acts)
    assert max(lags) > 0.45


def test_launch_to_exit_ratios_pair_seeds_that_both_sides_finished(tmp_path):
    from tests.bench.bench_start import _ratios, wait_teardown

    rqrl = [{"seed": 0, "exit_code": 0, "wall_s": 4.0}, {"seed": 1, "exit_code": 0, "wall_s": 5.0},
            {"seed": 2, "exit_code": 1, "wall_s": 1.0}]
    ding = [{"seed": 1, "exit_code": 0, "wall_s": 10.0}, {"seed": 0, "exit_code": 0, "wall_s": 8.0},
            {"seed": 2, "exit_code": 0, "wall_s": 9.0}]
    assert _ratios(rqrl, ding) == [0.5, 0.5]  # per seed, in rqrl's order; a failed run gives no ratio
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "teardown.log").write_text("teardown finished in 0.84 s (at 1796129596.235)\n")
    assert wait_teardown(tmp_path, timeout=1) == 1796129596.235


def test_soak_key_kinds_and_the_projection_per_day():
    from tests.bench.bench_soak import key_kind, report

    ns = "soak/r1"
    assert key_kind("rqrl:soak/r1:task:collector_task_4f9a0c1d2e3b4a5c:heartbeat", ns) == "rqrl:{exp}:task:collector_task_*:heartbeat"
    assert key_kind("rqrl:soak/r1:data:collector_task_4f9a0c1d2e3b4a5c_0a1b2c3d", ns) == "rqrl:{exp}:data:collector_task_*_*"
    assert key_kind("rq:worker:soak-collector0-12345", ns) == "rq:worker:soak-collector0-*"
    start = {"t": 0.0, "used_memory": 2**20, "keys": {"a": 10}, "rss": {"1 rqrl": 100 * 2**20}}
    end = {"t": 864.0, "used_memory": 2 * 2**20, "keys": {"a": 11, "b": 1}, "rss": {"1 rqrl": 101 * 2**20}}
    text = report(start, end)  # 864 s is a hundredth of a day
    assert "+100.0 MB/day" in text and "+100" in text.splitlines()[4]


def _soak_sample(t: float, memory: float, key_count: int, rss: dict[str, float]) -> dict:
    return {"t": t, "used_memory": memory, "keys": {"k": key_count}, "rss": rss}


def test_soak_checks_judge_memory_after_the_ttl_window_and_rss_over_the_last_20_minutes():
    from tests.bench.bench_soak import checks

    # Memory doubles in the first TTL window (step data piling up to its TTL), then holds: flat.
    samples = [_soak_sample(60.0 * m, 100.0 * (1 + min(m, 10) / 10), 50, {"1 learner": 100.0, "2 old": 10.0})
               for m in range(31)]
    samples[-1]["rss"] = {"1 learner": 104.0, "3 restarted": 500.0}  # pid 2 gone, pid 3 new: neither judged
    c = checks(samples, ttl_s=600)
    assert c["memory_flat"] and c["memory_no_growth"] and c["used_memory_drift"] == 0.0 and c["window_s"] == 1200.0
    assert c["rss_flat"] and c["rss_growth"] == {"1 learner": 0.04} and c["rss_window_s"] == 1200.0
    # A leak: memory still climbing 1 % a minute after the window; an RSS 6 % up over the last 20 minutes.
    for m, s in enumerate(samples):
        s["used_memory"] = 100.0 * (1 + 0.01 * m)
    samples[-1]["rss"]["1 learner"] = 106.0
    c = checks(samples, ttl_s=600)
    assert not c["memory_flat"] and not c["memory_no_growth"] and c["used_memory_drift"] > 0.10
    assert not c["rss_flat"] and c["worst_rss_growth"] == {"process": "1 learner", "growth": 0.06}
    # A run whose rates fall holds fewer TTL-bound keys: not flat, but no growth either.
    for m, s in enumerate(samples):
        s["used_memory"], s["keys"] = 100.0 * (1 - 0.01 * m), {"k": 100 - m}
    c = checks(samples, ttl_s=600)
    assert not c["memory_flat"] and c["memory_no_growth"]
    with pytest.raises(ValueError, match="TTL window of 600 s"):
        checks(samples[:10], ttl_s=600)


def test_the_source_line_names_parts_taken_from_their_own_benchmark_runs():
    from tests.bench.report import source_line

    machine = {"cpus": 2, "cpu": "cpu", "mem_gib": 23.5, "python": "3.11", "torch": "2.13.0",
               "redis_server": "Redis server v=7.0.15 sha=0", "loadavg_at_start": [0.1], "loadavg_at_end": [0.2]}
    raw = {"machine": machine, "settings": {"quick": False}, "date": "d", "command": "c", "git_commit": "abc",
           "git_dirty": False, "taken_from": [{"part": "start", "file": "2026-12-01-start.json"}]}
    assert "The part start comes from its own benchmark run [2026-12-01-start.json](bench/2026-12-01-start.json)." \
        in source_line(raw)


def test_an_rl_zoo_entry_becomes_sb3_keywords_and_a_budget():
    from tests.bench.bench_sb3 import zoo_kwargs

    entry = {"n_timesteps": 120000.0, "policy": "MlpPolicy", "learning_rate": 0.004, "train_freq": 16,
             "policy_kwargs": "dict(net_arch=[256, 256])"}
    kwargs, budget = zoo_kwargs(entry)
    assert budget == 120_000 and kwargs == {"policy": "MlpPolicy", "learning_rate": 0.004, "train_freq": 16,
                                            "policy_kwargs": {"net_arch": [256, 256]}}
    with pytest.raises(ValueError, match="'normalize' is not reproduced"):
        zoo_kwargs({**entry, "normalize": True})
    with pytest.raises(NameError):  # rl-zoo's strings may name only dict(...) here
        zoo_kwargs({**entry, "policy_kwargs": "dict(activation_fn=nn.ReLU)"})


def test_learner_loop_bench_times_the_learner_tasks_hooks():
    """bench_learner_loop builds a lead learner task's loop (publishing to a private Redis): every
    after-iteration hook it registers is timed, and the parts add up to the learner's iteration."""
    from tests.bench.bench_learner_loop import measure

    # 32 iterations after the 100 of warm-up: send_info (every 20 iterations) runs in them, and a
    # publication (every send_policy_freq = 16) in each block of 16
    res = measure("cartpole_dqn", block=16, repeats=2)
    parts = res["learner_parts_us"]
    assert {"policy.learn", "data source", "publish_policy", "send_info", "finite check and bookkeeping"} <= set(parts)
    assert all(v > 0 for k, v in parts.items() if k != "finite check and bookkeeping")
    assert res["data_source_us_after_publication"] > 0 and res["data_source_us_otherwise"] > 0
    assert res["bare_cpu_us"] > 0 and res["learner_cpu_us"] > 0 and len(res["cpu_us_per_block"]["learner"]) == 2


def test_bench_sb3_names_each_process_of_rqrl_train_by_its_title():
    from tests.bench.bench_sb3 import process_kind

    assert process_kind(["rq:worker:bench_sb3_mountaincar_v0-learner-13985: Processing workers.learner.run"]) == "learner"
    assert process_kind(["rq:worker:bench_sb3_mountaincar_v0-learner1-13985: Forked 14056"]) == "learner"  # rank 1
    assert process_kind(["rqrl learner bench_sb3_mountaincar_v0/20261206T143604Z-s0"]) == "learner"  # before RQ names it
    assert process_kind(["rqrl collector2 bench_sb3_mountaincar_v0/20261206T143604Z-s0"]) == "collectors"
    assert process_kind(["rq:worker:bench_sb3_mountaincar_v0-collector2-13985: Listening on collector"]) == "collectors"
    assert process_kind(["rqrl coordinator bench_sb3_mountaincar_v0/20261206T143604Z-s0"]) == "coordinator"
    assert process_kind(["/usr/bin/redis-server 127.0.0.1:36071"]) == "redis"
    assert process_kind(["/venv/bin/python", "-m", "coordinator.cli", "train", "x.py"]) == "launcher"


def test_process_cpu_counts_a_groups_processes_by_kind(tmp_path):
    import os
    import time

    from tests.bench.bench_sb3 import ProcessCpu

    (tmp_path / "cgroup.procs").write_text(f"{os.getpid()}\n")  # a stand-in for a cgroup: this process
    sampler = ProcessCpu(tmp_path, every_s=0.01)
    t0 = time.process_time()
    while time.process_time() - t0 < 0.2:  # CPU to count (bounded by CPU time, not wall)
        sum(range(1000))
    by = sampler.stop()  # its last reading, at the stop, counts this process whatever the thread saw
    assert set(by) == {"launcher"} and by["launcher"] >= 0.2


def test_a_run_reached_its_budget_on_exit_0_or_on_rqrl_s_unmet_stop_value_only():
    from tests.bench.bench_sb3 import reached_budget

    assert reached_budget({"side": "rqrl", "rc": 0}) and reached_budget({"side": "rqrl", "rc": 2})
    assert reached_budget({"side": "sb3", "rc": 0})
    assert not reached_budget({"side": "sb3", "rc": 2})  # argparse's exit, not a finished run
    assert not reached_budget({"side": "rqrl", "rc": 1}) and not reached_budget({"side": "rqrl", "rc": -9})


def test_bench_dqn_loop_updates_in_bursts_after_the_start():
    from common.config import apply_overrides, load_config
    from tests.bench.bench_dqn_loop import REPO, run

    cfg = apply_overrides(load_config(REPO / "deploy" / "configs" / "cartpole_dqn.py"),
                          ["env.collector_env_num=2", "policy.learn.double=False", "policy.eval.eps=0.0",
                           "env.n_evaluator_episode=1"])
    # replay_start_size 256: the first burst of 8 updates comes after env step 272, not at 256
    assert [run(cfg, seed=0, n_env=2, train_freq=16, gradient_steps=8, budget=b)["train_iter"]
            for b in (256, 272)] == [0, 8]
    out = run(cfg, seed=0, n_env=2, train_freq=16, gradient_steps=8, budget=512)
    assert (out["envstep"], out["train_iter"]) == (512, 128)  # bursts after 272, 288, ..., 512
    assert np.isfinite(out["last_eval"])
    with pytest.raises(ValueError, match="multiple of --envs 3"):
        run(cfg, seed=0, n_env=3, train_freq=16, gradient_steps=8, budget=512)


def test_shared_episodes_replay_the_same_start_states(tmp_path):
    from tests.bench import bench_shared_episodes as shared
    from tests.unit.test_export_eval import make_policy, save_bundle

    assert shared.group_means([1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 10.0, 10.0, 10.0, 10.0, 99.0]) == [3.0, 10.0]
    with pytest.raises(ValueError, match="need at least 5"):
        shared.group_means([1.0, 2.0])
    path = save_bundle(make_policy("dqn"), tmp_path / "rqrl_CartPole-v1_s0.pt")
    a, b = shared.play(path, 10, 7), shared.play(path, 10, 7)
    assert a["returns"] == b["returns"] and len(a["group_means"]) == 2  # same seeds, same greedy episodes
    assert len(set(a["returns"])) > 1  # the start states differ, and so do the episodes
    # Another start state, another episode: the seeds reach the env.
    assert shared.play(path, 10, 8)["returns"][:9] == a["returns"][1:]
    for name in ("final.pt", "sb3_CartPole-v1_s0.pt", "rqrl_CartPole-v1_s0.zip"):
        with pytest.raises(ValueError, match="not a bench_sb3 --keep file"):
            shared.play(tmp_path / name, 5, 0)
