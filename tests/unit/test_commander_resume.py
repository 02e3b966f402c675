"""The commander's ``state_dict`` / ``load_state_dict`` round trip, as a restarted coordinator uses it,
and its players, as the resume point reads them.

A commander restored from the JSON the coordinator persists must hold the same state and then
act exactly like the one it replaces: same task space, eval slot, learner resume flag, ids and
seeds, same convergence decision. The state is derived from the commander's dataclass fields,
and a state written by an older commander (main 96c7719) still loads.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import fakeredis
import pytest
from easydict import EasyDict

from common import blobstore, keys
from common.messages import LearnerTask
from coordinator.commander import Player, SoloState, create_commander
from coordinator.eval_judge import EvalJudge, reached_stop_value
from coordinator.resume import ResumePoint
from coordinator.task_spaces import TaskSpaces
from coordinator.wire_state import WireState


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def finished(task, env_steps=100, reward_mean=10.0, train_iter=150):
    return {"task_id": task["task_id"], "eval_flag": task["eval_flag"], "buffer_id": task["buffer_id"],
            "policy_version": train_iter, "real_episode_count": 4, "env_steps": env_steps,
            "avg_step_per_episode": 25.0, "avg_time_per_step": 0.02, "avg_time_per_episode": 0.5,
            "reward_mean": reward_mean, "reward_std": 1.0}


def without_id(task):
    return {k: v for k, v in task.items() if k != "task_id"} if task else task


def test_restored_commander_continues_exactly_like_the_original(small_cfg):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(confirm_eval_episodes=0, collector_task_space=2, eval_task_space=1, eval_every_train_iter=100,
                         eval_interval=0, eval_every_env_step=0)
    cfg.env.stop_value = 195
    clock = Clock(1000.0)
    a = create_commander(cfg, clock=clock, run_id="run_a")
    learner = a.get_learner_task()
    a.update_learner_info(learner["task_id"], {"train_iter": 100, "consumed_env_steps": 400})
    ev0 = a.get_collector_task()    # eval due (100 train iters, none before): the eval slot
    assert ev0["eval_flag"]
    a.finish_collector_task(ev0["task_id"], finished(ev0, reward_mean=30.0, train_iter=100))
    a.update_learner_info(learner["task_id"], {"train_iter": 200, "consumed_env_steps": 900})
    ev = a.get_collector_task()     # eval due again (200 - 100 >= 100 train iters)
    c1 = a.get_collector_task()
    c2 = a.get_collector_task()
    assert ev["eval_flag"] and not c1["eval_flag"] and not c2["eval_flag"]
    assert a.get_collector_task() is None  # both collector slots taken
    a.finish_collector_task(c1["task_id"], finished(c1, env_steps=300))
    a.notify_fail_learner_task(learner)  # the learner died: its replacement must resume
    clock.t += 5

    state = json.loads(json.dumps(a.state_dict()))  # what the coordinator persists in Redis
    b = create_commander(cfg, clock=clock, run_id="run_b")
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict()
    assert b.summary() == a.summary()

    # Both go on identically.
    la, lb = a.get_learner_task(), b.get_learner_task()
    assert la["resume"] is True and la["policy_id"] == learner["policy_id"] and la["run_id"] == "run_a"
    assert without_id(lb) == without_id(la)
    ca, cb = a.get_collector_task(), b.get_collector_task()  # the slot c1 freed
    assert ca is not None and not ca["eval_flag"] and ca["envstep"] == 900  # max(learner report, finished tasks)
    assert without_id(cb) == without_id(ca)
    assert a.get_collector_task() is None and b.get_collector_task() is None
    # The eval in flight before the restart is still known: finishing it frees the eval slot.
    low = finished(ev, reward_mean=50.0, train_iter=200)
    assert a.finish_collector_task(ev["task_id"], low) is False
    assert b.finish_collector_task(ev["task_id"], low) is False
    # The next eval is due 100 train iters after the last one (at 200), not before.
    for c in (a, b):
        c.update_learner_info(la["task_id"], {"train_iter": 250, "consumed_env_steps": 1000})
    assert a.get_collector_task() is None and b.get_collector_task() is None
    for c in (a, b):
        c.update_learner_info(la["task_id"], {"train_iter": 300, "consumed_env_steps": 1100})
    ea, eb = a.get_collector_task(), b.get_collector_task()
    assert ea["eval_flag"] and without_id(eb) == without_id(ea)
    high = finished(ea, reward_mean=200.0, train_iter=300)
    assert a.finish_collector_task(ea["task_id"], high) is True
    assert b.finish_collector_task(ea["task_id"], dict(high, task_id=eb["task_id"])) is True
    assert a.end_flag and b.end_flag
    assert [r["reward_mean"] for r in b.evaluations] == [r["reward_mean"] for r in a.evaluations] == [30.0, 50.0, 200.0]


def _cfg(small_cfg, **commander):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(dict(dict(confirm_eval_episodes=8, collector_task_space=2, eval_task_space=1,
                                   eval_every_train_iter=100, eval_interval=0, eval_every_env_step=0), **commander))
    cfg.env.stop_value = 195
    return cfg


def test_the_solo_commander_has_one_main_player_whose_ids_are_its_learners(small_cfg):
    c = create_commander(_cfg(small_cfg), clock=Clock(1000.0), run_id="run_p")
    assert c.players() == [Player("main", "", "", "latest", "main")]  # no learner task yet: ids ""
    learner = c.get_learner_task()
    assert LearnerTask.from_dict(learner).ckpt_name == "latest"  # the wire leaves the default off
    assert c.players() == [Player("main", learner["policy_id"], learner["buffer_id"], "latest")]
    at_stop = c.state_dict()
    c.finish_learner_task(learner["task_id"], {"buffer_id": learner["buffer_id"]})
    assert c.players()[0].policy_id == "" and c.players()[0].buffer_id == ""
    # The players of a state taken before the finish are that state's, not the live ones.
    assert c.players(at_stop) == [Player("main", learner["policy_id"], learner["buffer_id"], "latest")]
    assert c.state_dict() != at_stop  # reading a state's players loads nothing into the commander


def _mid_run(cfg, clock):
    """A commander of a two-rank learner group, one rank lost, an eval under confirmation in flight
    in the eval slot, a collector task running and one finished."""
    cfg.policy.learn.learner_num = 2
    a = create_commander(cfg, clock=clock, run_id="run_a")
    ranks = [a.get_learner_task(), a.get_learner_task()]
    a.update_learner_info(ranks[0]["task_id"], {"train_iter": 100, "consumed_env_steps": 400})
    ev = a.get_collector_task()
    c1, c2 = a.get_collector_task(), a.get_collector_task()
    a.finish_collector_task(c1["task_id"], finished(c1, env_steps=300, train_iter=100))
    clock.t += 3
    assert a.finish_collector_task(ev["task_id"], finished(ev, reward_mean=199.0, train_iter=100)) is False
    conf = a.get_collector_task()  # the confirmation, replaying ev's weights
    assert conf["eval_flag"] and conf["eval_episodes"] == 8 and ev["task_id"] in conf["eval_policy_key"]
    a.notify_fail_learner_task(ranks[1])  # the group is lost once ...
    a.notify_fail_learner_task(ranks[0])  # ... whichever rank reports
    return a, ranks, ev, c2, conf


def test_a_mid_run_state_round_trips_and_both_commanders_go_on_alike(small_cfg):
    cfg, clock = _cfg(small_cfg), Clock(1000.0)
    a, ranks, ev, c2, conf = _mid_run(cfg, clock)
    state = json.loads(json.dumps(a.state_dict()))
    assert state["confirm"] == {"task_id": ev["task_id"], "dispatched": conf["task_id"]}
    assert state["lost_group"] == ranks[0]["group_id"] and state["eval_own_slot"] is True
    b = create_commander(cfg, clock=clock, run_id="other")
    b.load_state_dict(state)
    assert b.state_dict() == a.state_dict() and b.players() == a.players()
    assert b.eval_bundles_in_use == a.eval_bundles_in_use == {ev["task_id"]}
    # The lost group's other rank changes nothing on either; the replacement group resumes the player.
    for c in (a, b):
        c.notify_fail_learner_task(ranks[1])
    la = [a.get_learner_task(), a.get_learner_task()]
    lb = [b.get_learner_task(), b.get_learner_task()]
    strip = ("task_id", "group_id")
    assert [{k: v for k, v in t.items() if k not in strip} for t in la] == \
           [{k: v for k, v in t.items() if k not in strip} for t in lb]
    assert la[0]["resume"] is True and la[0]["policy_id"] == ranks[0]["policy_id"] and la[0]["run_id"] == "run_a"
    assert without_id(b.get_collector_task()) == without_id(a.get_collector_task())  # c1's slot
    assert a.get_collector_task() is None and b.get_collector_task() is None
    # The confirmation passes on both: 199 - 2 * 1 / sqrt(8) >= 195.
    done = dict(finished(conf, reward_mean=199.0, train_iter=100), confirmation=True, real_episode_count=8)
    assert a.finish_collector_task(conf["task_id"], done) is True
    assert b.finish_collector_task(conf["task_id"], done) is True
    assert a.final_eval_task == b.final_eval_task == conf["task_id"]  # it played the weights that passed
    assert b.state_dict() == a.state_dict()


# What main 96c7719's SoloCommander.state_dict wrote (resume.json / the coordinator's Redis state)
# with an eval under confirmation in flight in the eval slot.
_STATE_96C7719 = {
    "collector_task_space": {"min_val": 0, "max_val": 2, "cur": 1},
    "learner_task_space": {"min_val": 0, "max_val": 1, "cur": 1},
    "learner_info": [{"train_iter": 0}, {"train_iter": 100, "consumed_env_steps": 400}],
    "total_collector_env_step": 0,
    "evaluator_info": [{"task_id": "collector_task_2f5d8e3a8db54fd1", "eval_flag": True,
                        "buffer_id": "buffer_fd9cc26fdfda", "policy_version": 100, "real_episode_count": 4,
                        "env_steps": 800, "duration": 2.0, "policy_envstep": 400, "reward_mean": 199.0,
                        "reward_std": 1.0, "envstep": 400, "time": 1000.0, "train_iter": 100}],
    "current_buffer_id": "buffer_fd9cc26fdfda",
    "current_policy_id": "policy_3d7d0c3f695e",
    "resume_learner": False,
    "eval_in_flight": "collector_task_2fae3303177a4549",
    "eval_own_slot": True,
    "last_eval": {"time": 1000.0, "train_iter": 100, "envstep": 400},
    "eval_spent": {"end": 1000.0, "duration": 2.0},
    "end_flag": False,
    "seed_counter": 4,
    "run_id": "run_old",
    "confirm": {"task_id": "collector_task_2f5d8e3a8db54fd1", "dispatched": "collector_task_2fae3303177a4549"},
    "best": {"task_id": "collector_task_2f5d8e3a8db54fd1", "reward_mean": 199.0, "policy_version": 100,
             "envstep": 400},
    "final_task": None,
    "lost_group": None,
}


def test_a_state_written_by_main_96c7719_still_loads(small_cfg):
    c = create_commander(_cfg(small_cfg), clock=Clock(1010.0), run_id="run_new")
    c.load_state_dict(copy.deepcopy(_STATE_96C7719))
    assert c.state_dict() == _STATE_96C7719  # the same wire keys, read and written back unchanged
    assert c.players() == [Player("main", "policy_3d7d0c3f695e", "buffer_fd9cc26fdfda", "latest")]
    assert c.train_iter == 100 and c.total_envstep == 400 and c.best_eval["reward_mean"] == 199.0
    task = c.get_collector_task()  # the confirmation is in flight: a training task in the free slot
    assert not task["eval_flag"] and task["run_id"] == "run_old" and task["policy_id"] == "policy_3d7d0c3f695e"
    done = {"task_id": "collector_task_2fae3303177a4549", "eval_flag": True, "buffer_id": "buffer_fd9cc26fdfda",
            "policy_version": 100, "real_episode_count": 8, "env_steps": 1600, "reward_mean": 199.0,
            "reward_std": 1.0, "confirmation": True}
    assert c.finish_collector_task(done["task_id"], done) is True
    assert c.final_eval_task == "collector_task_2fae3303177a4549"


def test_an_older_state_without_the_later_keys_loads_with_their_defaults(small_cfg):
    old = {k: v for k, v in _STATE_96C7719.items()
           if k not in ("eval_own_slot", "eval_spent", "confirm", "best", "final_task", "lost_group")}
    c = create_commander(_cfg(small_cfg), clock=Clock(1010.0))
    c.load_state_dict(copy.deepcopy(old))
    state = c.state_dict()
    assert {k: state[k] for k in old} == old
    assert state["eval_own_slot"] is False and state["confirm"] is None and state["best"] == {}


@pytest.mark.parametrize("key, value, match", [
    ("seed_counter", "4", r"commander state key 'seed_counter' must be int, got '4'"),
    ("confirm", [], r"commander state key 'confirm' must be Optional\[dict\], got \[\]"),
    ("collector_task_space", {"min_val": 0, "max_val": 2}, r"commander state key 'collector_task_space': .*'cur'"),
    ("learner_info", {"train_iter": 3}, r"commander state key 'learner_info': learner reports must be a list"),
])
def test_a_bad_state_is_refused_naming_its_key(small_cfg, key, value, match):
    c = create_commander(_cfg(small_cfg), clock=Clock(1010.0))
    with pytest.raises(ValueError, match=match):
        c.load_state_dict(dict(copy.deepcopy(_STATE_96C7719), **{key: value}))


def test_the_state_keys_are_the_fields_of_the_state_and_its_parts(small_cfg):
    c = create_commander(_cfg(small_cfg), clock=Clock(1010.0))
    own = {f.name for f in dataclasses.fields(SoloState)} - {"spaces", "judge"}
    parts = {f.name for cls in (TaskSpaces, EvalJudge) for f in dataclasses.fields(cls)} - {"rules", "logger", "closing"}
    assert set(c.state_dict()) == own | parts == set(_STATE_96C7719)


def test_a_part_naming_a_key_twice_is_refused():
    @dataclasses.dataclass
    class Part(WireState):
        run_id: str = "a"

    @dataclasses.dataclass
    class Whole(WireState):
        part: Part
        run_id: str = "b"

    with pytest.raises(TypeError, match=r"Whole: state key\(s\) \['run_id'\] named twice"):
        Whole(Part()).state_dict()


@pytest.mark.parametrize("reward, stop_value, reached", [
    (195.0, 195, True), (194.9, 195.0, False), (None, 195.0, False), (1e9, None, False), (-49.0, -50.0, True)])
def test_the_stop_rule(reward, stop_value, reached):
    assert reached_stop_value(reward, stop_value) is reached


def test_the_resume_point_at_the_stop_reads_the_players_of_the_state_it_is_given(small_cfg, tmp_path):
    conn = fakeredis.FakeRedis()
    c = create_commander(_cfg(small_cfg), clock=Clock(1000.0), run_id="run_r")
    learner = c.get_learner_task()
    blobstore.put_versioned(conn, keys.ckpt("exp", LearnerTask.from_dict(learner).ckpt_name), b"ckpt", 7)
    conn.hset(keys.buffer_stats("exp", learner["buffer_id"]), "env_steps", 1234)
    point = ResumePoint(conn, "exp", tmp_path, 0, c)
    at_stop = c.state_dict()
    c.finish_learner_task(learner["task_id"], {"buffer_id": learner["buffer_id"]})  # the live player's ids are ""
    point.save("run_r", 990.0, at_stop)
    saved = json.loads((tmp_path / "resume.json").read_text())
    assert saved["consumed_env_steps"] == 1234 and saved["ckpt_train_iter"] == 7 and saved["commander"] == at_stop
    # --resume into a fresh Redis: the checkpoint and the env steps go back to the main player's keys.
    fresh = fakeredis.FakeRedis()
    d = create_commander(_cfg(small_cfg), clock=Clock(5000.0))
    ResumePoint(fresh, "exp", tmp_path, 0, d).restore(5000.0)
    assert d.players()[0].buffer_id == learner["buffer_id"]
    assert blobstore.get_versioned(fresh, keys.ckpt("exp", "latest"))[1] == b"ckpt"
    assert int(fresh.hget(keys.buffer_stats("exp", learner["buffer_id"]), "env_steps")) == 1234
    resumed = d.get_learner_task()
    assert resumed["resume"] is True and LearnerTask.from_dict(resumed).ckpt_name == "latest"
