"""common/games.py (two-player games as gymnasium envs), the PPO action mask and workers/opponents.py."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from common import blobstore, envs, games, keys, serialization, spaces
from common.config import compile_config
from common.messages import CollectorTask, MessageError
from common.policy import create_policy
from workers.opponents import OpponentError, load_snapshot, seat_for

pytest.importorskip("pettingzoo")
games.register()


def board(mine=(), theirs=()) -> np.ndarray:
    """An observation of Connect Four: pieces at (row, col), row 5 the bottom; legal flags follow."""
    planes = np.zeros((6, 7, 2), np.float32)
    for plane, cells in ((0, mine), (1, theirs)):
        for r, c in cells:
            planes[r, c, plane] = 1
    legal = (planes.sum(-1)[0] == 0).astype(np.float32)
    return np.concatenate([planes.reshape(-1), legal])


def test_the_heuristic_wins_when_it_can_and_blocks_when_it_must():
    rng = np.random.default_rng(0)
    # Three of its own in the bottom row (cols 0-2): col 3 wins, though the other threatens col 6.
    win = board(mine=[(5, 0), (5, 1), (5, 2)], theirs=[(4, 6), (3, 6), (2, 6)])
    assert games.connect_four_heuristic(win, rng) == 3
    block = board(mine=[(5, 0)], theirs=[(5, 6), (4, 6), (3, 6)])
    assert games.connect_four_heuristic(block, rng) == 6
    # A diagonal (5,0)-(4,1)-(3,2) that (2,3) completes: a win comes before the block at (5,4).
    diagonal = board(mine=[(5, 0), (4, 1), (3, 2), (4, 3)], theirs=[(5, 1), (5, 2), (4, 2), (5, 3), (3, 3)])
    assert games.connect_four_heuristic(diagonal, rng) == 3


def test_connect_four_plays_from_either_seat_with_masks_and_outcomes():
    env = gym.make("rqrl/ConnectFour-v0", opponent="random")
    assert env.observation_space.shape == (91,) and env.action_space.n == 7
    seats, outcomes = set(), []
    rng = np.random.default_rng(1)
    for ep in range(40):
        obs, info = env.reset(seed=ep)
        seats.add(info["seat"])
        pieces_at_start = obs[:84].sum()
        assert pieces_at_start == info["seat"]  # the second seat sees the opponent's first piece
        done = False
        while not done:
            legal = np.flatnonzero(obs[84:])
            obs, reward, terminated, truncated, info = env.step(rng.choice(legal))
            done = terminated or truncated
        assert terminated and info["outcome"] == reward and reward in (-1, 0, 1)
        outcomes.append(info["outcome"])
    assert seats == {0, 1} and {-1, 1} <= set(outcomes)
    with pytest.raises(games.GameError, match="is over"):
        env.unwrapped.step(0)


def test_a_full_column_is_masked():
    # Both fill column 0 (alternate pieces: nobody wins there); the opponent then the next legal one.
    env = games.TwoPlayerEnv("connect_four", opponent=lambda obs: int(np.flatnonzero(obs[84:])[0]))
    obs, info = env.reset(seed=0)
    while obs[84] == 1:
        obs, *_ = env.step(0)
    assert obs[84] == 0 and obs[85:].all()


def test_an_illegal_opponent_move_forfeits_the_game():
    """PettingZoo scores it 0 for the other player; the learning player wins it (+1, outcome 1)."""
    env = games.TwoPlayerEnv("connect_four", opponent=lambda obs: 0)  # column 0 even when it is full
    results = set()
    for seed in range(6):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            obs, reward, done, _, step_info = env.step(0 if obs[84] else 1)
        results.add((info["seat"], reward, step_info["outcome"]))
    assert (1, 1.0, 1) in results  # second seat: the opponent fills column 0 first, then plays it full


def test_rock_paper_scissors_hides_the_first_move_and_pays_the_winner():
    env = gym.make("rqrl/RockPaperScissors-v0")
    env.unwrapped.set_opponent(lambda obs: 0)  # always rock
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        assert obs.tolist() == [0, 0, 0, 1, 1, 1, 1]  # "no move yet", whichever seat moves first
        _, reward, terminated, _, info = env.step(1)  # paper
        assert (reward, terminated, info["outcome"]) == (1.0, True, 1)


def test_fixed_opponents_are_named_and_a_bad_one_is_refused():
    with pytest.raises(games.GameError, match="unknown opponent 'expert'"):
        games.TwoPlayerEnv("connect_four", opponent="expert")
    with pytest.raises(games.GameError, match="known games"):
        games.TwoPlayerEnv("chess")
    assert games.is_two_player("rqrl/ConnectFour-v0") and not games.is_two_player("CartPole-v1")


def test_win_reward_applies_to_eval_envs_only():
    cfg = compile_config({"env": {"env_id": "rqrl/RockPaperScissors-v0",
                                  "wrappers": [{"type": "common.games:WinReward", "eval_only": True}]}})
    names = lambda train: [type(w(gym.make("CartPole-v1"))).__name__ for w in envs.wrappers(cfg.env, train)]
    assert names(False) == ["WinReward"] and names(True) == []
    env = envs.make(cfg.env, train=False)
    env.unwrapped.set_opponent(lambda obs: 1)  # paper beats the learner's rock: a loss pays 0, not -1
    env.reset(seed=0)
    assert env.step(0)[1] == 0.0
    bad = copy.deepcopy(cfg.env)
    bad.wrappers = [{"type": "common.games:WinReward", "eval_only": True, "train_only": True}]
    with pytest.raises(envs.EnvConfigError, match="at most one of the two flags"):
        envs.check(bad)


def ppo_cfg(mask: bool):
    cfg = compile_config({"exp_name": "c4", "env": {"env_id": "rqrl/ConnectFour-v0"},
                          "policy": {"model": {"action_mask": mask}}}, {"policy": {"type": "ppo"}})
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    return cfg, spec


def test_the_ppo_policy_never_picks_a_masked_action_and_gives_it_no_probability():
    cfg, spec = ppo_cfg(True)
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, device="cpu")
    obs = np.stack([board(mine=[(r, 3) for r in range(0, 6, 2)], theirs=[(r, 3) for r in range(1, 6, 2)])] * 256)
    assert obs[0, 84 + 3] == 0  # column 3 is full
    with torch.no_grad():
        policy.model.actor[-1].bias[3] = 50.0  # the net wants column 3 above all
    actions, record = policy.act(obs, {}, np.random.default_rng(0))
    assert 3 not in actions and np.isfinite(record["logp"]).all()
    assert 3 not in policy.act_eval(obs, np.random.default_rng(0))
    unmasked = create_policy(ppo_cfg(False)[0], spec, device="cpu")
    unmasked.set_weights(policy.get_weights())
    assert (unmasked.act_eval(obs, np.random.default_rng(0)) == 3).all()  # what the mask prevents


def test_an_action_mask_needs_flags_at_the_end_of_a_flat_observation():
    cfg = compile_config({"env": {"env_id": "MountainCar-v0"}, "policy": {"model": {"action_mask": True}}},
                         {"policy": {"type": "ppo"}})
    with pytest.raises(spaces.SpaceError, match="policy.model.action_mask"):
        spaces.check_model(cfg, spaces.probe(cfg))


def test_the_board_torso_convolves_the_board_planes_and_keeps_the_legal_flags_beside_them():
    from common.policy.nets import BoardTorso

    torso = BoardTorso((6, 7, 2), 91, [[1, 1, 1]])
    with torch.no_grad():  # a 1x1 conv that reads plane 0 (the mover's pieces) and nothing else
        conv = torso.torso.net[0]
        conv.weight.zero_()
        conv.weight[0, 0] = 1.0
        conv.bias.zero_()
    mine, theirs = [(5, 0), (5, 1), (4, 0), (0, 6)], [(5, 3), (4, 3)]
    obs = board(mine=mine, theirs=theirs)
    out = torso(torch.as_tensor(obs[None]))[0].detach().numpy()
    assert torso.out_dim == out.size == 42 + 7
    assert {divmod(int(i), 7) for i in np.flatnonzero(out[:42])} == set(mine)  # each piece at its cell
    assert (out[42:] == obs[84:]).all()  # the legal-column flags pass through untouched
    cfg, spec = ppo_cfg(True)
    cfg.policy.model.update(board=[6, 7, 2], conv=[[32, 4, 1]])
    spaces.check_model(cfg, spec)
    policy = create_policy(cfg, spec, device="cpu")
    actions, record = policy.act(np.stack([obs] * 4), {}, np.random.default_rng(0))
    assert actions.shape == (4,) and np.isfinite(record["logp"]).all()


def test_a_mirrored_board_is_the_same_position_with_columns_reversed():
    from common.policy.nets import mirror_board

    # Column 1 full, so its legal flag is 0; in the mirror image column 5 is the full one.
    full = [(r, 1) for r in range(6)]
    obs = board(mine=[(5, 0), (4, 0)] + full[::2], theirs=[(5, 3)] + full[1::2])
    want = board(mine=[(5, 6), (4, 6)] + [(r, 5) for r, _ in full[::2]], theirs=[(5, 3)] + [(r, 5) for r, _ in full[1::2]])
    got = mirror_board(torch.as_tensor(np.stack([obs, want])), (6, 7, 2)).numpy()
    assert (got[0] == want).all() and (got[1] == obs).all()
    assert got[0][84 + 5] == 0 and got[0][84 + 1] == 1


def mirror_learn(mirror: bool) -> tuple[np.ndarray, np.ndarray]:
    """The empty board's column probabilities before and after one learn step on a batch where
    column 0 gained and the centre column lost."""
    cfg = compile_config({"exp_name": "c4", "seed": 0, "env": {"env_id": "rqrl/ConnectFour-v0"},
                          "policy": {"model": {"action_mask": True, "board": [6, 7, 2], "conv": [[8, 4, 1]]},
                                     "learn": {"mirror_board": mirror, "epoch_per_collect": 4, "batch_size": 64}}},
                         {"policy": {"type": "ppo"}})
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    torch.manual_seed(0)
    policy = create_policy(cfg, spec, device="cpu")
    obs = np.stack([board()] * 256)
    action = np.array([0, 3] * 128, np.int64)
    with torch.no_grad():
        dist, v = policy.model(torch.as_tensor(obs))
        before = dist.probs[0].numpy()
        logp = dist.log_prob(torch.as_tensor(action)).numpy()
    adv = np.where(action == 0, 1.0, -1.0).astype(np.float32)
    policy.learn({"obs": obs, "action": action, "logp": logp, "value": v.numpy(), "adv": adv,
                  "ret": (adv + v.numpy()).astype(np.float32)})
    with torch.no_grad():
        return before, policy.model(torch.as_tensor(obs[:1]))[0].probs[0].numpy()


def test_ppo_with_mirror_board_learns_each_move_for_its_mirror_image_too():
    before, plain = mirror_learn(False)
    _, mirrored = mirror_learn(True)
    assert plain[0] > 1.4 * before[0] and mirrored[0] > 1.4 * before[0]  # the clip bounds each step's gain
    # Column 6 is column 0's mirror image: it gains only from the mirrored rows, as much as column 0.
    assert plain[6] < before[6] and mirrored[6] > 1.4 * before[6]
    assert abs(mirrored[0] - mirrored[6]) < 0.1 * mirrored[0]


@pytest.mark.parametrize("env_id, model, words", [
    ("rqrl/ConnectFour-v0", {"action_mask": True}, "'policy.model.board' is not"),
    ("CartPole-v1", {"board": [1, 1, 4], "conv": [[4, 1, 1]]}, "one action per column of the 1x1 board"),
])
def test_mirror_board_without_a_mirrorable_board_is_named(env_id, model, words):
    cfg = compile_config({"env": {"env_id": env_id}, "policy": {"model": model, "learn": {"mirror_board": True}}},
                         {"policy": {"type": "ppo"}})
    with pytest.raises(spaces.SpaceError, match=r"policy\.learn\.mirror_board") as e:
        spaces.check_model(cfg, spaces.probe(cfg))
    assert words in str(e.value)


@pytest.mark.parametrize("board_value, conv, env_id, words", [
    ([6, 7], [[32, 4, 1]], "rqrl/ConnectFour-v0", "must be [height, width, planes]"),
    ([7, 7, 2], [[32, 4, 1]], "rqrl/ConnectFour-v0", "at least 98 values"),
    ([6, 7, 2], [[32, 8, 1]], "rqrl/ConnectFour-v0", "board 6x7x2 to nothing"),
    ([1, 1, 1], [[8, 1, 1]], "FrozenLake-v1", "Discrete(16)"),
])
def test_a_bad_board_setting_is_named(board_value, conv, env_id, words):
    cfg = compile_config({"env": {"env_id": env_id},
                          "policy": {"model": {"board": board_value, "conv": conv}}}, {"policy": {"type": "ppo"}})
    with pytest.raises(spaces.SpaceError, match=r"policy\.model\.(board|conv)") as e:
        spaces.check_model(cfg, spaces.probe(cfg))
    assert words in str(e.value)


class Live:
    def __init__(self, spec) -> None:
        from collections import OrderedDict

        self.spec, self.opponents = spec, OrderedDict()


def test_a_snapshot_opponent_is_loaded_once_and_bad_ones_are_named(fake_redis):
    cfg, spec = ppo_cfg(True)
    policy = create_policy(cfg, spec, modes=("collect",), device="cpu")
    ns = keys.namespace("c4", "r1")
    key = keys.league_snapshot(ns, "main@10")
    blobstore.put_versioned(fake_redis, key, serialization.dumps(policy.get_weights()), 10)
    assert load_snapshot(fake_redis, ns, "main@10")[0] == 10
    live = Live(spec)
    seat = seat_for(live, "main@10", policy, cfg, fake_redis, ns, {}, np.random.default_rng(0))
    assert seat.policy is not policy and 0 <= seat(board()) < 7
    fake_redis.delete(key)  # kept: not read again
    assert seat_for(live, "main@10", policy, cfg, fake_redis, ns, {}, np.random.default_rng(0)).policy is seat.policy
    assert seat_for(live, "main", policy, cfg, fake_redis, ns, {}, np.random.default_rng(0)).policy is policy
    with pytest.raises(OpponentError, match=r"opponent 'main@20' does not exist: no league snapshot at .*main@20"):
        seat_for(live, "main@20", policy, cfg, fake_redis, ns, {}, np.random.default_rng(0))
    fake_redis.hset(keys.league_snapshot(ns, "main@30"), mapping={"version": 30, "nbytes": 5, "n_chunks": 1,
                                                                  "chunk:0": b"\xc1junk"})
    with pytest.raises(OpponentError, match=r"opponent 'main@30': league snapshot .*main@30 is unreadable"):
        load_snapshot(fake_redis, ns, "main@30")
    blobstore.put_versioned(fake_redis, keys.league_snapshot(ns, "main@40"), serialization.dumps([1, 2, 3]), 40)
    with pytest.raises(OpponentError, match=r"main@40 is unreadable .*holds a list"):
        seat_for(live, "main@40", policy, cfg, fake_redis, ns, {}, np.random.default_rng(0))


def test_an_opponent_with_a_lookahead_wins_then_blocks_and_plays_its_policy_otherwise(fake_redis):
    cfg, spec = ppo_cfg(True)
    policy = create_policy(cfg, spec, modes=("collect",), device="cpu")
    ns = keys.namespace("c4", "r1")
    blobstore.put_versioned(fake_redis, keys.league_snapshot(ns, "main@10"), serialization.dumps(policy.get_weights()), 10)
    # The mover's three in the bottom row: column 3 wins at once, while the other side threatens column 6.
    win = board(mine=[(5, 0), (5, 1), (5, 2), (5, 5)], theirs=[(5, 6), (4, 6), (3, 6)])
    block = board(mine=[(5, 0)], theirs=[(5, 6), (4, 6), (3, 6)])  # column 6 stops their four
    quiet = board(mine=[(5, 0)], theirs=[(5, 6)])

    def moves(player, obs):
        return {seat_for(Live(spec), player, policy, cfg, fake_redis, ns, {}, np.random.default_rng(s))(obs)
                for s in range(30)}

    assert moves("main", win) != {3} and moves("main", block) != {6}  # the untrained policy alone misses both
    cfg.commander.league.opponent_lookahead = "win"
    assert moves("main@10", win) == {3} and moves("main@10", block) != {6}
    cfg.commander.league.opponent_lookahead = "win_or_block"
    for player in ("main", "main@10"):
        assert moves(player, win) == {3} and moves(player, block) == {6}
        assert len(moves(player, quiet)) > 1  # nothing found: the policy's own sampled move
    assert games.lookahead_move("connect_four", win, "none") is None
    with pytest.raises(games.GameError, match="game 'rps' has no one-move lookahead"):
        games.lookahead_move("rps", np.zeros(6, np.float32), "win")
    with pytest.raises(games.GameError, match="unknown lookahead 'deep'"):
        games.lookahead_move("connect_four", win, "deep")


def test_a_collector_task_names_its_opponent_only_when_training():
    base = dict(task_type="collector", task_id="t1", exp_name="c4", run_id="r", buffer_id="b", policy_id="p",
                collect_setting={}, config={})
    assert CollectorTask.from_dict({**base, "eval_flag": False, "opponent": "main@10"}).opponent == "main@10"
    with pytest.raises(MessageError, match="'opponent'.*only for training tasks"):
        CollectorTask.from_dict({**base, "eval_flag": True, "opponent": "main@10"})
    with pytest.raises(MessageError, match="'opponent'"):
        CollectorTask.from_dict({**base, "eval_flag": False, "opponent": "a:b"})


@pytest.fixture
def c4_final_pt(tmp_path):
    """An untrained Connect Four PPO final.pt (masked: it only plays legal columns)."""
    import torch

    from common.policy import export

    cfg, spec = ppo_cfg(True)
    cfg.env.wrappers = [{"type": "common.games:WinReward", "eval_only": True}]
    torch.manual_seed(0)
    path = tmp_path / "final.pt"
    torch.save(export.bundle(create_policy(cfg, spec, device="cpu"), train_iter=3), path)
    return path


def test_rqrl_eval_plays_a_chosen_opponent(c4_final_pt, capsys):
    from coordinator import evaluate

    random = evaluate.evaluate_checkpoint(c4_final_pt, episodes=60, seed=0, opponent="random")
    wins = round(random.mean * 60)
    assert any(n.startswith(f"the policy won {wins}, drew ") and n.endswith("of 60 games against random")
               for n in random.notes)
    heuristic = evaluate.evaluate_checkpoint(c4_final_pt, episodes=60, seed=0)  # the env's own: the heuristic
    assert set(random.returns) <= {0.0, 1.0} and random.mean > heuristic.mean + 0.2
    itself = evaluate.evaluate_checkpoint(c4_final_pt, episodes=20, seed=0, opponent=str(c4_final_pt))
    assert 0.0 < itself.mean < 1.0  # an even match: the seat decides


def test_rqrl_eval_against_a_human_reads_moves_from_the_terminal(c4_final_pt, monkeypatch, capsys):
    from coordinator import evaluate

    moves = iter(["9", "abc"] + ["0", "1", "2", "3", "4", "5", "6"] * 6)
    monkeypatch.setattr("builtins.input", lambda prompt: next(moves))
    result = evaluate.evaluate_checkpoint(c4_final_pt, episodes=1, seed=0, opponent="human")
    out = capsys.readouterr().out
    assert "0 1 2 3 4 5 6" in out and "not a legal move: '9'" in out and "not a legal move: 'abc'" in out
    assert len(result.returns) == 1 and "game over: " in out
    assert any(n.startswith("you won ") and n.endswith(" of 1 games") for n in result.notes)
    for closed in (EOFError(), RuntimeError("input(): lost sys.stdin")):  # </dev/null, <&-
        monkeypatch.setattr("builtins.input", lambda prompt, e=closed: (_ for _ in ()).throw(e))
        with pytest.raises(evaluate.EvalError, match="stdin closed"):
            evaluate.evaluate_checkpoint(c4_final_pt, episodes=1, seed=0, opponent="human")


def test_rqrl_eval_refuses_an_opponent_in_a_single_player_env(c4_final_pt, tmp_path):
    import torch

    from common.policy import export
    from coordinator import evaluate

    cfg = compile_config({"env": {"env_id": "CartPole-v1"}}, {"policy": {"type": "ppo"}})
    spec = spaces.probe(cfg)
    spaces.check_model(cfg, spec)
    path = tmp_path / "cartpole.pt"
    torch.save(export.bundle(create_policy(cfg, spec, device="cpu"), train_iter=1), path)
    with pytest.raises(evaluate.EvalError, match="--opponent is for two-player games"):
        evaluate.evaluate_checkpoint(path, episodes=1, opponent="random")
    with pytest.raises(evaluate.EvalError, match=r"--opponent .*cartpole.pt: its policy was trained on 'CartPole-v1', "
                                                 r"not on 'rqrl/ConnectFour-v0'$"):
        evaluate.evaluate_checkpoint(c4_final_pt, episodes=1, opponent=str(path))


def test_a_policy_blob_that_is_not_a_dict_of_weights_is_skipped_as_unreadable(fake_redis):
    """It used to pass the finite check and fail the task in set_weights with a traceback."""
    from workers.comm_collector import RedisCommCollector

    task = {"task_id": "t1", "exp_name": "c4", "run_name": "r1", "policy_id": "p1", "buffer_id": "b1"}
    ns = keys.namespace("c4", "r1")
    blobstore.put_versioned(fake_redis, keys.policy(ns, "p1"), serialization.dumps([1, 2, 3]), 4)
    comm = RedisCommCollector(fake_redis, task, data_ttl_s=60)
    assert comm.get_policy_update_info() is None and comm.policy_errors == 1


def test_winning_moves_are_the_playable_squares_that_complete_four():
    # Theirs: three in row 4 over cols 0-2 with col 3's bottom square empty: (4, 3) is not playable yet.
    obs = board(mine=[(5, 0), (5, 1), (5, 2)], theirs=[(4, 0), (4, 1), (4, 2), (5, 6)])
    assert games.winning_moves(obs, 0) == [3]
    assert games.winning_moves(obs, 1) == []
    # Once (5, 3) is filled, (4, 3) is the lowest free square of col 3 and wins for them.
    obs = board(mine=[(5, 0), (5, 1), (5, 2)], theirs=[(4, 0), (4, 1), (4, 2), (5, 3)])
    assert games.winning_moves(obs, 1) == [3] and games.winning_moves(obs, 0) == []


@pytest.mark.parametrize("mine, theirs, action, kind", [
    ([(r, 0) for r in range(0, 6, 2)] + [(5, 4)], [(r, 0) for r in range(1, 6, 2)], 0, "illegal move"),  # col 0 full
    ([(5, 0), (5, 1), (5, 2)], [(4, 0), (4, 1)], 6, "missed win"),
    ([(4, 1)], [(5, 1), (5, 2), (5, 3)], 0, "two threats"),  # (5, 0) and (5, 4) both win for them
    ([(5, 6)], [(5, 0), (5, 1), (5, 2)], 6, "missed block"),
    ([(5, 0), (5, 2)], [(5, 1), (4, 0), (4, 1), (4, 2)], 3, "opened"),  # (5, 3) lifts col 3 to their (4, 3)
    # Blocking their one threat at (5, 3) lifts col 3 to (4, 3), which completes their row 4.
    ([(5, 0), (5, 1)], [(5, 2), (5, 4), (5, 5), (5, 6), (4, 0), (4, 1), (4, 2)], 3, "opened"),
])
def test_a_lost_game_is_put_under_the_kind_of_mains_last_move(mine, theirs, action, kind):
    from tests.bench.bench_league import loss_kind

    assert loss_kind(board(mine, theirs), action) == kind


class _Heuristic:
    """An agent that plays the heuristic itself: it never misses a win or a block."""

    env_id = "rqrl/ConnectFour-v0"

    def __init__(self) -> None:
        self.rng = np.random.default_rng(1)

    def act(self, obs):
        return games.connect_four_heuristic(obs, self.rng)


def test_tactics_count_the_wins_and_blocks_main_takes(c4_final_pt, monkeypatch):
    import rqrl
    from tests.bench.bench_league import tactics

    # The untrained (masked) policy misses blocks, and plays no illegal move.
    t = tactics(c4_final_pt, games=40)
    assert t["win"] + t["draw"] + t["loss"] == 40 and t["lost_by"]["illegal move"] == 0
    assert 0 <= t["blocked"] < t["threats"] and t["wins_taken"] <= t["wins_open"]
    assert t["lost_by"]["missed block"] > 0
    # A player that always wins and blocks loses only to two threats or a square it opened.
    monkeypatch.setattr(rqrl, "load", lambda path: _Heuristic())
    t = tactics(c4_final_pt, games=40)
    assert t["wins_taken_share"] == 1.0 and t["blocked_share"] == 1.0
    assert t["lost_by"]["missed win"] == t["lost_by"]["missed block"] == 0
    assert t["loss"] == t["lost_by"]["two threats"] + t["lost_by"]["opened"] > 0
