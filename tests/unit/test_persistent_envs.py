"""Envs that outlive collector tasks (workers/live_envs.py, workers/collector.py), in process.

A collector task continues its run's envs where the last task stopped: episodes end only when
the env ends them, and a PPO rollout that a task's end cut is bootstrapped from the very
observation the next task starts from (GAE checked by hand across the boundary).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from common import spaces
from common.config import compile_config
from common.policy import create_policy
from tests.fakes import FakeComm
from tests.fixtures import long_envs  # noqa: F401  (registers Countdown-v0)
from workers.collector import Collector, build_live_envs
from workers.live_envs import EnvCache, EpisodeStats, LiveEnvs


def _cfg(algo: str, length: int, task_env_steps: int, **collect):
    model = {"hidden_size_list": [16]} if algo == "dqn" else \
        {"encoder_hidden_size_list": [16], "actor_head_hidden_size": 16, "critic_head_hidden_size": 16}
    return compile_config({"exp_name": "persist", "env": {"env_id": "Countdown-v0", "env_kwargs": {"length": length},
                                                          "collector_env_num": 2,
                                                          "import_names": ["tests.fixtures.long_envs"]},
                           "policy": {"model": model, "collect": {"n_sample": 8, **collect,
                                                                  "collector": {"task_env_steps": task_env_steps}}}},
                          {"policy": {"type": algo}})


def _tasks(cfg, live, n, setting, comm):
    infos = []
    for i in range(n):
        task = {"eval_flag": False, "seed": 7, "task_id": f"t{i}", "collect_setting": dict(setting), "envstep": 0}
        infos.append(Collector(cfg, task, comm, live).run())
    return infos


def _learner_weights(cfg):
    spec = spaces.probe(cfg)
    c = copy.deepcopy(cfg)
    spaces.check_model(c, spec)
    torch.manual_seed(0)
    return create_policy(c, spec, modes=("learn",), device="cpu").get_weights()


def test_episodes_ten_times_a_task_keep_their_length_across_tasks():
    """Countdown episodes of 100 steps, tasks of 10 steps per env: every finished training episode
    is 100 steps long, and the tasks together finish every episode the env steps allow."""
    cfg = _cfg("dqn", length=100, task_env_steps=20)
    live = build_live_envs(cfg, {"eval_flag": False, "task_id": "t0"})
    try:
        infos = _tasks(cfg, live, 25, {"eps": 0.5}, FakeComm(_learner_weights(cfg)))
    finally:
        live.close()
    finished = [i for i in infos if i["real_episode_count"]]
    assert sum(i["real_episode_count"] for i in infos) == 2 * (25 * 10 // 100)  # 2 envs x 2 whole episodes
    assert all(i["min_step_per_episode"] == i["max_step_per_episode"] == 100 for i in finished), finished
    assert [i["env_steps"] for i in infos] == [20] * 25


def test_without_kept_envs_every_task_cuts_its_episodes():
    """The old life cycle (a forking worker: fresh envs per task) never finishes a 100-step episode
    in 10-step tasks: the contrast the test above guards against."""
    cfg = _cfg("dqn", length=100, task_env_steps=20)
    comm = FakeComm(_learner_weights(cfg))
    infos = [Collector(cfg, {"eval_flag": False, "seed": i, "task_id": f"t{i}", "collect_setting": {"eps": 0.5},
                             "envstep": 0}, comm).run() for i in range(12)]
    assert sum(i["real_episode_count"] for i in infos) == 0


def _gae_by_hand(reward, value, done, boot, gamma, lam):
    """GAE(lambda) of one env's segment, written out step by step (reference for the adder)."""
    T = len(reward)
    adv = np.zeros(T)
    nxt = 0.0
    for t in reversed(range(T)):
        next_value = 0.0 if done[t] else (boot if t == T - 1 else value[t + 1])
        delta = reward[t] + gamma * next_value - value[t]
        nxt = delta + gamma * lam * (0.0 if done[t] else 1.0) * nxt
        adv[t] = nxt
    return adv


def test_ppo_rollout_crossing_a_task_boundary_is_bootstrapped_from_where_the_next_task_starts():
    """Tasks of 7 steps per env, PPO segments of 4 (rollout_rows 8 over 2 envs), 10-step episodes:
    task 1 emits a segment of 4 and flushes 3 bootstrapped from V(obs at its end); task 2 starts
    from exactly that obs (its first row's obs, and its recorded value is that bootstrap) and
    an episode terminates inside its first segment. Every row's advantage and return match GAE
    computed by hand from the rows' own values."""
    cfg = _cfg("ppo", length=10, task_env_steps=14, discount_factor=0.9, gae_lambda=0.8)
    gamma, lam = 0.9, 0.8
    comm = FakeComm(_learner_weights(cfg))
    live = build_live_envs(cfg, {"eval_flag": False, "task_id": "t0"})
    try:
        _tasks(cfg, live, 3, {"rollout_rows": 8}, comm)
    finally:
        live.close()
    segments = comm.sent  # one chunk per emitted segment (on-policy rows go out as emitted)
    assert [len(s["obs"]) // 2 for s in segments] == [4, 3, 4, 3, 4, 3]
    # Across every task boundary, the next task starts from the observation the flush bootstrapped from.
    flat = [np.stack([s["obs"][t * 2 + e] for s in segments for t in range(len(s["obs"]) // 2)]) for e in range(2)]
    t_of = np.round(flat[0][:, 0] * 10).astype(int)
    assert list(t_of) == [t % 10 for t in range(21)], "the step counter must run on across tasks, resetting only at 10"
    for k, seg in enumerate(segments):
        T = len(seg["obs"]) // 2
        for e in range(2):
            rows = [t * 2 + e for t in range(T)]
            value = seg["value"][rows]
            t_env = np.round(seg["obs"][rows][:, 0] * 10).astype(int)
            done = t_env == 9  # the step from t = 9 ends the 10-step episode (terminated)
            boot = segments[k + 1]["value"][e] if k + 1 < len(segments) else None
            if boot is None:
                continue  # the last segment's bootstrap belongs to a task that never ran
            want = _gae_by_hand(np.ones(T), value, done, boot, gamma, lam)
            np.testing.assert_allclose(seg["adv"][rows], want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(seg["ret"][rows], want + value, rtol=1e-5, atol=1e-5)
    assert any(((np.round(s["obs"][:, 0] * 10) == 9).any()) for s in segments[2:4]), "an episode must end in task 2"


def test_the_adder_follows_a_collect_setting_changed_mid_task():
    """A setting read back by a flush (the coordinator's rqrl:{exp}:collect_setting) reaches the
    PPO adder at its next segment: rollout_rows 8 -> 4 halves the segments within one task."""
    cfg = _cfg("ppo", length=1000, task_env_steps=40)
    comm = FakeComm(_learner_weights(cfg))
    flushes = []

    def flush():
        flushes.append(1)
        if len(flushes) == 2:
            comm.collect_setting_raw = b'{"setting": {"rollout_rows": 4}, "ts": 0}'
        return False

    comm.flush = flush
    comm.collect_setting_raw = b'{"setting": {"rollout_rows": 8}, "ts": 0}'
    Collector(cfg, {"eval_flag": False, "seed": 1, "task_id": "t", "collect_setting": {"rollout_rows": 8},
                    "envstep": 0}, comm).run()
    assert [len(s["obs"]) // 2 for s in comm.sent] == [4, 4, 2, 2, 2, 2, 2, 2]


# ---------------------------------------------------------------- the cache itself

class _Env:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


def _live(idle_s=300.0):
    return LiveEnvs(env=_Env(), spec=SimpleNamespace(env_id="Fake-v0"), policy=None, episodes=EpisodeStats(1), idle_s=idle_s)


def test_cache_builds_once_per_run_and_mode_and_keeps_at_most_max_runs():
    cache = EnvCache(max_runs=2)
    built = []

    def build():
        built.append(_live())
        return built[-1]

    for key in [("a", "r1", "train"), ("a", "r1", "train"), ("a", "r1", "eval"), ("b", "r2", "train"),
                ("a", "r1", "train")]:
        with cache.borrow(key, build):
            pass
    assert len(built) == 3 and cache.builds == 3
    with cache.borrow(("c", "r3", "train"), build):
        pass
    # Run b was used least recently: its envs closed, run a's two entries kept.
    assert sorted(cache.keys()) == [("a", "r1", "eval"), ("a", "r1", "train"), ("c", "r3", "train")]
    assert [b.env.closed for b in built] == [0, 0, 1, 0]


def test_cache_closes_envs_a_task_failed_on_and_never_lends_them_twice():
    cache = EnvCache()
    live = _live()
    with pytest.raises(RuntimeError, match="env blew up"):
        with cache.borrow(("a", "r", "train"), lambda: live):
            with pytest.raises(RuntimeError, match="already in use"):
                with cache.borrow(("a", "r", "train"), _live):
                    pass
            raise RuntimeError("env blew up")
    assert live.env.closed == 1 and len(cache) == 0


def test_cache_sweeps_idle_envs_and_closes_a_stopped_run():
    cache = EnvCache(max_runs=4)
    lives = {k: _live(idle_s=s) for k, s in (("x", 10.0), ("y", 1000.0), ("z", 1000.0))}
    for k, live in lives.items():
        with cache.borrow((k, "r", "train"), lambda live=live: live):
            pass
    now = lives["y"].last_used + 100
    assert cache.sweep(now) == 1 and lives["x"].env.closed == 1
    assert cache.close_run("y", "r") == 1 and lives["y"].env.closed == 1
    cache.close_all()
    assert lives["z"].env.closed == 1 and len(cache) == 0


def test_an_eval_spreads_its_episodes_over_the_eval_envs():
    """20 eval episodes on 4 envs, two of which play 50-step episodes and two 5-step ones: an env
    that is free starts the next episode, so the eval takes 50 vector steps (fixed quotas of 5
    episodes per env took 250). The counted episodes are the first 20 started, each played to
    its end: 2 long and 18 short ones."""
    from tests.fixtures.long_envs import Uneven

    cfg = _cfg("dqn", length=5, task_env_steps=20)
    cfg.env.env_id, cfg.env.env_kwargs, cfg.env.evaluator_env_num = "Uneven-v0", {"lengths": [5, 50]}, 4
    task = {"eval_flag": True, "seed": 3, "task_id": "e0", "eval_episodes": 20}
    Uneven.instances = 0
    live = build_live_envs(cfg, task)
    try:
        Uneven.steps_taken = 0
        info = Collector(cfg, task, FakeComm(_learner_weights(cfg)), live).run()
        lengths = sorted(live.episodes.lengths)
    finally:
        live.close()
    assert info["real_episode_count"] == 20 and lengths == [5] * 18 + [50] * 2, lengths
    assert Uneven.steps_taken == 4 * 50, Uneven.steps_taken
    assert info["env_steps"] == sum(lengths) and info["reward_mean"] == 9.5


def test_an_eval_stops_at_its_env_step_cap():
    """policy.eval.evaluator.max_env_steps bounds an eval (a greedy Atari policy that never
    presses FIRE ran every eval to the frame cut-off): 4 envs of 50-step episodes under a cap of
    40 env steps stop after 10 vector steps, with no episode counted and no reward sent."""
    from tests.fixtures.long_envs import Uneven

    cfg = _cfg("dqn", length=5, task_env_steps=20)
    cfg.env.env_id, cfg.env.env_kwargs, cfg.env.evaluator_env_num = "Uneven-v0", {"lengths": [50]}, 4
    cfg.policy.eval.evaluator.max_env_steps = 40
    task = {"eval_flag": True, "seed": 3, "task_id": "e0", "eval_episodes": 4}
    live = build_live_envs(cfg, task)
    try:
        Uneven.steps_taken = 0
        info = Collector(cfg, task, FakeComm(_learner_weights(cfg)), live).run()
    finally:
        live.close()
    assert Uneven.steps_taken == 40, Uneven.steps_taken
    assert info["real_episode_count"] == 0 and "reward_mean" not in info


def test_a_task_that_finished_no_episode_sends_no_reward():
    """No finished episode, no number: the finish info leaves out reward and episode figures
    rather than reporting 0.0 (issue: a zero-episode eval was stored as 0.0 and exported)."""
    from workers.collector import finish_info

    stats = EpisodeStats(2)
    stats.step(np.array([-1.0, -1.0]), np.array([False, False]))
    info = finish_info(stats, 2, 0.5, 3, eval_flag=True)
    assert info["real_episode_count"] == 0
    assert not {"reward_mean", "reward_std", "avg_step_per_episode", "avg_time_per_episode"} & set(info)
    stats.step(np.array([-1.0, -1.0]), np.array([True, False]))
    info = finish_info(stats, 4, 1.0, 3, eval_flag=True)
    assert info["reward_mean"] == -2.0 and info["avg_step_per_episode"] == 2.0


def test_every_eval_resets_its_envs_from_its_own_task_seed():
    """Evals share the run's eval envs but never their start states: each eval task resets them
    from env_seeds(its task's seed), so a confirmation (a later task, more episodes) plays fresh
    starts and no two evals replay each other's (issue 21, planted bug 3: cfg.seed replays them)."""
    from common.seeding import env_seeds, task_seed

    cfg = _cfg("dqn", length=5, task_env_steps=20)
    cfg.seed = 11
    cfg.env.evaluator_env_num = 2
    tasks = [{"eval_flag": True, "seed": task_seed(cfg.seed, n), "task_id": f"e{n}", "eval_episodes": k}
             for n, k in ((4, 2), (9, 6))]  # a passing eval, then its confirmation on more episodes
    live = build_live_envs(cfg, tasks[0])
    resets = []
    reset = live.env.reset

    def recording_reset(*args, **kwargs):
        resets.append(list(kwargs.get("seed") or []))
        return reset(*args, **kwargs)

    live.env.reset = recording_reset
    try:
        comm = FakeComm(_learner_weights(cfg))
        for task in tasks:
            assert Collector(cfg, task, comm, live).run()["real_episode_count"] == task["eval_episodes"]
    finally:
        live.close()
    assert resets == [env_seeds(t["seed"], 2) for t in tasks]
    assert not set(resets[0]) & set(resets[1])
