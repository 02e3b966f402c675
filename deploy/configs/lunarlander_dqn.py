"""DQN on LunarLander-v3 (stop_value 200, gymnasium's reward threshold for the env), with
rl-zoo's tuned settings (DLR-RM/rl-baselines3-zoo, hyperparams/dqn.yml, ``LunarLander-v2``: v3
is the same task with gymnasium 1.x's fixes). Needs Box2D: the ``box2d`` extra
(``pip install -e ".[box2d]"``).

Where each number comes from (rl-zoo's name in brackets; SB3 counts its intervals in env steps,
rqrl's target network in train iterations):

- network 256x256 (``net_arch=[256, 256]``), a plain Q head (``dueling=False``), one-step returns
  (``nstep=1``) as SB3's DQN; the target is double DQN's (rqrl's default), not SB3's plain max
  (``--set policy.learn.double=False`` trains with SB3's).
- Adam at 6.3e-4 (``learning_rate``), batch 128 (``batch_size``), discount 0.99 (``gamma``),
  replay buffer 50,000 transitions (``buffer_size``), gradient norm clipped at 10 (SB3's
  ``max_grad_norm``), Huber loss.
- one update per env step (``train_freq: 4``, ``gradient_steps: -1``: as many updates as env
  steps collected): a replay ratio of 1, learning from 128 env steps on (rl-zoo's
  ``learning_starts: 0``; rqrl draws its first batch of 128 from that many).
- one env per collector, as SB3 steps one (rl-zoo's default ``n_envs: 1``), and a collector that
  acts at most 16 env steps ahead of what the learner trained on (``max_env_step_lead``), with
  weights published every 8 train iterations and read after every chunk of 16 rows. SB3 acts 4
  env steps with the weights its last 4 updates left: this is nearer that than the earlier 4 envs,
  chunks of 64 and lead of 256, but not the same. The preset's MountainCar twin
  (deploy/configs/mountaincar_dqn.py) says what 4 envs per collector and a lead of 256 cost there.
- target network copied every 250 env steps (``target_update_interval``): 250 train iterations
  at that ratio.
- epsilon from 1.0 to 0.1 linearly over the first 12% of 100,000 env steps
  (``exploration_fraction: 0.12``, ``exploration_final_eps: 0.1``): 12,000 env steps.
- budget: 100,000 env steps (``n_timesteps``). Evals every 5,000 env steps on 5 episodes, acting
  with epsilon 0.05 (``policy.eval.eps``).
"""

main_config = dict(
    exp_name="lunarlander_dqn",
    seed=0,
    env=dict(
        env_id="LunarLander-v3",
        collector_env_num=1,
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=200.0,
    ),
    policy=dict(
        nstep=1,
        discount_factor=0.99,
        model=dict(hidden_size_list=[256, 256], dueling=False),
        learn=dict(batch_size=128, learning_rate=6.3e-4, target_update_freq=250, huber_delta=1.0, grad_clip_norm=10.0,
                   train_iter_per_env_step=1.0, max_env_step_lead=16, learner=dict(send_policy_freq=8)),
        collect=dict(n_sample=16),
        other=dict(
            eps=dict(type="linear", start=1.0, end=0.1, decay=12_000),
            replay_buffer=dict(replay_buffer_size=50_000, replay_start_size=128),
        ),
    ),
    commander=dict(eval_every_train_iter=0, eval_every_env_step=5000, eval_interval=0.0, max_env_step=100_000),
)

create_config = dict(policy=dict(type="dqn"))
