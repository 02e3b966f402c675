"""Unit tests for coordinator/commander.py SoloCommander, including the seed faults it fixes."""

from __future__ import annotations

import json

import copy
import pickle

import pytest
from easydict import EasyDict

from common import keys


from coordinator.commander import _LEARNER_INFO_HISTORY, LearnerReports, SoloCommander, create_commander


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


class FakeTB:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, value, step))

    def scalars(self, tag):
        return [(v, s) for t, v, s in self.calls if t == tag]


def cfg_with(small_cfg, **commander):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(commander)
    return cfg


def make(small_cfg, clock=None, tb=None, **commander):
    commander.setdefault("confirm_eval_episodes", 0)  # the seed's rule: the first passing eval converges
    # A fixed space of two unless a test says otherwise (following workers has its own tests).
    commander.setdefault("collector_task_space", 2)
    cfg = cfg_with(small_cfg, **commander)
    return create_commander(cfg, clock=clock or FakeClock(), tb_logger=tb, run_id="run_x")


def finished(task, *, env_steps=100, reward_mean=10.0, train_iter=0, avg_step_per_episode=25.0,
             avg_time_per_episode=0.5, avg_time_per_step=0.02, episodes=4, reward_std=1.0):
    return {
        "task_id": task["task_id"], "eval_flag": task["eval_flag"], "buffer_id": task["buffer_id"],
        "policy_version": train_iter, "real_episode_count": episodes, "env_steps": env_steps,
        "avg_step_per_episode": avg_step_per_episode, "avg_time_per_step": avg_time_per_step,
        "avg_time_per_episode": avg_time_per_episode, "reward_mean": reward_mean, "reward_std": reward_std,
    }


def assert_plain(obj, path="task"):
    """Only exact builtin types, recursively (no EasyDict, no numpy)."""
    assert type(obj) in (dict, list, str, int, float, bool, type(None)), f"{path}: {type(obj)}"
    if type(obj) is dict:
        for k, v in obj.items():
            assert type(k) is str, f"{path}: key {k!r}"
            assert_plain(v, f"{path}.{k}")
    elif type(obj) is list:
        for i, v in enumerate(obj):
            assert_plain(v, f"{path}[{i}]")


# ---------------------------------------------------------------- task creation

def test_create_commander_builds_solo(small_cfg):
    c = create_commander(small_cfg, clock=FakeClock())
    assert isinstance(c, SoloCommander)


def test_no_collector_task_before_learner_task(small_cfg):
    c = make(small_cfg)
    assert c.get_collector_task() is None
    assert c.get_collector_task() is None
    # The refused attempts did not leak task space.
    assert c.summary()["collector_tasks_running"] == 0
    learner = c.get_learner_task()
    assert learner is not None
    tasks = [c.get_collector_task() for _ in range(2)]
    assert all(t is not None for t in tasks)


def test_learner_task_ids_propagate_to_collector_tasks(small_cfg):
    c = make(small_cfg)
    lt = c.get_learner_task()
    assert lt["task_type"] == "learner"
    assert lt["policy_id"].startswith("policy_") and lt["buffer_id"].startswith("buffer_")
    assert lt["resume"] is False
    assert lt["run_id"] == "run_x" and lt["exp_name"] == "test_exp"
    ct = c.get_collector_task()
    assert ct["task_type"] == "collector"
    assert ct["policy_id"] == lt["policy_id"]
    assert ct["buffer_id"] == lt["buffer_id"]
    assert ct["run_id"] == "run_x"
    assert ct["task_id"] != lt["task_id"]
    assert ct["eval_flag"] is False
    assert "eps" in ct["collect_setting"]
    assert ct["seed"] != lt["seed"]


def test_learner_task_space_limit(small_cfg):
    c = make(small_cfg)
    assert c.get_learner_task() is not None
    assert c.get_learner_task() is None


def test_collector_task_space_limit_and_release(small_cfg):
    c = make(small_cfg, collector_task_space=3)
    c.get_learner_task()
    tasks = [c.get_collector_task() for _ in range(3)]
    assert all(tasks)
    assert len({t["task_id"] for t in tasks}) == 3
    assert c.get_collector_task() is None
    # finish releases one slot
    assert c.finish_collector_task(tasks[0]["task_id"], finished(tasks[0])) is False
    t4 = c.get_collector_task()
    assert t4 is not None
    assert c.get_collector_task() is None
    # failure releases one slot
    c.notify_fail_collector_task(tasks[1])
    assert c.get_collector_task() is not None
    assert c.get_collector_task() is None
    assert c.summary()["collector_tasks_running"] == 3


@pytest.mark.parametrize("cap, eval_space, workers, space", [
    (None, 1, 0, 1),    # no worker yet: one task waits in the queue
    (None, 1, 1, 1),    # one worker: it trains, an eval waits at the queue's front
    (None, 1, 2, 1),    # one worker kept free for evals
    (None, 1, 5, 4),
    (None, 0, 5, 5),    # evals share collector space: every worker trains
    (3, 1, 10, 3),      # the cap
    (3, 1, 3, 2),       # under the cap the workers rule
    (1, 0, 0, 1),
])
def test_collector_task_space_follows_workers(small_cfg, cap, eval_space, workers, space):
    c = make(small_cfg, collector_task_space=cap, eval_task_space=eval_space)
    c.follow_collector_workers(workers)
    assert c.summary()["collector_task_space"] == space
    c.get_learner_task()
    tasks = [c.get_collector_task() for _ in range(space)]
    assert all(tasks) and c.get_collector_task() is None


def test_workers_joining_and_leaving_resize_the_space(small_cfg):
    c = make(small_cfg, collector_task_space=None, eval_every_train_iter=1, eval_interval=0.0)
    c.get_learner_task()
    c.follow_collector_workers(2)  # one trains, one is kept for evals
    t1 = c.get_collector_task()
    assert t1 and not t1["eval_flag"] and c.get_collector_task() is None
    c.follow_collector_workers(4)  # two workers join
    joined = [c.get_collector_task(), c.get_collector_task()]
    assert all(joined) and c.get_collector_task() is None
    assert c.summary()["collector_tasks_running"] == 3
    # An eval comes due: it takes its own slot although every training slot is in use.
    c.update_learner_info("l", {"train_iter": 5})
    ev = c.get_collector_task()
    assert ev is not None and ev["eval_flag"] is True
    # Two workers leave: running tasks keep their slots, finished ones are not replaced ...
    c.follow_collector_workers(2)
    assert c.summary()["collector_task_space"] == 1
    c.finish_collector_task(t1["task_id"], finished(t1))
    c.finish_collector_task(joined[0]["task_id"], finished(joined[0]))
    assert c.get_collector_task() is None
    # ... until fewer run than the space allows.
    c.finish_collector_task(joined[1]["task_id"], finished(joined[1]))
    t = c.get_collector_task()
    assert t is not None and not t["eval_flag"] and c.get_collector_task() is None


def test_task_dicts_are_plain_and_pickle(small_cfg):
    c = make(small_cfg)
    lt = c.get_learner_task()
    ct = c.get_collector_task()
    for t in (lt, ct):
        assert_plain(t)
        again = pickle.loads(pickle.dumps(t))
        assert again == t
    assert ct["config"]["policy"]["learn"]["batch_size"] == small_cfg.policy.learn.batch_size
    assert ct["config"]["create"]["policy"]["type"] == "dqn"


def test_seeds_are_distinct_and_depend_on_cfg_seed(small_cfg):
    c = make(small_cfg, collector_task_space=5)
    seeds = [c.get_learner_task()["seed"]] + [c.get_collector_task()["seed"] for _ in range(5)]
    assert len(set(seeds)) == 6
    cfg2 = EasyDict(copy.deepcopy(small_cfg))
    cfg2.seed = small_cfg.seed + 7
    c2 = SoloCommander(cfg2, clock=FakeClock())
    assert c2.get_learner_task()["seed"] not in seeds


# ---------------------------------------------------------------- (a) no avg swap

def test_finish_collector_task_logs_unswapped_averages(small_cfg):
    tb = FakeTB()
    c = make(small_cfg, tb=tb)
    c.get_learner_task()
    t = c.get_collector_task()
    c.finish_collector_task(t["task_id"], finished(t, env_steps=300, train_iter=12, avg_step_per_episode=37.5,
                                                   avg_time_per_episode=0.125, avg_time_per_step=0.004))
    assert tb.scalars("collector_iter/avg_step_per_episode") == [(37.5, 12)]
    assert tb.scalars("collector_iter/avg_time_per_episode") == [(0.125, 12)]
    assert tb.scalars("collector_iter/avg_time_per_step") == [(0.004, 12)]
    # *_step scalars use the total env steps as x axis.
    assert tb.scalars("collector_step/avg_step_per_episode") == [(37.5, 300)]
    assert tb.scalars("collector_iter/episode_count") == [(4, 12)]
    assert not [call for call in tb.calls if call[0].endswith("train_iter")]


def test_eval_finish_logs_evaluator_scalars(small_cfg):
    tb = FakeTB()
    c = make(small_cfg, tb=tb, eval_every_train_iter=1)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 5})
    t = c.get_collector_task()
    assert t["eval_flag"] is True
    c.finish_collector_task(t["task_id"], finished(t, reward_mean=50.0, train_iter=5, avg_step_per_episode=50.0,
                                                   avg_time_per_episode=2.0))
    assert tb.scalars("evaluator_iter/reward_mean") == [(50.0, 5)]
    assert tb.scalars("evaluator_iter/avg_step_per_episode") == [(50.0, 5)]
    assert tb.scalars("evaluator_iter/avg_time_per_episode") == [(2.0, 5)]
    assert tb.scalars("collector_iter/reward_mean") == []


# ---------------------------------------------------------------- (b) eval triggers

def test_no_eval_before_learner_trained(small_cfg):
    clock = FakeClock()
    c = make(small_cfg, clock=clock, eval_interval=1.0, eval_every_train_iter=1, eval_every_env_step=1,
             collector_task_space=4)
    c.get_learner_task()
    clock.advance(10_000)
    c.update_learner_info("l", {"train_iter": 0, "consumed_env_steps": 5000})
    tasks = [c.get_collector_task() for _ in range(4)]
    assert all(t["eval_flag"] is False for t in tasks)


def test_eval_triggers_on_train_iter(small_cfg):
    c = make(small_cfg, eval_interval=0.0, eval_every_train_iter=100, eval_every_env_step=0, collector_task_space=10)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 99})
    t = c.get_collector_task()
    assert t["eval_flag"] is False
    c.finish_collector_task(t["task_id"], finished(t))
    c.update_learner_info("l", {"train_iter": 100})
    ev = c.get_collector_task()
    assert ev["eval_flag"] is True
    c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=1.0))
    # Next eval only after another 100 train iterations since the last eval (taken at 100).
    c.update_learner_info("l", {"train_iter": 199})
    t = c.get_collector_task()
    assert t["eval_flag"] is False
    c.finish_collector_task(t["task_id"], finished(t))
    c.update_learner_info("l", {"train_iter": 200})
    assert c.get_collector_task()["eval_flag"] is True


def test_eval_triggers_on_env_steps(small_cfg):
    c = make(small_cfg, eval_interval=0.0, eval_every_train_iter=0, eval_every_env_step=1000, collector_task_space=10)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1, "consumed_env_steps": 999})
    t = c.get_collector_task()
    assert t["eval_flag"] is False
    c.finish_collector_task(t["task_id"], finished(t, env_steps=0))
    c.update_learner_info("l", {"train_iter": 2, "consumed_env_steps": 1000})
    ev = c.get_collector_task()
    assert ev["eval_flag"] is True
    c.finish_collector_task(ev["task_id"], finished(ev))
    # Env steps from finished collector tasks count too.
    t = c.get_collector_task()
    assert t["eval_flag"] is False
    c.finish_collector_task(t["task_id"], finished(t, env_steps=2000))
    assert c.total_envstep == 2000
    assert c.get_collector_task()["eval_flag"] is True


def test_an_older_collectors_step_count_still_counts_as_its_env_steps(small_cfg):
    c = make(small_cfg)
    c.get_learner_task()
    t = c.get_collector_task()
    old = {k: v for k, v in finished(t).items() if k != "env_steps"}
    c.finish_collector_task(t["task_id"], dict(old, step_count=700))
    assert c.total_envstep == 700


def test_eval_triggers_on_wall_time(small_cfg):
    clock = FakeClock()
    c = make(small_cfg, clock=clock, eval_interval=60.0, eval_every_train_iter=0, eval_every_env_step=0,
             collector_task_space=10)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1})
    clock.advance(59.0)
    t = c.get_collector_task()
    assert t["eval_flag"] is False
    c.finish_collector_task(t["task_id"], finished(t))
    clock.advance(1.0)
    ev = c.get_collector_task()
    assert ev["eval_flag"] is True
    c.finish_collector_task(ev["task_id"], finished(ev))
    clock.advance(30.0)
    assert c.get_collector_task()["eval_flag"] is False
    clock.advance(30.0)
    assert c.get_collector_task()["eval_flag"] is True


def test_evals_keep_to_their_share_of_the_time(small_cfg):
    """commander.eval_max_share 0.25: an eval that ran 10 s is followed by 30 s without one (Atari
    evals took 43 % of the CPU before), however due the next one is by train iterations."""
    clock = FakeClock()
    c = make(small_cfg, clock=clock, eval_interval=0.0, eval_every_train_iter=1, eval_every_env_step=0,
             eval_max_share=0.25, collector_task_space=10)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1})
    ev = c.get_collector_task()
    assert ev["eval_flag"] is True
    clock.advance(10.0)
    c.finish_collector_task(ev["task_id"], dict(finished(ev, reward_mean=0.0), duration=10.0))
    c.update_learner_info("l", {"train_iter": 500})
    clock.advance(29.0)
    assert c.get_collector_task()["eval_flag"] is False
    clock.advance(1.5)
    assert c.get_collector_task()["eval_flag"] is True


def test_all_triggers_disabled_never_evals(small_cfg):
    clock = FakeClock()
    c = make(small_cfg, clock=clock, eval_interval=0.0, eval_every_train_iter=0, eval_every_env_step=0,
             collector_task_space=3)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 10_000, "consumed_env_steps": 10**6})
    clock.advance(10**6)
    assert all(c.get_collector_task()["eval_flag"] is False for _ in range(3))


def test_at_most_one_eval_in_flight(small_cfg):
    clock = FakeClock()
    c = make(small_cfg, clock=clock, eval_interval=1.0, eval_every_train_iter=1, collector_task_space=5)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 10})
    clock.advance(5)
    ev = c.get_collector_task()
    assert ev["eval_flag"] is True
    c.update_learner_info("l", {"train_iter": 1000})
    clock.advance(1000)
    others = [c.get_collector_task() for _ in range(4)]
    assert all(t["eval_flag"] is False for t in others)
    # Finishing the eval lets the next one be scheduled.
    c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=0.0))
    nxt = c.get_collector_task()
    assert nxt["eval_flag"] is True


def test_failed_eval_clears_in_flight(small_cfg):
    c = make(small_cfg, eval_every_train_iter=1, collector_task_space=3)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 3})
    ev = c.get_collector_task()
    assert ev["eval_flag"] is True
    c.update_learner_info("l", {"train_iter": 10})
    assert c.get_collector_task()["eval_flag"] is False
    c.notify_fail_collector_task(ev)
    assert c.get_collector_task()["eval_flag"] is True


def test_eval_finish_records_last_eval(small_cfg):
    c = make(small_cfg, eval_every_train_iter=1)
    c.get_learner_task()
    assert c.last_eval is None
    c.update_learner_info("l", {"train_iter": 4, "consumed_env_steps": 77})
    ev = c.get_collector_task()
    c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=12.5, train_iter=4))
    assert c.last_eval["reward_mean"] == 12.5
    assert c.last_eval["envstep"] == 77
    s = c.summary()
    assert s["last_eval_reward_mean"] == 12.5 and s["last_eval_policy_version"] == 4
    # An eval task's env_steps does not count as collected env steps.
    assert c.total_envstep == 77


# ---------------------------------------------------------------- convergence

def test_convergence_sets_end_flag_and_stops_tasks(small_cfg):
    stop = small_cfg.env.stop_value
    c = make(small_cfg, eval_every_train_iter=1, collector_task_space=3)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1})
    ev = c.get_collector_task()
    col = c.get_collector_task()
    assert ev["eval_flag"] and not col["eval_flag"]
    # A collector task with huge reward never converges the run: only evals judge.
    assert c.finish_collector_task(col["task_id"], finished(col, reward_mean=stop * 10)) is False
    assert c.end_flag is False
    assert c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=stop)) is True
    assert c.end_flag is True
    assert c.summary()["converged"] is True
    assert c.get_collector_task() is None
    assert c.get_learner_task() is None


def test_passing_eval_is_confirmed_on_the_same_weights_before_converging(small_cfg):
    stop = small_cfg.env.stop_value
    c = make(small_cfg, eval_every_train_iter=1, confirm_eval_episodes=20)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1})
    ev = c.get_collector_task()
    assert c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=stop + 5, train_iter=1)) is False
    assert not c.end_flag and c.best_eval["task_id"] == ev["task_id"]
    # The next task is the confirmation: the passing eval's stored weights, 20 fresh episodes.
    conf = c.get_collector_task()
    assert conf["eval_flag"] and conf["eval_episodes"] == 20
    assert conf["eval_policy_key"] == keys.evaluated_policy(small_cfg.exp_name, ev["task_id"])
    assert conf["seed"] != ev["seed"]
    # Mean 196, std 10 over 20 episodes: 196 - 2 * 10 / sqrt(20) = 191.5 < 195, within the margin: no.
    assert c.finish_collector_task(conf["task_id"], finished(conf, reward_mean=stop + 1, reward_std=10.0,
                                                             episodes=20, train_iter=1)) is False
    assert not c.end_flag
    ev2 = c.get_collector_task()  # the next eval of the live policy (due: train_iter moved on)
    c.update_learner_info("l", {"train_iter": 2})
    ev2 = ev2 if ev2["eval_flag"] else c.get_collector_task()
    assert c.finish_collector_task(ev2["task_id"], finished(ev2, reward_mean=stop + 20, train_iter=2)) is False
    conf2 = c.get_collector_task()
    assert conf2["eval_policy_key"] == keys.evaluated_policy(small_cfg.exp_name, ev2["task_id"])
    # Mean 200, std 10 over 20: 200 - 4.47 = 195.5 >= 195: converged with exactly those weights.
    assert c.finish_collector_task(conf2["task_id"], finished(conf2, reward_mean=stop + 5, reward_std=10.0,
                                                              episodes=20, train_iter=2)) is True
    assert c.end_flag and c.final_eval_task == conf2["task_id"]


def test_failed_confirmation_goes_on_training(small_cfg):
    stop = small_cfg.env.stop_value
    c = make(small_cfg, eval_every_train_iter=1, confirm_eval_episodes=20, collector_task_space=1)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1})
    ev = c.get_collector_task()
    c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=stop + 1))
    conf = c.get_collector_task()
    assert conf.get("eval_policy_key")
    assert c.finish_collector_task(conf["task_id"], finished(conf, reward_mean=stop - 50)) is False
    assert not c.end_flag and c.final_eval_task is None
    # Back to normal evals of the live policy once due again, and training tasks meanwhile.
    col = c.get_collector_task()
    assert not col["eval_flag"] and "eval_policy_key" not in col
    c.update_learner_info("l", {"train_iter": 3})
    nxt = c.get_collector_task()
    assert nxt["eval_flag"] and "eval_policy_key" not in nxt
    # The best eval stays the first one (its weights are best.pt).
    assert c.best_eval["task_id"] == ev["task_id"]


def test_confirmation_state_survives_a_coordinator_restart(small_cfg):
    c = make(small_cfg, eval_every_train_iter=1, confirm_eval_episodes=20)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1})
    ev = c.get_collector_task()
    c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=small_cfg.env.stop_value + 1))
    d = make(small_cfg, eval_every_train_iter=1, confirm_eval_episodes=20)
    d.load_state_dict(json.loads(json.dumps(c.state_dict())))
    conf = d.get_collector_task()
    assert conf["eval_policy_key"] == keys.evaluated_policy(small_cfg.exp_name, ev["task_id"])
    assert d.best_eval == c.best_eval


def test_eval_below_stop_value_does_not_converge(small_cfg):
    c = make(small_cfg, eval_every_train_iter=1)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1})
    ev = c.get_collector_task()
    assert c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=small_cfg.env.stop_value - 0.01)) is False
    assert c.end_flag is False
    assert c.get_collector_task() is not None


# ---------------------------------------------------------------- (c) failed learner

def test_failed_learner_replacement_resumes_same_ids(small_cfg):
    c = make(small_cfg)
    lt = c.get_learner_task()
    ct = c.get_collector_task()
    c.notify_fail_learner_task(lt)
    lt2 = c.get_learner_task()
    assert lt2 is not None
    assert lt2["task_id"] != lt["task_id"]
    assert lt2["policy_id"] == lt["policy_id"]
    assert lt2["buffer_id"] == lt["buffer_id"]
    assert lt2["resume"] is True
    # Collectors keep feeding the same buffer.
    ct2 = c.get_collector_task()
    assert ct2["buffer_id"] == ct["buffer_id"] and ct2["policy_id"] == ct["policy_id"]
    # The resume flag is one-shot.
    c.notify_fail_learner_task(lt2)
    lt3 = c.get_learner_task()
    assert lt3["resume"] is True and lt3["policy_id"] == lt["policy_id"]


def test_failed_learner_space_released_once(small_cfg):
    c = make(small_cfg)
    lt = c.get_learner_task()
    assert c.get_learner_task() is None
    c.notify_fail_learner_task(lt)
    assert c.get_learner_task() is not None
    assert c.get_learner_task() is None


def test_finish_learner_task_resets_ids(small_cfg):
    c = make(small_cfg)
    lt = c.get_learner_task()
    c.update_learner_info(lt["task_id"], {"train_iter": 50})
    assert c.finish_learner_task(lt["task_id"], {"buffer_id": lt["buffer_id"]}) == lt["buffer_id"]
    assert c.summary()["policy_id"] == "" and c.summary()["buffer_id"] == ""
    assert c.train_iter == 0
    # No collector task until a new learner exists, and the new one gets fresh ids.
    assert c.get_collector_task() is None
    lt2 = c.get_learner_task()
    assert lt2["resume"] is False
    assert lt2["policy_id"] != lt["policy_id"] and lt2["buffer_id"] != lt["buffer_id"]
    assert c.get_collector_task()["buffer_id"] == lt2["buffer_id"]


def test_finish_after_fail_does_not_resume(small_cfg):
    c = make(small_cfg)
    lt = c.get_learner_task()
    c.notify_fail_learner_task(lt)
    lt2 = c.get_learner_task()
    c.finish_learner_task(lt2["task_id"], {"buffer_id": lt2["buffer_id"]})
    lt3 = c.get_learner_task()
    assert lt3["resume"] is False and lt3["policy_id"] != lt["policy_id"]


# ---------------------------------------------------------------- (d) bounded history

def test_learner_info_history_bounded(small_cfg):
    c = make(small_cfg)
    c.get_learner_task()
    for i in range(1000):
        c.update_learner_info("l", {"train_iter": i, "consumed_env_steps": i * 2})
    assert c.train_iter == 999
    assert c.total_envstep == 1998
    reports = LearnerReports()
    for i in range(1000):
        reports.append({"train_iter": i})
    assert len(reports) == _LEARNER_INFO_HISTORY <= 100 and reports.latest == {"train_iter": 999}


def test_finished_collector_tasks_are_counted_not_kept(small_cfg):
    c = make(small_cfg, collector_task_space=1)
    c.get_learner_task()
    for _ in range(300):
        t = c.get_collector_task()
        c.finish_collector_task(t["task_id"], finished(t, env_steps=1))
    assert c.total_envstep == 300
    assert len(json.dumps(c.state_dict())) < 5000  # nothing grows with the number of tasks


def test_update_learner_info_copies(small_cfg):
    c = make(small_cfg)
    info = {"train_iter": 3}
    c.update_learner_info("l", info)
    info["train_iter"] = 999
    assert c.train_iter == 3


# ---------------------------------------------------------------- (e) total envstep

def test_total_envstep_is_max_of_both_sources(small_cfg):
    c = make(small_cfg, collector_task_space=2, eval_every_train_iter=0, eval_interval=0.0)
    c.get_learner_task()
    assert c.total_envstep == 0
    t = c.get_collector_task()
    c.finish_collector_task(t["task_id"], finished(t, env_steps=256))
    t = c.get_collector_task()
    c.finish_collector_task(t["task_id"], finished(t, env_steps=256))
    assert c.total_envstep == 512
    c.update_learner_info("l", {"train_iter": 1, "consumed_env_steps": 300})
    assert c.total_envstep == 512  # finished sum larger
    c.update_learner_info("l", {"train_iter": 2, "consumed_env_steps": 900})
    assert c.total_envstep == 900  # learner's live count larger
    assert c.summary()["envstep"] == 900
    assert c.get_collector_task()["envstep"] == 900


def test_collect_setting_eps_decreases_with_env_steps(small_cfg):
    c = make(small_cfg, collector_task_space=1, eval_every_train_iter=0, eval_interval=0.0)
    c.get_learner_task()
    eps = []
    for envstep in (0, 2000, 10_000, 50_000):
        c.update_learner_info("l", {"train_iter": 1, "consumed_env_steps": envstep})
        t = c.get_collector_task()
        eps.append(t["collect_setting"]["eps"])
        c.finish_collector_task(t["task_id"], finished(t, env_steps=0))
    assert eps[0] == pytest.approx(small_cfg.policy.other.eps.start)
    assert all(a > b for a, b in zip(eps, eps[1:]))
    assert eps[-1] >= small_cfg.policy.other.eps.end


def test_summary_fields(small_cfg):
    c = make(small_cfg)
    lt = c.get_learner_task()
    c.get_collector_task()
    s = c.summary()
    assert s["learner_tasks_running"] == 1 and s["collector_tasks_running"] == 1
    assert s["policy_id"] == lt["policy_id"] and s["buffer_id"] == lt["buffer_id"]
    assert s["stop_value"] == small_cfg.env.stop_value
    assert s["converged"] is False
    assert s["last_eval_reward_mean"] is None  # no eval yet: no number (null in JSON, "" in Redis)


# ---------------------------------------------------------------- the closing eval at a budget

def test_no_closing_eval_before_the_learner_trained(small_cfg):
    c = make(small_cfg)
    assert c.begin_closing() is None  # no learner yet
    c.get_learner_task()
    assert c.begin_closing() is None  # a learner, no train iteration yet
    assert not c.get_collector_task()["eval_flag"]  # and the run goes on as before


def test_a_closing_eval_is_one_eval_of_the_newest_version_after_which_no_task_is_handed_out(small_cfg):
    stop = small_cfg.env.stop_value
    c = make(small_cfg, eval_every_train_iter=0, eval_interval=0.0, confirm_eval_episodes=20)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 9, "consumed_env_steps": 1200})
    closing = c.begin_closing()
    assert closing is not None and closing.pending and c.begin_closing() is closing
    ev = c.get_collector_task()
    assert ev["eval_flag"] and "eval_policy_key" not in ev  # the newest published version, not a replay
    assert closing.task_id == ev["task_id"]
    assert c.get_collector_task() is None and c.get_learner_task() is None
    # Reaching stop_value at the closing eval does not converge the run, nor ask for a confirmation.
    assert c.finish_collector_task(ev["task_id"], finished(ev, reward_mean=stop + 50, train_iter=9)) is False
    assert not closing.pending and not c.end_flag and c.final_eval_task is None
    assert c.last_eval["task_id"] == ev["task_id"] and c.last_eval["closing"] is True
    assert c.last_eval["envstep"] == 1200 and c.best_eval["task_id"] == ev["task_id"]
    assert c.get_collector_task() is None  # one closing eval, once


def test_the_closing_eval_waits_for_an_eval_running_at_the_budget(small_cfg):
    c = make(small_cfg, eval_every_train_iter=1, collector_task_space=3)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 1})
    running = c.get_collector_task()
    assert running["eval_flag"]
    closing = c.begin_closing()
    assert c.get_collector_task() is None  # not a second eval beside it, and no training task
    c.finish_collector_task(running["task_id"], finished(running, reward_mean=1.0, train_iter=1))
    assert closing.pending and "closing" not in c.last_eval
    ev = c.get_collector_task()
    assert ev["eval_flag"] and closing.task_id == ev["task_id"]


def test_a_failed_closing_eval_is_over(small_cfg):
    c = make(small_cfg, eval_every_train_iter=0, eval_interval=0.0)
    c.get_learner_task()
    c.update_learner_info("l", {"train_iter": 3})
    closing = c.begin_closing()
    ev = c.get_collector_task()
    c.notify_fail_collector_task(ev)
    assert not closing.pending and c.last_eval is None
    assert c.get_collector_task() is None
