"""A run's record is always true (issue 20, item 1): an eval or a collector task that finished no
episode has no reward. It is never the best, never passing, never plotted, never 0.0 in
evals.jsonl, summary.json, best.pt, TensorBoard, the progress line, `rqrl status` or a sweep.

The events are fed as the workers send them: a collector that finished no episode omits
``reward_mean``, ``reward_std``, ``avg_step_per_episode`` and ``avg_time_per_episode``; one of an
earlier version sent 0.0 there with ``real_episode_count`` 0, which must read the same.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

from easydict import EasyDict
from gymnasium.wrappers import NormalizeObservation

from common import blobstore, keys, streams
from coordinator import curve
from coordinator.commander import create_commander
from coordinator.daemon import Coordinator
from coordinator.offload import write_shipped_log
from coordinator.launcher import Progress
from coordinator.status import collect_status, render
from coordinator.sweep import run_curve, sweep_line


class FakeTB:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, value, step))

    def tags(self):
        return {t for t, _, _ in self.calls}


def _cfg(small_cfg, **commander):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.env.stop_value = -50.0  # negative returns, as Pong's or Acrobot's: 0.0 would pass
    cfg.commander.update({"collector_task_space": 2, "eval_every_train_iter": 1, "eval_interval": 0.0,
                          "confirm_eval_episodes": 0, **commander})
    return cfg


def finished(task, episodes, reward=None, legacy=False, policy_version=3):
    """A collector's ``finished`` event (decoded fields). ``reward`` None and not ``legacy``: the
    per-episode fields are absent; ``legacy``: an earlier collector's 0.0 with 0 episodes."""
    ev = {"type": "finished", "task_id": task["task_id"], "task_type": "collector", "eval_flag": task["eval_flag"],
          "buffer_id": task["buffer_id"], "policy_version": policy_version, "real_episode_count": episodes,
          "env_steps": 2824, "avg_time_per_step": 0.001, "ts": 1_700_000_000.0}
    if reward is not None:
        ev.update(reward_mean=reward, reward_std=1.5, avg_step_per_episode=100.0, avg_time_per_episode=0.3)
    elif legacy:
        ev.update(reward_mean=0.0, reward_std=0.0, avg_step_per_episode=0.0, avg_time_per_episode=0.0)
    return ev


def _eval_task(cm):
    cm.update_learner_info("L", {"train_iter": cm.train_iter + 1, "consumed_env_steps": 100})
    task = cm.get_collector_task()
    while not task["eval_flag"]:  # take the training tasks out of the way
        cm.finish_collector_task(task["task_id"], finished(task, 4, reward=-90.0))
        cm.update_learner_info("L", {"train_iter": cm.train_iter + 1, "consumed_env_steps": 100})
        task = cm.get_collector_task()
    return task


def test_an_eval_that_finished_no_episode_is_never_best_nor_passing(small_cfg):
    tb = FakeTB()
    cm = create_commander(_cfg(small_cfg), tb_logger=tb, run_id="r")
    cm.get_learner_task()
    real = _eval_task(cm)
    assert cm.finish_collector_task(real["task_id"], finished(real, 5, reward=-80.0)) is False
    assert cm.best_eval["reward_mean"] == -80.0
    for legacy in (False, True):  # absent figures, and an earlier collector's 0.0 with 0 episodes
        tb.calls.clear()
        phantom = _eval_task(cm)
        # 0.0 >= stop_value -50 would have converged the run
        assert cm.finish_collector_task(phantom["task_id"], finished(phantom, 0, legacy=legacy)) is False
        assert not cm.end_flag and cm.best_eval["task_id"] == real["task_id"]
        assert cm.best_eval["reward_mean"] == -80.0
        last = cm.last_eval
        assert last["task_id"] == phantom["task_id"] and "reward_mean" not in last and "reward_std" not in last
        assert cm.summary()["last_eval_reward_mean"] is None
        # TensorBoard: the eval's episode count and steps, no reward or per-episode figure
        assert "evaluator_iter/episode_count" in tb.tags()
        for tag in ("reward_mean", "reward_std", "avg_step_per_episode", "avg_time_per_episode"):
            assert f"evaluator_iter/{tag}" not in tb.tags() and f"evaluator_step/{tag}" not in tb.tags()
        assert all(v == v for _, v, _ in tb.calls)  # no NaN scalar either


def test_training_tasks_without_episodes_plot_no_reward(small_cfg):
    """Acrobot: 56 of 56 collector tasks finished no episode; none may plot reward_mean 0.0."""
    tb = FakeTB()
    cfg = _cfg(small_cfg, eval_every_train_iter=0)
    cm = create_commander(cfg, tb_logger=tb, run_id="r")
    cm.get_learner_task()
    for legacy in (False, True):
        task = cm.get_collector_task()
        cm.finish_collector_task(task["task_id"], finished(task, 0, legacy=legacy))
    assert {"collector_iter/env_steps", "collector_iter/episode_count", "collector_iter/avg_time_per_step"} <= tb.tags()
    assert not {t for t in tb.tags() if "reward" in t or "per_episode" in t}
    task = cm.get_collector_task()
    cm.finish_collector_task(task["task_id"], finished(task, 2, reward=-500.0))
    assert ("collector_iter/reward_mean", -500.0, 3) in tb.calls


def test_a_confirmation_eval_that_finished_no_episode_does_not_converge(small_cfg):
    cm = create_commander(_cfg(small_cfg, confirm_eval_episodes=20), run_id="r")
    cm.get_learner_task()
    passing = _eval_task(cm)
    assert cm.finish_collector_task(passing["task_id"], finished(passing, 5, reward=-10.0)) is False
    confirm = cm.get_collector_task()
    assert confirm["eval_flag"] and confirm["eval_episodes"] == 20
    assert cm.finish_collector_task(confirm["task_id"], finished(confirm, 0)) is False
    assert not cm.end_flag and cm.final_eval_task is None


def _route(c, ev):
    c.router.route(ev)
    c._persist(c.conn.pipeline(transaction=True)).execute()
    c.exports.export_best()


def test_the_coordinator_records_a_phantom_eval_with_episodes_0_and_no_reward(tmp_path, fake_redis, small_cfg, capsys):
    c = Coordinator(_cfg(small_cfg), fake_redis, tmp_path, run_name="r1")
    cm = c.commander
    cm.get_learner_task()
    tasks = []
    for reward, episodes in ((-80.0, 5), (None, 0)):
        task = _eval_task(cm)
        c.tasks.running[task["task_id"]] = {"task": task, "kind": "collector", "started": True}
        blobstore.put_versioned(fake_redis, keys.evaluated_policy(c.exp, task["task_id"]),
                                f"weights of {task['task_id']}".encode(), 3)
        _route(c, finished(task, episodes, reward=reward))
        tasks.append(task)
    real, phantom = tasks
    lines = [json.loads(ln) for ln in (c.out / "evals.jsonl").read_text().splitlines()]
    stored = [json.loads(x) for x in fake_redis.lrange(keys.evals(c.exp), 0, -1)]
    assert lines == stored and [r["task_id"] for r in lines] == [real["task_id"], phantom["task_id"]]
    assert lines[0]["reward_mean"] == -80.0 and lines[0]["episodes"] == 5
    assert lines[1]["episodes"] == 0 and "reward_mean" not in lines[1] and "reward_std" not in lines[1]
    # best.pt is the real eval's weights, never the phantom's
    assert (c.out / "best.pt").read_bytes() == f"weights of {real['task_id']}".encode()
    c._finish(2, "max_env_step 1 reached without convergence")
    summary = json.loads((c.out / "summary.json").read_text())
    assert summary["last_eval_reward_mean"] is None and summary["best_eval_reward_mean"] == -80.0
    closing = capsys.readouterr().out
    assert "last eval      - (stop_value -50.0)" in closing
    c.tb.close()


def test_the_progress_line_shows_no_number_for_a_phantom_eval(small_cfg):
    p = Progress(-50.0)
    task = {"task_id": "collector_task_1", "eval_flag": True, "buffer_id": "b"}
    p.update(finished(task, 5, reward=-80.0))
    assert "eval  -80.0 / -50" in p.line()
    for legacy in (False, True):
        p.update(finished(task, 0, legacy=legacy))
        assert "eval      - / -50" in p.line()
    p.from_summary({"envstep": 10, "train_iter": 2, "last_eval_reward_mean": None})
    assert p.eval is None


def test_curve_leaves_out_evals_without_episodes(tmp_path, capsys):
    run = tmp_path / "pong" / "r1"
    run.mkdir(parents=True)
    rows = [{"task_id": "e1", "envstep": 100, "reward_mean": -21.0, "reward_std": 0.0, "episodes": 5, "time": 1.0},
            {"task_id": "e2", "envstep": 200, "reward_mean": -20.0, "reward_std": 1.0, "episodes": 5, "time": 2.0},
            # the run's stop cut this eval short: an earlier coordinator wrote 0.0
            {"task_id": "e3", "envstep": 300, "reward_mean": 0.0, "reward_std": 0.0, "episodes": 0, "time": 3.0},
            {"task_id": "e4", "envstep": 400, "episodes": 0, "time": 4.0}]
    (run / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fig = curve.build_figure(curve.evals_from_folder(run)[0], 20.0)
    line = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "eval reward mean"][0]
    assert line.get_xdata().tolist() == [100, 200] and line.get_ydata().tolist() == [-21.0, -20.0]
    assert "best -20" in fig._suptitle.get_text() and "2 more finished no episode" in fig._suptitle.get_text()
    assert curve.main(["--run-dir", str(run), "--out", str(tmp_path / "c.png")]) == 0
    out = capsys.readouterr().out
    assert "2 evals, last reward_mean -20 at 200 env steps" in out and "2 more finished no episode" in out
    # Only evals without a reward: nothing to draw, said so
    (run / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[2:]))
    assert curve.main(["--run-dir", str(run), "--out", str(tmp_path / "d.png")]) == 1
    assert "none of the 2 evals" in capsys.readouterr().err and not (tmp_path / "d.png").exists()


def test_status_shows_no_number_as_dash_and_null(fake_redis):
    ns = "pong/r1"
    fake_redis.sadd(keys.runs(), ns)
    fake_redis.hset(keys.commander(ns), mapping=streams.encode_fields(
        {"envstep": 2824, "train_iter": 7, "last_eval_reward_mean": None, "stop_value": 20.0, "wall_seconds": 3.0}))
    st = collect_status(fake_redis)
    assert st["runs"][ns]["summary"]["last_eval_reward_mean"] is None
    assert "last eval - / stop_value 20.0" in render(st)


def test_sweep_curves_skip_phantom_evals_and_the_line_is_labelled(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    rows = [{"task_id": "e1", "envstep": 100, "reward_mean": -21.0, "episodes": 5},
            {"task_id": "e2", "envstep": 200, "reward_mean": 0.0, "episodes": 0},
            {"task_id": "e3", "envstep": 300, "episodes": 0}]
    (run / "evals.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run_curve(run) == [(100.0, -21.0)]
    a, b = Progress(20.0), Progress(20.0)
    a.envstep, a.eval = 1234, -20.5
    b.envstep = 99
    assert sweep_line({0: a, 1: b}, 12.3) == ("seed 0: 1,234 env steps, eval -20.5 | seed 1: 99 env steps, eval - "
                                              "(stop_value 20) | 12 s")


# ---------------------------------------------------------------- item 2: curve reads the run's own record

def test_curve_reads_the_runs_own_folder_and_never_guesses_a_redis(tmp_path, monkeypatch, capsys):
    """A run folder without evals.jsonl yet (running, or failed before an eval): `rqrl curve --exp`
    says so and touches no Redis it was not told about (it used to ask 127.0.0.1:6379)."""
    asked = []
    monkeypatch.setattr("common.connection.connect", lambda url=None, **kw: asked.append(url))
    monkeypatch.delenv("RQRL_REDIS_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cp" / "20261130T021500Z-s0").mkdir(parents=True)
    (tmp_path / "cp" / "latest").symlink_to("20261130T021500Z-s0", target_is_directory=True)
    assert curve.main(["--exp", "cp"]) == 1
    err = capsys.readouterr().err
    assert "20261130T021500Z-s0 has no evals.jsonl yet" in err and "--redis-url" in err
    assert curve.main(["--exp", "cp/20261130T021500Z-s0"]) == 1
    assert curve.main(["--exp", "other"]) == 1
    assert "no run folder other/" in capsys.readouterr().err
    assert asked == []


# ---------------------------------------------------------------- item 3: exp_name is one plain folder name

def test_exp_name_that_is_a_path_is_refused_naming_the_key(small_cfg, tmp_path, monkeypatch, capsys):
    import pytest

    from common import keys as k
    from common.config import ConfigError, apply_overrides
    from coordinator.cli import main as rqrl_main

    for bad in ("../escape", "/tmp/abs", "a/b", ".", ".."):
        with pytest.raises(ConfigError, match="exp_name"):
            apply_overrides(small_cfg, [f"exp_name={bad}"])
        with pytest.raises(ValueError, match="exp_name"):
            k.namespace(bad, "r1")
    for bad in ("..", ".", "a/b", "latest", "tensorboard"):
        with pytest.raises(ValueError, match="run_name"):
            k.namespace("cp", bad)
    assert apply_overrides(small_cfg, ["exp_name=cartpole.v2-a"]).exp_name == "cartpole.v2-a"
    # The CLI refuses before it creates anything, inside or outside the working folder.
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    cfg_file = str(__import__("pathlib").Path(__file__).resolve().parents[2] / "deploy/configs/cartpole_dqn.py")
    assert rqrl_main(["train", cfg_file, "--set", "exp_name=../escape"]) == 1
    assert "config key 'exp_name'" in capsys.readouterr().err
    assert rqrl_main(["train", cfg_file, "--name", ".."]) == 1
    assert "config error: --name: run_name '..'" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"] and list(work.iterdir()) == []


def test_clean_of_an_experiment_matches_that_experiment_exactly(fake_redis):
    """`rqrl clean --exp a --yes` deleted the keys of experiment `a/b` too (a nested name an
    earlier version accepted)."""
    from coordinator.clean import clean

    mine, nested = "a/20261130T021500Z-s0", "a/b/20261130T021500Z-s0"
    for ns in (mine, nested):
        fake_redis.hset(keys.commander(ns), mapping={"envstep": 1})
        fake_redis.xadd(keys.events(ns), {"type": "started"})
        fake_redis.sadd(keys.runs(), ns)
    import io
    assert clean(fake_redis, "a", yes=True, out=io.StringIO()) == 0
    assert not fake_redis.exists(keys.commander(mine), keys.events(mine))
    assert fake_redis.exists(keys.commander(nested), keys.events(nested)) == 2
    assert fake_redis.smembers(keys.runs()) == {nested.encode()}


# ---------------------------------------------------------------- item 8: --set takes the JSON / YAML spellings

def test_set_accepts_true_false_null_as_users_type_them(small_cfg):
    from common.config import apply_overrides

    for word, want in (("true", True), ("TRUE", True), ("True", True), ("false", False), ("False", False)):
        cfg = apply_overrides(small_cfg, [f"policy.other.replay_buffer.priority={word}"])
        assert cfg.policy.other.replay_buffer.priority is want
    for word in ("null", "~", "None"):
        assert apply_overrides(small_cfg, [f"commander.collector_task_space={word}"]).commander.collector_task_space is None
    cfg = apply_overrides(small_cfg, ["policy.model.hidden_size_list=[64, 64]", "env.env_id=Acrobot-v1",
                                      'env.env_kwargs={"max_episode_steps": 100}', "policy.learn.learning_rate=1e-3"])
    assert cfg.policy.model.hidden_size_list == [64, 64] and cfg.env.env_id == "Acrobot-v1"
    assert cfg.env.env_kwargs == {"max_episode_steps": 100} and cfg.policy.learn.learning_rate == 1e-3


# ---------------------------------------------------------------- item 5: stateful env wrappers

def test_stateful_wrappers_are_refused_by_name(small_cfg):
    """NormalizeObservation's running mean lived in each task's env and never reached final.pt:
    every task and `rqrl eval` restarted it. Refused at config time, naming the key."""
    import pytest

    from common import spaces
    from common.config import ConfigError, apply_overrides

    for type_ in ("gymnasium.wrappers:NormalizeObservation", "gymnasium.wrappers:NormalizeReward",
                  "gymnasium.wrappers.stateful_observation:NormalizeObservation"):
        with pytest.raises(ConfigError, match=r"env.wrappers\[0\].type.*running statistics"):
            apply_overrides(small_cfg, [f'env.wrappers=[{{"type": "{type_}", "kwargs": {{}}}}]'])
    # Another name for one (a subclass) is found when the env is built (the probe before launch).
    cfg = apply_overrides(small_cfg, ['env.wrappers=[{"type": "tests.unit.test_run_records:MyNormalizer"}]'])
    with pytest.raises(spaces.SpaceError, match=r"env.wrappers\[0\].type.*running statistics"):
        spaces.probe(cfg)
    # Stateless wrappers are fine.
    cfg = apply_overrides(small_cfg, ['env.wrappers=[{"type": "gymnasium.wrappers:ClipReward", '
                                      '"kwargs": {"min_reward": -1, "max_reward": 1}}]'])
    assert spaces.probe(cfg).action_n == 2


class MyNormalizer(NormalizeObservation):
    """A stateful wrapper under another name (imported by the probe from this module)."""


# ---------------------------------------------------------------- item 7: clocks and counters

def test_the_progress_clock_and_counters_start_where_the_run_is(small_cfg, tmp_path):
    """The line counts the run's seconds from the launch (as summary.json), and a resumed run's
    line starts at its env steps, train iteration and last eval, not at 0."""
    import time as _t

    launch = _t.time() - 30.0
    point = {"wall_seconds": 100.0, "ckpt_train_iter": 500, "consumed_env_steps": 4000,
             "commander": {"total_collector_env_step": 4200, "evaluator_info": [
                 {"task_id": "e1", "reward_mean": 150.0, "episodes": 5}]}}
    p = Progress(195.0, t0=launch - point["wall_seconds"], resume=point)
    assert (p.envstep, p.train_iter, p.eval) == (4200, 500, 150.0)
    line = p.line()
    assert "env steps    4,200 | train iter     500 | eval  150.0 / 195" in line
    assert 129.0 <= float(line.split(" / 195 | ", 1)[1].split()[0]) <= 140.0  # 100 s before + 30 s since the launch
    c = Coordinator(_cfg(small_cfg), fakeredis_conn(), tmp_path, run_name="clock", started_at=launch)
    try:
        assert 29.0 <= c._write_summary()["wall_seconds"] <= 40.0
    finally:
        c.tb.close()


def fakeredis_conn():
    import fakeredis

    return fakeredis.FakeRedis()


def test_a_resumed_runs_curve_counts_no_pause(tmp_path, small_cfg):
    """Evals record the run's wall clock: after a resume from the folder the pause is not counted,
    so `rqrl curve` of the folder draws what the run's own curve.png does (it drew the pause)."""
    import time as _t

    now = _t.time()
    first = Coordinator(_cfg(small_cfg), fakeredis_conn(), tmp_path, run_name="r1", started_at=now - 100.0)
    first._claim()
    cm = first.commander
    cm.get_learner_task()
    task = _eval_task(cm)
    first.tasks.running[task["task_id"]] = {"task": task, "kind": "collector", "started": True}
    _route(first, dict(finished(task, 5, reward=-90.0), ts=now - 3600.0))  # played an hour ago, at 100 s of run time
    blobstore.put_versioned(first.conn, keys.ckpt(first.exp, "latest"), b"ckpt", 7)
    first.resume_point.save(first.run_id, first.t0)
    first.tb.close()
    first.ownership.release()
    # An hour later, the private Redis gone: --resume from the folder.
    second = Coordinator(_cfg(small_cfg), fakeredis_conn(), tmp_path, run_name="r1", resume=True, started_at=now)
    second._claim()
    cm = second.commander
    task = _eval_task(cm)
    second.tasks.running[task["task_id"]] = {"task": task, "kind": "collector", "started": True}
    _route(second, dict(finished(task, 5, reward=-70.0), ts=now))
    second.tb.close()
    walls = [json.loads(ln)["wall_seconds"] for ln in (tmp_path / "test_exp" / "r1" / "evals.jsonl").read_text().splitlines()]
    assert 99.0 <= walls[0] <= 110.0 and 99.0 <= walls[1] <= 110.0  # not 3,700: no pause counted
    fig = curve.build_figure(curve.evals_from_folder(tmp_path / "test_exp" / "r1")[0], -50.0)
    wall_axis = fig.axes[1]
    xs = [ln for ln in wall_axis.get_lines() if ln.get_label() == "eval reward mean"][0].get_xdata().tolist()
    assert xs == walls and wall_axis.get_xlabel() == "wall time since start (s)"


def test_status_of_a_finished_run_lists_no_tasks(fake_redis):
    ns = "cp/r1"
    fake_redis.sadd(keys.runs(), ns)
    fake_redis.hset(keys.commander(ns), mapping={"envstep": 100})
    fake_redis.hset(keys.tasks(ns), mapping={"collector_task_1": json.dumps({"kind": "collector", "started": True})})
    fake_redis.set(keys.stop(ns), "converged")  # its coordinator is gone: no keys.coordinator_alive
    st = collect_status(fake_redis)
    assert st["runs"][ns]["tasks_alive"] == [] and "heartbeat ttl" not in render(st)
    fake_redis.set(keys.coordinator_alive(ns), "coordinator-1")  # still wrapping up: its tasks show
    assert [t["task_id"] for t in collect_status(fake_redis)["runs"][ns]["tasks_alive"]] == ["collector_task_1"]


def test_a_run_that_never_trained_exports_no_final_pt(tmp_path, fake_redis, small_cfg, capsys):
    c = Coordinator(_cfg(small_cfg), fake_redis, tmp_path, run_name="r0")
    lt = c.commander.get_learner_task()
    blobstore.put_versioned(fake_redis, keys.ckpt(c.exp, "final_model"), b"untrained bundle", 0)
    blobstore.put_versioned(fake_redis, keys.policy(c.exp, lt["policy_id"]), b"untrained weights", 0)
    c._finish(1, "10 tasks failed in a row")
    assert not (c.out / "final.pt").exists()
    assert json.loads((c.out / "summary.json").read_text())["final_pt"] == ""
    assert "final policy   not saved" in capsys.readouterr().out
    c.tb.close()
    # One train iteration later the learner's final checkpoint is exported.
    c = Coordinator(_cfg(small_cfg), fake_redis, tmp_path, run_name="r1")
    blobstore.put_versioned(fake_redis, keys.ckpt(c.exp, "final_model"), b"trained bundle", 1)
    c._finish(2, "max_train_iter 1 reached")
    assert (c.out / "final.pt").read_bytes() == b"trained bundle"
    c.tb.close()


def test_a_tasks_log_lines_and_scalars_reach_the_run_folder_as_one_tensorboard_run(tmp_path, fake_redis, small_cfg):
    """A learner on another machine (any cwd) ships its lines and scalars through Redis; the
    coordinator writes them into its run folder, the scalars beside its own in one event file,
    and TensorBoard pointed at ./EXP/tensorboard finds that run once (not again via `latest`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.io_wrapper import GetLogdirSubdirectories

    from common.logs import ShippedScalars, close_logger, shipped_logger

    c = Coordinator(_cfg(small_cfg), fake_redis, tmp_path, run_name="r1")
    c._claim()
    learner = c.commander.get_learner_task()
    c.tasks.running[learner["task_id"]] = {"task": learner, "kind": "learner", "started": True}
    log = shipped_logger(fake_redis, c.exp, learner["task_id"], "learner", "learner")
    log.info("iter 100: total_loss=0.5")
    log.warning("checkpoint latest saved")
    scalars = ShippedScalars(fake_redis, c.exp, learner["task_id"], "learner")
    scalars.add_scalar("learner_iter/total_loss", 0.5, 100, walltime=1_700_000_000.0)
    scalars.add_scalar("learner_step/total_loss", 0.5, 2000, walltime=1_700_000_000.0)
    scalars.close()
    close_logger(log)
    assert not log.handlers
    while c._process_events(block_ms=1):
        pass
    c.tb.close()
    text = (c.out / "log" / "learner" / "learner.txt").read_text()
    assert "iter 100: total_loss=0.5" in text and "WARNING" in text and "checkpoint latest saved" in text
    acc = EventAccumulator(str(c.out / "tensorboard")).Reload()
    (event,) = acc.Scalars("learner_iter/total_loss")
    assert (event.step, event.value, event.wall_time) == (100, 0.5, 1_700_000_000.0)
    assert acc.Scalars("learner_step/total_loss")[0].step == 2000
    exp_dir = tmp_path / "test_exp"
    assert (exp_dir / "latest").is_symlink()
    assert [Path(d).resolve() for d in GetLogdirSubdirectories(str(exp_dir / "tensorboard"))] == [
        (c.out / "tensorboard").resolve()]
    # A bad log name never writes outside the run folder.
    import pytest as _pytest

    with _pytest.raises(ValueError):
        write_shipped_log(c.out, {"name": "../../escape", "lines": "x"})


def test_the_progress_line_gives_rates_and_the_time_left_of_the_budget_that_binds_first():
    """Rates over the learner's recent reports; time left against whichever budget runs out
    first at those rates (here the env steps: 9,000 left at 100/s beats 1,800 s of wall clock)."""
    from coordinator.progress import time_left

    t = 1_000_000.0
    p = Progress(195.0, t0=t - 60.0, budgets={"max_env_step": 10_000.0, "max_wall_seconds": 1860.0})
    p.update({"type": "learner_info", "consumed_env_steps": 0, "train_iter": 0, "ts": t - 10})
    p.update({"type": "learner_info", "consumed_env_steps": 1000, "train_iter": 500, "ts": t})
    assert p.rates() == (100.0, 50.0)
    key, seconds, used = time_left(p.budgets, 1000, 500, 60.0, 100.0, 50.0)
    assert (key, seconds, used) == ("max_env_step", 90.0, 0.1)
    assert time_left({"max_wall_seconds": 100.0}, 0, 0, 60.0, 0.0, 0.0) == ("max_wall_seconds", 40.0, 0.6)
    assert time_left({"max_train_iter": 100.0}, 0, 0, 1.0, 0.0, 0.0) is None  # no rate yet: no estimate
    assert "100 env steps/s, 50.0 train iter/s" in p.line()
    assert Progress(195.0).tail().endswith("no budget: runs to stop_value")
    # The closing line: summary.json's figures and the run's average rates.
    p.from_summary({"envstep": 3000, "train_iter": 1200, "wall_seconds": 40.0, "last_eval_reward_mean": 150.0})
    assert p.line().endswith("|   40.0 s | return      - | avg 75 env steps/s, 30.0 train iter/s")


def test_a_converged_run_exports_the_weights_its_eval_played_not_the_learners_latest(tmp_path, fake_redis, small_cfg):
    """final.pt of a converged run is the evaluated bundle of the converging eval (policy version 3),
    though the learner has trained on since (its final_model is version 9): issue 21, planted bug 1."""
    c = Coordinator(_cfg(small_cfg), fake_redis, tmp_path, run_name="r1")
    cm = c.commander
    cm.get_learner_task()
    blobstore.put_versioned(fake_redis, keys.ckpt(c.exp, "final_model"), b"the learner's latest weights", 9)
    task = _eval_task(cm)
    c.tasks.running[task["task_id"]] = {"task": task, "kind": "collector", "started": True}
    blobstore.put_versioned(fake_redis, keys.evaluated_policy(c.exp, task["task_id"]), b"the evaluated weights", 3)
    _route(c, finished(task, 5, reward=-10.0))
    assert cm.end_flag
    c._finish(0, "converged")
    summary = json.loads((c.out / "summary.json").read_text())
    assert (c.out / "final.pt").read_bytes() == b"the evaluated weights"
    assert summary["final_eval_task"] == task["task_id"] and summary["final_policy_version"] == 3
    c.tb.close()


def test_git_commit_marks_a_checkout_with_changed_tracked_files_dirty(tmp_path):
    from coordinator.sweep import git_commit

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    assert git_commit(tmp_path) is None  # not a checkout
    git("init", "-q")
    (tmp_path / "preset.py").write_text("n = 4\n")
    git("add", "preset.py")
    git("commit", "-q", "-m", "c")
    head = git("rev-parse", "--short", "HEAD")
    (tmp_path / "untracked.txt").write_text("x")  # untracked files are not the code that ran
    assert git_commit(tmp_path) == head
    (tmp_path / "preset.py").write_text("n = 1\n")
    assert git_commit(tmp_path) == f"{head}-dirty"
