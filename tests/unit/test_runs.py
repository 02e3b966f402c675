"""Run names and folders (coordinator/runs.py) and how a coordinator picks its run (fakeredis)."""

from __future__ import annotations

import copy

import pytest

from common import keys
from coordinator import runs
from coordinator.daemon import Coordinator, CoordinatorError


def test_reserved_run_folders_never_collide(tmp_path):
    a = runs.reserve_run_dir(tmp_path, "exp", 1)
    b = runs.reserve_run_dir(tmp_path, "exp", 1)  # the same second, the same seed
    c = runs.reserve_run_dir(tmp_path, "exp", 2)
    assert a.name.endswith("-s1") and a != b and b.name.startswith(a.name) and c.name.endswith("-s2")
    assert runs.reserve_run_dir(tmp_path, "exp", 1, name="mine") == tmp_path / "exp" / "mine"
    with pytest.raises(ValueError, match="exists already"):
        runs.reserve_run_dir(tmp_path, "exp", 1, name="mine")
    with pytest.raises(ValueError):
        runs.reserve_run_dir(tmp_path, "exp", 1, name="a/b")


def test_latest_link_and_finding_a_run(tmp_path):
    exp_dir = tmp_path / "exp"
    for name in ("r1", "r2"):
        (exp_dir / name).mkdir(parents=True)
        runs.link_latest(exp_dir, name)
    assert (exp_dir / "latest").resolve() == (exp_dir / "r2").resolve()
    assert runs.find_run_dir(tmp_path, "exp", "r1") == (exp_dir / "r1").resolve()
    assert runs.find_run_dir(tmp_path, "exp", str(exp_dir / "latest")) == (exp_dir / "r2").resolve()
    (tmp_path / "other" / "r9").mkdir(parents=True)
    with pytest.raises(ValueError, match="not a run of experiment 'exp'"):
        runs.find_run_dir(tmp_path, "exp", str(tmp_path / "other" / "r9"))
    with pytest.raises(ValueError, match="no run folder"):
        runs.find_run_dir(tmp_path, "exp", "r3")
    assert runs.resolve_run_dir(exp_dir) == (exp_dir / "r2").resolve()


def test_runs_listed_by_experiment_and_the_newest(fake_redis):
    import json

    for ns, t0 in (("exp/a-s1", 10.0), ("exp/b-s2", 30.0), ("exp2/c-s1", 50.0)):
        fake_redis.sadd(keys.runs(), ns)
        fake_redis.hset(keys.commander(ns), "state", json.dumps({"t0": t0}))
    assert runs.list_runs(fake_redis, "exp") == ["exp/a-s1", "exp/b-s2"]
    assert runs.newest_run(fake_redis, "exp") == "exp/b-s2"
    assert runs.newest_run(fake_redis, "exp/a-s1") == "exp/a-s1" and runs.newest_run(fake_redis, "nope") is None


def test_a_coordinator_without_a_run_name_takes_up_its_unfinished_run_or_starts_a_new_one(fake_redis, small_cfg, tmp_path):
    first = Coordinator(small_cfg, fake_redis, tmp_path)
    assert first.run_name.endswith("-s0") and first.exp == f"test_exp/{first.run_name}"
    first._claim()  # the run is in Redis, unfinished (its coordinator could die now)
    first.tb.close()
    assert (tmp_path / "test_exp" / "latest").resolve() == (tmp_path / first.exp).resolve()
    restart = Coordinator(small_cfg, fake_redis, tmp_path)
    assert restart.run_name == first.run_name  # a restart continues the run
    restart.tb.close()
    fresh = Coordinator(small_cfg, fake_redis, tmp_path, fresh=True)
    seed1 = copy.deepcopy(small_cfg)
    seed1.seed = 1
    other_seed = Coordinator(seed1, fake_redis, tmp_path)
    assert fresh.run_name != first.run_name and other_seed.run_name.endswith("-s1")
    fresh.tb.close()
    other_seed.tb.close()
    fake_redis.set(keys.stop(first.exp), "done")  # a finished run is not taken up again
    after = Coordinator(small_cfg, fake_redis, tmp_path)
    assert after.run_name not in (first.run_name, fresh.run_name)
    after.tb.close()
    with pytest.raises(CoordinatorError, match="needs the run.s name"):
        Coordinator(small_cfg, fake_redis, tmp_path, resume=True)
