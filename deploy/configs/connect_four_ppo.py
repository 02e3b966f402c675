"""PPO self-play on Connect Four under the league commander; needs the ``league`` extra
(``pip install 'rqrl[league]'``: PettingZoo's classic games).

- the game: PettingZoo's ``connect_four_v3`` from one seat, drawn per game (common/games.py,
  ``rqrl/ConnectFour-v0``): reward +1 win, -1 loss, 0 draw; the observation is the board's two
  planes (the mover's pieces, the other's) and the 7 legal-column flags, which the policy reads
  as an action mask (``policy.model.action_mask``).
- the league (coordinator/league.py): a snapshot of main every 10 train iterations; each
  training task plays main itself one time in five, else a snapshot picked by PFSP ("hard":
  the snapshots main still loses to), as AlphaStar's main agents. The opponent's seat looks one
  move ahead (``opponent_lookahead="win_or_block"``): it plays a move that wins at once, else one
  that blocks main's win at once, else its policy's move, so main meets opponents that take a
  win it leaves them and block its single threats (without it main blocked 16-29% of the
  heuristic's threats at 0.5 M env steps, with it 71%: docs/performance.md, the Connect Four
  league).
- evals: 100 games against the heuristic (win if it can, block if it must, else a random
  column) with the win-only reward (``WinReward``, eval envs only): the eval's mean return is
  the win rate, and ``stop_value`` 0.9 asks for 9 games in 10 (confirmed on 200 more games).
- PPO: CleanRL's defaults for short discrete games (discount 0.99, GAE lambda 0.95, clip 0.2,
  entropy 0.01), 2,048 rows per update over the collectors, minibatch 256, with 10 epochs and a
  learning rate of 1e-3 (more reuse of each batch: faster here than 4 epochs at 3e-4 when
  trained on the heuristic, and with the lookahead; not in the league without it);
  a 64-channel 4x4 convolution over the board's planes (it sees a line of four wherever it
  lies), then a 256x256 MLP. The rate is constant here; ``--set policy.learn.lr_anneal_iters=N``
  takes it linearly to 0 over N train iterations. The results page sets N to its 1 M budget's
  246 train iterations (the only N measured there).
- mirror images (``policy.learn.mirror_board``): the game is the same mirrored left to right, so
  PPO learns each minibatch row as its mirror image half the time, at no extra compute. With
  the anneal at 1 M env steps, three seeds: last evals 0.79-0.83, best 0.88-0.93, and 308-358 of
  400 games won, where the same sweep without mirror images won 264-295 and three constant-rate
  sweeps 198-298 (docs/performance.md). This preset's own setting, mirror images at a constant
  rate, has no sweep yet.
- tasks of 4,096 moves: a task plays one opponent, so shorter tasks than the default 20,000
  meet more of the league.
- budget: 3 M env steps (the learning player's moves).
"""

main_config = dict(
    exp_name="connect_four_ppo",
    seed=0,
    env=dict(
        env_id="rqrl/ConnectFour-v0",
        collector_env_num=8,
        evaluator_env_num=10,
        n_evaluator_episode=100,
        stop_value=0.9,
        wrappers=[dict(type="common.games:WinReward", eval_only=True)],
    ),
    policy=dict(
        model=dict(encoder_hidden_size_list=[256, 256], actor_head_hidden_size=128, critic_head_hidden_size=128,
                   action_mask=True, board=[6, 7, 2], conv=[[64, 4, 1]]),
        learn=dict(epoch_per_collect=10, batch_size=256, learning_rate=1e-3, value_weight=0.5, entropy_weight=0.01,
                   clip_ratio=0.2, mirror_board=True),
        # Tasks of 4,096 moves (~2 s): each task plays one opponent, so short tasks meet more of the league.
        collect=dict(n_sample=2048, discount_factor=0.99, gae_lambda=0.95, collector=dict(task_env_steps=4096)),
    ),
    commander=dict(eval_every_train_iter=10, eval_interval=0.0, confirm_eval_episodes=200, max_env_step=3_000_000,
                   league=dict(snapshot_every=10, self_play_share=0.2, weighting="hard",
                               opponent_lookahead="win_or_block")),
)

create_config = dict(policy=dict(type="ppo"), commander=dict(type="league"))
