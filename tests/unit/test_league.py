"""coordinator/league.py (players, PFSP, payoff, Elo) and the league commander's task flow."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from easydict import EasyDict

from common import keys
from common.config import compile_config
from coordinator.commander import create_commander
from coordinator.league import MAIN, League, LeagueError, LeagueSettings, expected_score, status_lines


# Rock-Paper-Scissors: PAY[a, b] is the row player's payoff (paper beats rock, ...); its one
# Nash equilibrium is uniform, and a strategy's exploitability is the best reply's payoff to it.
PAY = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]])


def exploitability(pi: np.ndarray) -> float:
    return float((PAY @ pi).max())


def smooth_fictitious_play(weighting: str, seed: int, iters: int = 2000, games: int = 64, beta: float = 2.0):
    """Main learns by smooth fictitious play (its policy: a softmax, temperature 1/beta, of its
    payoffs against the actions its opponents played so far), starting from the belief that
    opponents play rock 80% of the time; each iteration plays ``games`` games against the
    opponent the league picks (snapshots every 10 iterations, PFSP by ``weighting``)."""
    rng = np.random.default_rng(seed)
    league = League(LeagueSettings(snapshot_every=10, self_play_share=0.0, weighting=weighting))
    seen = np.array([8.0, 1.0, 1.0])
    snapshots: dict[str, np.ndarray] = {}

    def policy() -> np.ndarray:
        z = beta * (PAY @ (seen / seen.sum()))
        e = np.exp(z - z.max())
        return e / e.sum()

    pi = start = policy()
    for it in range(1, iters + 1):
        opponent = league.pick_opponent(rng)
        theirs = pi if opponent == MAIN else snapshots[opponent]
        a, b = rng.choice(3, games, p=pi), rng.choice(3, games, p=theirs)
        r = PAY[a, b]
        league.record(opponent, int((r > 0).sum()), int((r == 0).sum()), int((r < 0).sum()))
        seen += np.bincount(b, minlength=3)
        pi = policy()
        if (snapshot := league.snapshot_due(it)) is not None:
            snapshots[snapshot] = pi.copy()
            league.add_snapshot(snapshot, it)
    return start, pi, league


@pytest.mark.parametrize("weighting", ["hard", "variance", "uniform"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_matrix_game_main_player_approaches_the_uniform_equilibrium(weighting, seed):
    """Bound: exploitability below 0.08 (from 0.58 at the start) after 2,000 iterations of 64 games;
    measured 0.023-0.046 over three seeds and the three weightings."""
    start, pi, league = smooth_fictitious_play(weighting, seed)
    assert exploitability(start) > 0.5
    assert exploitability(pi) < 0.08, (pi, league.table()["payoff"])
    assert len(league.snapshots) == 200
    assert sum(sum(row) for row in league.payoff.values()) == 2000 * 64


def test_pfsp_hard_prefers_the_snapshots_main_loses_to():
    league = League(LeagueSettings(snapshot_every=1, self_play_share=0.0, weighting="hard"))
    league.add_snapshot("main@1", 1)
    league.add_snapshot("main@2", 2)
    league.record("main@1", 90, 0, 10)  # main beats it
    league.record("main@2", 10, 0, 90)  # main loses to it
    w = league.weights(league.pool())
    assert w[1] > 20 * w[0]
    picks = [league.pick_opponent(np.random.default_rng(s)) for s in range(200)]
    assert picks.count("main@2") > 180


def test_self_play_share_and_an_empty_pool_play_main():
    league = League(LeagueSettings(snapshot_every=5, self_play_share=1.0))
    assert league.pick_opponent(np.random.default_rng(0)) == MAIN  # no snapshot yet
    league.add_snapshot("main@5", 5)
    assert {league.pick_opponent(np.random.default_rng(s)) for s in range(50)} == {MAIN}


def test_elo_moves_to_the_winner_and_self_play_rates_nobody():
    league = League(LeagueSettings(snapshot_every=10))
    league.add_snapshot("main@10", 10)
    league.record("main@10", 30, 5, 5)
    me, them = league.players[MAIN], league.players["main@10"]
    assert me.elo > 1000 > them.elo
    assert me.elo + them.elo == pytest.approx(2000.0)  # zero-sum updates
    assert (me.games, them.games) == (40, 40)
    league.record(MAIN, 10, 0, 0)
    assert league.players[MAIN].elo == me.elo and league.payoff[MAIN] == [10, 0, 0]
    assert expected_score(1200, 1000) == pytest.approx(1 / (1 + 10 ** (-0.5)))


def _league_with_a_seat_worth(seat: float, progress: float, rounds: int = 30) -> League:
    """A league whose main gains ``progress`` true Elo points per snapshot, with games scored as
    the Elo model expects when the opponent's seat is worth ``seat`` points (100 games a task)."""
    league, true = League(LeagueSettings(snapshot_every=1)), {MAIN: 0.0}

    def play(opponent: str) -> None:
        wins = round(100 * expected_score(true[MAIN], true[opponent] + seat))
        league.record(opponent, wins, 0, 100 - wins)

    play(MAIN)  # 100 self-play games before the first snapshot
    for it in range(1, rounds + 1):
        true[MAIN] += progress
        league.add_snapshot(f"main@{it}", it)
        true[f"main@{it}"] = true[MAIN]
        play(MAIN)
        for snapshot in league.snapshots[-5:]:
            play(snapshot)
    return league


def test_self_play_measures_the_opponents_seat_and_rated_games_expect_it():
    """The opponent's seat worth 190.8 Elo (main scores 1/4 against itself): equal policies keep
    equal ratings and a main that gains 10 true points a snapshot (290 in all) rates its last snapshot
    192 above its first. Rated as if
    the seat were main's, each snapshot entered below the last and the ratings fell to -908; with
    the seat measured from a prior of 1/2 rather than the games' mean, the first 100 self-play
    games left it at 0.476 (after 3,100, 0.261), and the equal policies' ratings fell to 506-929."""
    level = _league_with_a_seat_worth(400 * np.log10(3), progress=0.0)
    assert level.self_play_games == 3100 and level.self_play_score == pytest.approx(0.25)
    assert level.seat_advantage == pytest.approx(190.8, abs=0.1)
    assert all(p.elo == pytest.approx(1000.0, abs=1.0) for p in level.players.values())
    assert level.table()["seat_advantage"] == pytest.approx(190.8)
    rising = _league_with_a_seat_worth(400 * np.log10(3), progress=10.0)
    elo = [rising.players[s].elo for s in rising.snapshots]
    assert elo[-1] > elo[0] + 150 and rising.players[MAIN].elo > elo[0]
    even = _league_with_a_seat_worth(0.0, progress=0.0)  # a seat worth nothing leaves Elo as it was
    assert even.seat_advantage == 0.0 and all(p.elo == 1000.0 for p in even.players.values())


def test_the_seat_is_a_running_mean_of_the_first_games_then_a_moving_average_and_old_states_use_the_payoff():
    league = League(LeagueSettings())
    league.record(MAIN, 25, 0, 75)
    assert league.self_play_score == pytest.approx(0.25)  # the games' own mean, not pulled to 1/2
    league.record(MAIN, 450, 0, 450)
    assert league.self_play_score == pytest.approx((25 + 450) / 1000)  # SEAT_HORIZON games: still the mean
    league.record(MAIN, 0, 0, 1000)  # then each game moves it 1/SEAT_HORIZON of the way
    assert league.self_play_score == pytest.approx(0.475 * 0.999 ** 1000)
    old = League(LeagueSettings())
    state = league.state_dict()
    del state["self_play_score"], state["self_play_games"]  # as saved before the seat was measured
    old.load_state_dict(state)
    assert (old.self_play_games, old.self_play_score) == (2000, pytest.approx(475 / 2000))
    table = old.table()
    del table["seat_advantage"]
    assert "seat" not in status_lines(table)[0]  # a summary from before it: no figure it never had


def test_snapshots_are_due_at_each_multiple_and_retired_ones_leave_the_pool():
    league = League(LeagueSettings(snapshot_every=10, max_snapshots=2))
    assert league.snapshot_due(9) is None
    assert league.snapshot_due(13) == "main@13"
    league.add_snapshot("main@13", 13)
    assert league.snapshot_due(19) is None and league.snapshot_due(20) == "main@20"
    for it in (20, 30):
        league.add_snapshot(f"main@{it}", it)
    assert league.pool() == ["main@20", "main@30"]  # the newest max_snapshots
    league.retire(["main@30"])
    assert league.pool() == ["main@13", "main@20"]
    assert league.players[league.snapshots[-1]].elo == 1000.0  # rated as main was when taken


def test_state_round_trips_through_json():
    league = League(LeagueSettings(snapshot_every=3))
    league.add_snapshot("main@3", 3)
    league.record("main@3", 4, 1, 2)
    league.retire(["main@3"])
    again = League(LeagueSettings(snapshot_every=3))
    again.load_state_dict(json.loads(json.dumps(league.state_dict())))
    assert again.table() == league.table() and again.next_snapshot == league.next_snapshot == 6


@pytest.mark.parametrize("section, key", [({"snapshot_every": 0}, "snapshot_every"),
                                          ({"self_play_share": 1.5}, "self_play_share"),
                                          ({"weighting": "soft"}, "weighting"),
                                          ({"max_snapshot": 3}, "max_snapshot"),
                                          ({"initial_elo": "abc"}, "initial_elo"),
                                          ({"snapshot_every": None}, "snapshot_every"),
                                          ({"opponent_lookahead": "deep"}, "opponent_lookahead")])
def test_bad_settings_name_the_key(section, key):
    with pytest.raises(LeagueError, match=f"commander.league.{key}"):
        LeagueSettings.of(section)


def test_an_opponent_that_is_not_a_player_is_refused_by_name():
    with pytest.raises(LeagueError, match="'main@99' is not a player"):
        League(LeagueSettings()).record("main@99", 1, 0, 0)


# ---------------------------------------------------------------------------- the commander
def league_cfg(**league):
    cfg = compile_config({
        "exp_name": "c4", "env": {"env_id": "rqrl/ConnectFour-v0", "collector_env_num": 2},
        "policy": {"model": {"action_mask": True}},
        "commander": {"collector_task_space": 2, "confirm_eval_episodes": 0,
                      "league": {"snapshot_every": 5, **league}}},
        {"policy": {"type": "ppo"}, "commander": {"type": "league"}})
    return cfg


class Pipe:
    """The commands a commander queues on the coordinator's MULTI pipeline."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name):
        return lambda *a, **k: self.calls.append((name, a, k))


def test_the_league_commander_hands_out_opponents_takes_snapshots_and_counts_results():
    cm = create_commander(league_cfg(self_play_share=0.0), run_id="r")
    learner = cm.get_learner_task()
    policy_key = keys.policy(keys.namespace("c4"), learner["policy_id"])
    first = cm.get_collector_task()
    assert first["opponent"] == MAIN  # no snapshot yet
    cm.update_learner_info(learner["task_id"], {"train_iter": 5, "consumed_env_steps": 100})
    pipe = Pipe()
    cm.redis_writes(pipe)
    assert ("copy", (policy_key, keys.league_snapshot(keys.namespace("c4"), "main@5")), {"replace": True}) in pipe.calls
    assert any(c[0] == "hset" and c[1][0] == keys.league_elo(keys.namespace("c4")) for c in pipe.calls)
    second = cm.get_collector_task()
    assert second["opponent"] == "main@5"
    cm.finish_collector_task(second["task_id"], {"task_id": second["task_id"], "eval_flag": False, "policy_version": 5,
                                                 "env_steps": 100, "real_episode_count": 10, "wins": 7, "draws": 1,
                                                 "losses": 2})
    assert cm.league.payoff["main@5"] == [7, 1, 2]
    table = cm.summary()["league"]
    assert table["players"]["main"]["elo"] > 1000 and table["players"]["main"]["train_iter"] == 5
    lines = status_lines(json.dumps(table))
    assert lines[0] == (f"  league: main Elo {table['players']['main']['elo']:.0f}, 1 snapshots (1 in the pool), "
                        "opponent's seat worth +0 Elo"), lines
    assert "vs itself" in lines[1] and "not met yet" in lines[1] and "main won 70% of 10 games" in lines[2]
    assert [p.player_id for p in cm.players()] == ["main", "main@5"]
    # A restarted coordinator adopts the state: the running first task's opponent and the league.
    again = create_commander(league_cfg(self_play_share=0.0), run_id="r")
    again.load_state_dict(json.loads(json.dumps(cm.state_dict())))
    assert again.league.table() == cm.league.table() and again._opponents == {first["task_id"]: MAIN}
    pipe = Pipe()
    again.redis_writes(pipe)
    assert not any(c[0] == "copy" for c in pipe.calls)  # the snapshot was copied once


def test_the_league_commander_refuses_a_single_player_env_async_envs_and_a_lookahead_the_game_lacks():
    cfg = league_cfg()
    cfg.env.env_id = "CartPole-v1"
    with pytest.raises(LeagueError, match="'env.env_id' is 'CartPole-v1', a single-player env"):
        create_commander(cfg)
    cfg = league_cfg()
    cfg.env.manager.type = "async"
    with pytest.raises(LeagueError, match="env.manager.type"):
        create_commander(cfg)
    cfg = league_cfg(opponent_lookahead="win")
    cfg.env.env_id = "rqrl/RockPaperScissors-v0"
    with pytest.raises(LeagueError, match="'commander.league.opponent_lookahead' is 'win', but game 'rps' has no"):
        create_commander(cfg)
    create_commander(league_cfg(opponent_lookahead="win_or_block"))  # Connect Four has both


def test_a_snapshot_that_tasks_keep_failing_against_is_retired_and_its_blob_deleted():
    cm = create_commander(league_cfg(self_play_share=0.0), run_id="r")
    learner = cm.get_learner_task()
    cm.update_learner_info(learner["task_id"], {"train_iter": 5, "consumed_env_steps": 100})
    cm.redis_writes(Pipe())
    snapshot_key = keys.league_snapshot(keys.namespace("c4"), "main@5")
    for _ in range(2):  # e.g. its blob is corrupt: each task fails naming it
        task = cm.get_collector_task()
        assert task["opponent"] == "main@5"
        cm.notify_fail_collector_task(task)
    assert cm.league.pool() == [] and cm.get_collector_task()["opponent"] == MAIN
    pipe = Pipe()
    cm.redis_writes(pipe)
    assert ("delete", (snapshot_key,), {}) in pipe.calls


def test_snapshots_beyond_max_snapshots_leave_the_pool_and_redis():
    cm = create_commander(league_cfg(max_snapshots=2), run_id="r")
    learner = cm.get_learner_task()
    for it in (5, 10, 15):
        cm.update_learner_info(learner["task_id"], {"train_iter": it, "consumed_env_steps": 100 * it})
    pipe = Pipe()
    cm.redis_writes(pipe)
    assert cm.league.pool() == ["main@10", "main@15"]
    assert ("delete", (keys.league_snapshot(keys.namespace("c4"), "main@5"),), {}) in pipe.calls
