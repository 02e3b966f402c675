"""docs/results.md (tests/bench/results.py): sweeps taken in with their raw records, a page written
from those records alone, and the committed page is what its records give."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.bench import results
from tests.conftest import REPO

MACHINE = {"cpu": "Test CPU", "cpus": 2, "memory_gib": 8.0, "load_1min": 3.5, "os": "Linux", "python": "3.11",
           "torch": "2.13.0", "gpu": None, "commit": "abc1234"}


def _sweep(root: Path, exp: str, runs: list[dict], **table) -> Path:
    """A finished `rqrl sweep` folder: sweep.json, sweep.png and each run's summary.json / evals.jsonl."""
    sweep_dir = root / exp / "sweep-20261201T000000Z"
    sweep_dir.mkdir(parents=True)
    rows = []
    for r in runs:
        run_dir = root / exp / f"20261201T000000Z-s{r['seed']}"
        run_dir.mkdir()
        summary = {"envstep": r["envstep"], "wall_seconds": r["wall"]}
        if "train" in r:
            summary["train_return_mean"] = r["train"]
        if "league" in r:
            summary["league"] = r["league"]
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "evals.jsonl").write_text("".join(
            json.dumps({"envstep": e, "reward_mean": v, "episodes": 5}) + "\n" for e, v in r["evals"]))
        rows.append({"seed": r["seed"], "run_name": run_dir.name, "exit_code": 0 if r["solved"] else 2,
                     "solved": r["solved"], "wall_seconds": r["wall"], "envstep": r["envstep"], "train_iter": 10,
                     "reeval_mean": r.get("reeval"), "reeval_std": 1.0})
    (sweep_dir / "sweep.png").write_bytes(b"\x89PNG not really")
    (sweep_dir / "sweep.json").write_text(json.dumps({"exp_name": exp, "runs": rows, **table}))
    return sweep_dir


def _page(out: Path, *args: str) -> str:
    """``results.main(args)`` with its records and page under ``out``; the page."""
    assert results.main([*args, "--results-dir", str(out / "results"), "--out", str(out / "results.md")]) == 0
    return (out / "results.md").read_text()


def test_a_sweep_taken_in_gives_the_page_its_figures_curve_and_raw_files(tmp_path):
    out = tmp_path / "docs"
    sweep = _sweep(tmp_path / "work", "cartpole_dqn", [
        {"seed": 0, "solved": True, "envstep": 2000, "wall": 20.0, "evals": [(1000, 50.0), (2000, 200.0)], "reeval": 210.0},
        {"seed": 1, "solved": True, "envstep": 4000, "wall": 40.0, "evals": [(2000, 90.0), (4000, 250.0)], "reeval": 230.0},
        {"seed": 2, "solved": False, "envstep": 9000, "wall": 60.0, "evals": [(9000, 120.0)], "reeval": 100.0}],
        env_id="CartPole-v1", algo="dqn", config="cartpole_dqn.py", stop_value=195.0, machine=MACHINE,
        budget={"max_env_step": 9000, "max_train_iter": 0, "max_wall_seconds": 0.0}, overrides=["commander.max_env_step=9000"])
    # an older sweep: no machine, algo or budget recorded
    old = _sweep(tmp_path / "work", "acrobot_dqn", [
        {"seed": 0, "solved": False, "envstep": 5000, "wall": 30.0, "evals": [(5000, -300.0)]}],
        env_id="Acrobot-v1", stop_value=-100.0)
    page = _page(out, "--add", str(sweep), str(old))
    assert ("| [cartpole_dqn](#cartpole_dqn) | CartPole-v1 | dqn | 3 | 2/3 | 3,000 [2,000, 4,000] | 30 [20, 40] "
            "| 200.0 [120.0, 250.0] (195) | 210.0 [100.0, 230.0] | 9,000 env steps |") in page
    assert "`rqrl sweep --env CartPole-v1 --algo dqn --seeds 0,1,2 --set commander.max_env_step=9000`" in page
    assert "| 2 | no | 60 | 9,000 | 10 | 1 | 120.0 | 120.0 | 100.0 ± 1.0 |" in page
    assert "Test CPU, 2 CPUs, 8.0 GiB; no GPU" in page
    assert "not recorded (runs reached 5,000 env steps)" in page and "(recorded when taken in)" in page
    # Every link of the page points at a file it copied.
    links = re.findall(r"\]\(([^)#]+)\)", page)
    assert "results/cartpole_dqn/curve.png" in links and "results/cartpole_dqn/sweep.json" in links
    assert all((out / link).is_file() for link in links), links
    assert (out / "results" / "cartpole_dqn" / "seed1" / "evals.jsonl").read_text().count("\n") == 2
    assert json.loads((out / "results" / "acrobot_dqn" / "sweep.json").read_text())["machine"]["cpus"] >= 1


def test_each_seed_row_gives_its_training_return_and_a_reference_links_from_where_the_page_is(tmp_path, monkeypatch):
    ref = results.Planned("CartPole-v1", "dqn", reference="a figure ([raw]({bench}/ref.json), [run]({rel}/x.json))")
    monkeypatch.setattr(results, "PLAN", (ref,))
    sweep = _sweep(tmp_path / "work", "cartpole_dqn", [
        {"seed": 0, "solved": False, "envstep": 900, "wall": 9.0, "evals": [(900, 20.0)], "train": 31.25},
        {"seed": 1, "solved": False, "envstep": 900, "wall": 9.0, "evals": [(900, 30.0)]}],  # before the figure
        env_id="CartPole-v1", algo="dqn", stop_value=195.0, machine=MACHINE)
    out = tmp_path / "elsewhere" / "docs"
    page = _page(out, "--add", str(sweep))
    assert "| re-eval of final.pt | training return |" in page
    assert "| 20.0 | 20.0 | - | 31.2 |" in page and "| 30.0 | 30.0 | - | - |" in page
    bench = Path(os.path.relpath(REPO / "docs" / "bench", out))
    assert f"a figure ([raw]({bench}/ref.json), [run](results/x.json))" in page


def test_a_league_preset_gives_each_seeds_first_and_last_snapshot_elo_and_others_no_league_table(tmp_path):
    players = {"main": {"train_iter": 30, "elo": 1250.0}, "main@20": {"train_iter": 20, "elo": 1180.4},
               "main@10": {"train_iter": 10, "elo": 1004.6}}
    sweep = _sweep(tmp_path / "work", "connect_four_ppo", [
        {"seed": 0, "solved": False, "envstep": 900, "wall": 9.0, "evals": [(900, 0.5)],
         "league": {"players": players, "payoff": {}, "seat_advantage": 57.94}},
        {"seed": 1, "solved": False, "envstep": 900, "wall": 9.0, "evals": [(900, 0.4)],
         "league": {"players": {"main": {"train_iter": 5, "elo": 1000.0}}, "payoff": {}}}],
        env_id="rqrl/ConnectFour-v0", algo="ppo", stop_value=0.9, machine=MACHINE)
    page = _page(tmp_path / "docs", "--add", str(sweep))
    assert "| 0 | 1,005 (main@10) | 1,180 (main@20) | 1,250 | +58 |" in page
    assert "| 1 | - | - | 1,000 | - |" in page  # no snapshot yet, and a summary from before the seat's figure
    assert results.league_lines([{"seed": 0, "league": None}]) == []


def test_a_gpu_is_named_on_the_page(tmp_path):
    sweep = _sweep(tmp_path / "work", "pong_dqn", [
        {"seed": 0, "solved": False, "envstep": 100, "wall": 5.0, "evals": [(100, -21.0)]}],
        env_id="ALE/Pong-v5", algo="dqn", stop_value=20.0, machine=dict(MACHINE, gpu="NVIDIA H200"))
    results.add_sweep(sweep, tmp_path / "results")
    page = results.render(results.load_records(tmp_path / "results"), tmp_path / "results", tmp_path / "results.md")
    assert "GPU NVIDIA H200" in page


def test_the_committed_page_is_what_its_records_give():
    page = REPO / "docs" / "results.md"
    assert page.read_text() == results.render(results.load_records(results.RESULTS_DIR), results.RESULTS_DIR, page), \
        "docs/results.md differs from docs/results/: run python -m tests.bench.results"


def test_the_page_covers_classic_control_over_five_seeds_and_minatar_over_three():
    records = {r.exp: r for r in results.load_records(results.RESULTS_DIR)}
    from common import presets

    for p in presets.PRESETS:
        if p.family == "classic control":
            assert p.path.stem in records and len(records[p.path.stem].table["runs"]) >= 5, p.config
            assert records[p.path.stem].table["env_id"] == p.env_id
    assert len(records["minatar_breakout_dqn"].table["runs"]) >= 3
    assert all((r.folder / "curve.png").is_file() for r in records.values())


def _bench_sb3(path: Path, rows: list[tuple[str, int, str, float, int]], config: str | None = None) -> Path:
    """A bench_sb3 --json output: rows of (env, seed, side, last eval, exit code); ``config`` on
    the rqrl rows (older outputs have none)."""
    path.write_text(json.dumps({"runs": [
        {"env": env, "seed": seed, "side": side, "last_eval": last, "rc": rc, "budget": 50_000, "cpu_s_per_1k": 1.5,
         **({"config": config} if config and side == "rqrl" else {})}
        for env, seed, side, last, rc in rows]}))
    return path


def test_the_sb3_column_pairs_seeds_both_sides_ran_and_a_later_file_replaces_a_row(tmp_path, monkeypatch):
    older = _bench_sb3(tmp_path / "a.json", [
        ("CartPole-v1", 0, "rqrl", 100.0, 2), ("CartPole-v1", 0, "sb3", 300.0, 0),
        ("CartPole-v1", 1, "rqrl", 500.0, 2), ("CartPole-v1", 1, "sb3", 200.0, 0),
        ("Acrobot-v1", 0, "rqrl", -90.0, 2), ("Acrobot-v1", 0, "sb3", -80.0, 0)])
    newer = _bench_sb3(tmp_path / "b.json", [
        ("CartPole-v1", 0, "rqrl", 400.0, 2),          # replaces seed 0's 100.0
        ("CartPole-v1", 2, "rqrl", 9999.0, 2),         # no SB3 run of seed 2: not counted
        ("Acrobot-v1", 1, "rqrl", 0.0, 1), ("Acrobot-v1", 1, "sb3", -500.0, 0),  # rqrl failed: not counted
        ("Acrobot-v1", 2, "rqrl", -70.0, 2), ("Acrobot-v1", 2, "sb3", -600.0, 2)],  # SB3's 2 is a failure
        config="deploy/configs/cartpole_dqn_zoo.py")
    monkeypatch.setitem(results.SB3_WHY, "Acrobot-v1", "measured cause here.")
    out = tmp_path / "docs"
    page = _page(out, "--sb3-add", str(older), str(newer))
    # Each rqrl config that ran a counted seed is named; a row without one ran the env's preset.
    assert ("| CartPole-v1 | dqn | cartpole_dqn.py, cartpole_dqn_zoo.py | 50,000 | 0,1 | 450.0 [400.0, 500.0] "
            "| 250.0 [200.0, 300.0] | yes | 0.333 | 1.50 [1.50, 1.50] | 1.50 [1.50, 1.50] |") in page
    assert "| Acrobot-v1 | dqn | acrobot_dqn.py | 50,000 | 0 | -90.0 | -80.0 | no | - |" in page
    assert "rqrl's median last eval is at least SB3's on 1 of 2 envs." in page
    assert "- Acrobot-v1 (rqrl / SB3 per seed): seed 0: -90.0 / -80.0. rqrl is lower: measured cause here." in page
    assert "9999" not in page and "-500" not in page and "-600" not in page
    # rl-zoo's published agents give the scale, for the page's envs only.
    assert ("150,000 env steps): Acrobot-v1 (dqn) -76.6 +- 11.8 over 1,932 episodes; "
            "CartPole-v1 (dqn) 500.0 +- 0.0 over 300 episodes.") in page
    links = re.findall(r"\]\(([^)#]+)\)", page)
    assert "results/sb3/a.json" in links and all((out / link).is_file() for link in links), links


def test_a_lower_row_gives_its_rank_test_p_beside_its_reason(tmp_path, monkeypatch):
    runs = _bench_sb3(tmp_path / "a.json", [
        ("Acrobot-v1", 0, "rqrl", -90.0, 2), ("Acrobot-v1", 0, "sb3", -80.0, 0),
        ("Acrobot-v1", 1, "rqrl", -95.0, 2), ("Acrobot-v1", 1, "sb3", -70.0, 0)])
    monkeypatch.setitem(results.SB3_WHY, "Acrobot-v1", "measured cause here.")
    page = _page(tmp_path / "docs", "--sb3-add", str(runs))
    # rqrl's two below SB3's two: U = 0, in 2 of the C(4, 2) = 6 splits with |U - 2| >= 2.
    assert "| Acrobot-v1 | dqn | acrobot_dqn.py | 50,000 | 0,1 | -92.5 [-95.0, -90.0] | -75.0 [-80.0, -70.0] | no | 0.333 |" in page
    assert "rqrl is lower (rank test p 0.333): measured cause here." in page


def test_a_file_that_is_not_a_bench_sb3_output_is_refused_by_name(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": [{"env": "CartPole-v1", "seed": 0, "side": "rqrl", "rc": 0, "budget": 1}]}))
    with pytest.raises(ValueError, match=r"bad.json: runs\[0\] has no 'last_eval'"):
        results.add_sb3(bad, tmp_path / "results")
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="not a bench_sb3 output"):
        results.add_sb3(bad, tmp_path / "results")
    bad.write_text(json.dumps({"rqrl_args": ["--deterministic"], "runs": []}))
    with pytest.raises(ValueError, match=r"extra arguments \['--deterministic'\]"):
        results.add_sb3(bad, tmp_path / "results")
    bad.write_text(json.dumps({"double": True, "runs": []}))
    with pytest.raises(ValueError, match="double DQN's target"):
        results.add_sb3(bad, tmp_path / "results")
    assert not (tmp_path / "results" / "sb3" / "bad.json").exists()
    first = _bench_sb3(tmp_path / "out.json", [("CartPole-v1", 0, "rqrl", 1.0, 2)])
    results.add_sb3(first, tmp_path / "results")
    results.add_sb3(first, tmp_path / "results")  # the same file again: a no-op
    (tmp_path / "again").mkdir()
    other = _bench_sb3(tmp_path / "again" / "out.json", [("CartPole-v1", 0, "rqrl", 2.0, 2)])
    with pytest.raises(ValueError, match="holds another output of that name"):
        results.add_sb3(other, tmp_path / "results")


def test_an_sb3_run_that_did_not_reach_its_budget_fails_the_command(tmp_path, monkeypatch):
    codes = iter([-9, 0])
    monkeypatch.setattr(results.subprocess, "run",
                        lambda argv, cwd: type("Done", (), {"returncode": next(codes)})())
    assert results.run_sb3(["CartPole-v1"], [0], tmp_path) == 1  # killed by a signal
    assert results.run_sb3(["CartPole-v1"], [0], tmp_path) == 0
