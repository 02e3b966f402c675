"""Per-episode training returns, as they happen: the collector's batching (workers/episode_shipper.py),
the coordinator's episode log and TensorBoard scalars (coordinator/episode_log.py, router.py), the
progress line's ``return`` field and ``rqrl status``'s line."""

from __future__ import annotations

import copy
import json

import pytest
from easydict import EasyDict

from common import events, keys, streams
from common.messages import MessageError, TrainEpisode
from coordinator.daemon import Coordinator
from coordinator.episode_log import EpisodeLog
from coordinator.progress import Progress
from coordinator.status import collect_status, render
from tests.fakes import FakeComm
from tests.fixtures import long_envs  # noqa: F401  (registers Countdown-v0)
from tests.unit.test_persistent_envs import _cfg as countdown_cfg, _learner_weights
from workers.collector import Collector
from workers.episode_shipper import LENGTH_TAG, RETURN_TAG, EpisodeShipper

NS = "test_exp/r1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _shipper_on(conn, clock):
    return EpisodeShipper(lambda f: events.emit(conn, NS, "scalars", "t1", "collector", **f), clock=clock)


def _events(conn):
    return [streams.decode_fields(raw) for _, raw in conn.xrange(keys.events(NS))]


def test_episodes_within_a_second_go_out_in_one_event_and_the_first_at_once(fake_redis):
    clock = Clock()
    shipper = _shipper_on(fake_redis, clock)
    shipper.add([10.0, 12.0], [10, 12], envstep=24, policy_version=3)  # the first: sent at once
    assert len(_events(fake_redis)) == 1
    for i in range(50):  # within the second: queued
        clock.now += 0.01
        shipper.add([float(i)], [5], envstep=30 + i, policy_version=4)
        shipper.tick()
    assert len(_events(fake_redis)) == 1
    clock.now += 0.5  # a second after the first event: the tick sends all 50 in one
    shipper.tick()
    evs = _events(fake_redis)
    assert len(evs) == 2 and evs[1]["type"] == "scalars"
    sent = [TrainEpisode.from_dict(d) for d in json.loads(evs[1]["episodes"])]
    assert [e.ret for e in sent] == [float(i) for i in range(50)] and sent[-1].envstep == 79
    scalars = json.loads(evs[1]["scalars"])  # what a coordinator of the previous release writes
    assert [s[:3] for s in scalars[:2]] == [[RETURN_TAG, 0.0, 30], [LENGTH_TAG, 5.0, 30]] and len(scalars) == 100


def test_a_task_with_no_finished_episode_sends_nothing(fake_redis):
    clock = Clock()
    shipper = _shipper_on(fake_redis, clock)
    for _ in range(10):
        clock.now += 5.0
        shipper.tick()
    shipper.ship()
    assert _events(fake_redis) == []


def test_a_collector_task_ships_every_finished_training_episode():
    """Countdown episodes of 10 steps on 2 envs, 50 steps per env: 10 episodes, each shipped with
    the env step it ended at, the same ones the finish info counts."""
    cfg = countdown_cfg("dqn", length=10, task_env_steps=100)
    comm = FakeComm(_learner_weights(cfg))
    task = {"eval_flag": False, "seed": 7, "task_id": "t0", "collect_setting": {"eps": 0.5}, "envstep": 1000}
    info = Collector(cfg, task, comm).run()
    shipped = [TrainEpisode.from_dict(d) for f in comm.episode_events for d in json.loads(f["episodes"])]
    assert len(shipped) == info["real_episode_count"] == 10
    assert {e.length for e in shipped} == {10}
    assert sorted({e.envstep for e in shipped}) == [1000 + 20 * k for k in range(1, 6)]
    assert sum(e.ret for e in shipped) / 10 == pytest.approx(info["reward_mean"])


class FakeTB:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def add_scalar(self, tag, value, step, walltime=None):
        self.calls.append((tag, value, step))


def _running_coordinator(tmp_path, fake_redis, small_cfg):
    c = Coordinator(EasyDict(copy.deepcopy(small_cfg)), fake_redis, tmp_path, run_name="r1")
    c.router.tb = FakeTB()
    c.commander.get_learner_task()  # collectors are handed out once a learner is
    task = c.commander.get_collector_task()
    c.tasks.running[task["task_id"]] = {"task": task, "kind": "collector", "started": True}
    return c, task["task_id"]


def _episodes_event(tid, rows):
    ep = [TrainEpisode(envstep=s, ret=r, length=n, policy_version=v, ts=1.0) for s, r, n, v in rows]
    return {"type": "scalars", "task_id": tid, "task_type": "collector",
            "scalars": json.dumps([[RETURN_TAG, e.ret, e.envstep, e.ts] for e in ep]
                                  + [[LENGTH_TAG, float(e.length), e.envstep, e.ts] for e in ep]),
            "episodes": json.dumps([e.to_dict() for e in ep])}


def test_the_router_writes_episodes_jsonl_tensorboard_and_the_summary(tmp_path, fake_redis, small_cfg):
    c, tid = _running_coordinator(tmp_path, fake_redis, small_cfg)
    assert "train_return_mean" not in c._summary_fields()  # no number before the first episode
    c.router.route(_episodes_event(tid, [(40, 20.0, 20, 3), (64, 24.0, 24, 3)]))
    c.router.route(_episodes_event(tid, [(90, 28.0, 26, 5)]))
    lines = [json.loads(ln) for ln in (c.out / "episodes.jsonl").read_text().splitlines()]
    assert [(d["envstep"], d["return"], d["length"], d["policy_version"], d["task_id"]) for d in lines] == [
        (40, 20.0, 20, 3, tid), (64, 24.0, 24, 3, tid), (90, 28.0, 26, 5, tid)]
    assert all(isinstance(d["time"], float) for d in lines)
    assert [(v, s) for t, v, s in c.router.tb.calls if t == RETURN_TAG] == [(20.0, 40), (24.0, 64), (28.0, 90)]
    assert [(v, s) for t, v, s in c.router.tb.calls if t == LENGTH_TAG] == [(20.0, 40), (24.0, 64), (26.0, 90)]
    fields = c._write_summary()
    assert (fields["train_return_mean"], fields["train_episodes"]) == (24.0, 3)
    fake_redis.sadd(keys.runs(), c.exp)  # what the run's claim does
    text = render(collect_status(fake_redis, c.exp))
    assert "train return 24 (mean of the last 3 training episodes)" in text


def test_a_bad_episodes_field_writes_nothing_and_a_learners_scalars_no_episode(tmp_path, fake_redis, small_cfg):
    c, tid = _running_coordinator(tmp_path, fake_redis, small_cfg)
    bad = _episodes_event(tid, [(40, 20.0, 20, 3)])
    bad["episodes"] = json.dumps([{"envstep": 40, "return": 20.0, "length": 0, "policy_version": 3, "ts": 1.0}])
    with pytest.raises(MessageError, match=r"episodes of task .*\[0\].*'length'"):
        c.router.route(bad)
    assert c.router.tb.calls == [] and not (c.out / "episodes.jsonl").exists()
    plain = {"type": "scalars", "task_id": tid, "task_type": "collector", "scalars": json.dumps([["x", 1.0, 5, 1.0]])}
    c.router.route(plain)  # a worker of the previous release: its scalars, no episode
    assert c.router.tb.calls == [("x", 1.0, 5)] and not (c.out / "episodes.jsonl").exists()


def test_the_window_holds_the_last_100_returns(tmp_path):
    log = EpisodeLog(tmp_path)
    log.add("t", [TrainEpisode(envstep=i, ret=float(i), length=1, policy_version=0, ts=0.0) for i in range(150)])
    assert log.mean_return() == pytest.approx(sum(range(50, 150)) / 100)
    assert log.count == 150 and len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 150


def test_the_progress_line_shows_the_mean_return_of_the_last_100_episodes():
    p = Progress(195.0)
    assert " s | return      - | " in p.line()
    rows = [(10 * i, float(i), 10, 0) for i in range(120)]
    p.update(_episodes_event("t", rows[:60]))
    p.update(_episodes_event("t", rows[60:]))
    assert p.return_text() == f"return {sum(range(20, 120)) / 100:>6.1f}"
    p.update({"type": "scalars", "task_id": "t", "episodes": "not json"})  # ignored: the line goes on
    p.from_summary({"train_return_mean": 180.25, "wall_seconds": 10.0, "envstep": 100, "train_iter": 5})
    assert p.return_text() == "return  180.2"


def test_the_progress_line_shows_the_policy_lag_the_learner_reports_while_the_run_goes():
    p = Progress(195.0)
    assert "lag" not in p.line()  # before the learner's first report
    p.update({"type": "learner_info", "ts": 1.0, "train_iter": 50, "consumed_env_steps": 500,
              "policy_lag_mean": 3.24, "policy_lag_p50": 3.0, "policy_lag_p95": 8.0, "policy_lag_max": 11.0})
    assert " | return      - | lag 3.2/8 | " in p.line()
    p.update({"type": "learner_info", "ts": 2.0, "train_iter": 60, "consumed_env_steps": 600})  # an older learner
    assert "lag 3.2/8" in p.line()
    p.from_summary({"wall_seconds": 10.0, "envstep": 600, "train_iter": 60})
    assert "lag" not in p.line()  # the closing line: the run's figures, no momentary lag
