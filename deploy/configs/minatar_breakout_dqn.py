"""DQN on MinAtar Breakout (MinAtar/Breakout-v1 with the full action set), as the MinAtar paper's DQN baseline: Young &
Tian 2019, "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible Reinforcement
Learning Experiments" (arXiv:1903.03176), whose settings are those of its reference
implementation, MinAtar's examples/dqn.py. Needs the ``minatar`` extra
(``pip install 'rqrl[minatar]'``, or ``pip install minatar --no-deps``: the envs need numpy only).

Where each number comes from:

- the game: MinAtar Breakout with the full 6-action set the paper's agents had
  (``use_minimal_action_set=False``: ``-v1`` alone is MinAtar's minimal set of 3; ``-v0`` is the
  same game as this, under an id gymnasium reports as out of date), sticky actions 0.1 and
  difficulty ramping (MinAtar's defaults, as in the paper). Observations are bool (10, 10, 4)
  grids, image channels scaled by 1, not 255.
- network (paper, section 4 / dqn.py ``QNetwork``): one conv of 16 3x3 filters, stride 1, then
  one hidden layer of 128 units (``hidden_size_list=[128]``), one output per action; no dueling
  head (``dueling=False``), as the paper's plain DQN.
- replay buffer 100,000 transitions, batch 32, discount 0.99, one update per env step
  (``train_iter_per_env_step=1``, dqn.py ``TRAINING_FREQ = 1``), learning from 5,000 env steps on
  (``REPLAY_START_SIZE``), target network copied every 1,000 updates
  (``TARGET_NETWORK_UPDATE_FREQ``), Huber loss (smooth L1 with delta 1), one-step returns
  (``nstep=1``), no gradient clipping: all dqn.py's.
- epsilon from 1.0 down to 0.1 linearly over 100,000 env steps (dqn.py ``FIRST_N_FRAMES``,
  ``END_EPSILON``); dqn.py anneals from its replay start at 5,000, so here 0.1 is reached 5,000
  env steps earlier.
- the optimizer is where this config departs: dqn.py uses centered RMSprop (step size 2.5e-4,
  alpha 0.95, momentum 0.95, eps 0.01); rqrl's DQN has Adam, here at the same step size 2.5e-4.
  The target is double DQN's (van Hasselt et al. 2016; rqrl's DQN), not the paper's plain max.
- budget: 5 M env steps (``commander.max_env_step``), the paper's. The paper reports training
  returns; rqrl evaluates every 10,000 env steps on 8 episodes with epsilon 0.05 (Nature DQN's
  evaluation epsilon, ``policy.eval.eps``). stop_value 100 is far above the paper's final DQN
  returns, so a run ends at its budget and its evals give the curve.
- MinAtar episodes have no step limit of their own, so evals have no env-step cap
  (``max_env_steps=0``; a time cap per episode instead).
"""

main_config = dict(
    exp_name="minatar_breakout_dqn",
    seed=0,
    env=dict(
        env_id="MinAtar/Breakout-v1",
        env_kwargs=dict(use_minimal_action_set=False),
        collector_env_num=4,
        evaluator_env_num=4,
        n_evaluator_episode=8,
        stop_value=100.0,
    ),
    policy=dict(
        nstep=1,
        discount_factor=0.99,
        model=dict(conv=[[16, 3, 1]], hidden_size_list=[128], dueling=False),
        learn=dict(batch_size=32, learning_rate=2.5e-4, target_update_freq=1000, huber_delta=1.0, grad_clip_norm=0.0,
                   train_iter_per_env_step=1.0, max_env_step_lead=1000),
        collect=dict(n_sample=128),
        eval=dict(evaluator=dict(max_episode_seconds=60.0, max_env_steps=0)),
        other=dict(
            eps=dict(type="linear", start=1.0, end=0.1, decay=100_000),
            replay_buffer=dict(replay_buffer_size=100_000, replay_start_size=5000),
        ),
    ),
    commander=dict(eval_every_env_step=10_000, eval_every_train_iter=0, eval_interval=0.0, max_env_step=5_000_000),
)

create_config = dict(policy=dict(type="dqn"))
