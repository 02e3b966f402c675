"""DQN on MountainCar-v0 (stop_value -110, gymnasium's reward threshold for the env), with
rl-zoo's tuned settings (DLR-RM/rl-baselines3-zoo, hyperparams/dqn.yml, ``MountainCar-v0``).

Where each number comes from (rl-zoo's name in brackets; SB3 counts its intervals in env steps,
rqrl's target network in train iterations):

- network 256x256 (``net_arch=[256, 256]``), a plain Q head (``dueling=False``), one-step returns
  (``nstep=1``) as SB3's DQN; the target is double DQN's (rqrl's default), not SB3's plain max
  (``--set policy.learn.double=False`` trains with SB3's).
- Adam at 4e-3 (``learning_rate``), batch 128 (``batch_size``), discount 0.98 (``gamma``),
  replay buffer 10,000 transitions (``buffer_size``), learning from 1,000 env steps on
  (``learning_starts``), gradient norm clipped at 10 (SB3's ``max_grad_norm``), Huber loss.
- 8 updates per 16 env steps (``train_freq: 16``, ``gradient_steps: 8``): a replay ratio of 0.5.
- one env per collector, as SB3 steps one (rl-zoo's default ``n_envs: 1``), and a collector that
  acts at most 16 env steps ahead of what the learner trained on (``max_env_step_lead``), with
  weights published every 8 train iterations and read after every chunk of 16 rows: SB3 acts
  16 env steps with the weights its last 8 updates left. With the preset's earlier 4 envs per
  collector, chunks of 64 and a lead of 256 the greedy policy scored -200 at the budget in 6 of 11
  runs, SB3 in 1 of 11; rqrl's own DQN in SB3's loop in one process
  (tests/bench/bench_dqn_loop.py) scores a median of -106.2 with one env and -200.0 with four
  (docs/performance.md).
- target network copied every 600 env steps (``target_update_interval``): 300 train iterations
  at that ratio.
- epsilon from 1.0 to 0.07 linearly over the first 20% of 120,000 env steps
  (``exploration_fraction: 0.2``, ``exploration_final_eps: 0.07``): 24,000 env steps.
- budget: 120,000 env steps (``n_timesteps``). Evals every 5,000 env steps on 5 episodes, acting
  with epsilon 0.05 (``policy.eval.eps``).
"""

main_config = dict(
    exp_name="mountaincar_dqn",
    seed=0,
    env=dict(
        env_id="MountainCar-v0",
        collector_env_num=1,
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=-110.0,
    ),
    policy=dict(
        nstep=1,
        discount_factor=0.98,
        model=dict(hidden_size_list=[256, 256], dueling=False),
        learn=dict(batch_size=128, learning_rate=4e-3, target_update_freq=300, huber_delta=1.0, grad_clip_norm=10.0,
                   train_iter_per_env_step=0.5, max_env_step_lead=16, learner=dict(send_policy_freq=8)),
        collect=dict(n_sample=16),
        other=dict(
            eps=dict(type="linear", start=1.0, end=0.07, decay=24_000),
            replay_buffer=dict(replay_buffer_size=10_000, replay_start_size=1000),
        ),
    ),
    commander=dict(eval_every_train_iter=0, eval_every_env_step=5000, eval_interval=0.0, max_env_step=120_000),
)

create_config = dict(policy=dict(type="dqn"))
