"""The commander's ``state_dict`` / ``load_state_dict`` round trip, as a restarted coordinator uses it.

A commander restored from the JSON the coordinator persists must hold the same state and then
act exactly like the one it replaces: same task space, eval slot, learner resume flag, ids and
seeds, same convergence decision.
"""

from __future__ import annotations

import copy
import json

from easydict import EasyDict

from coordinator.commander import create_commander


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
