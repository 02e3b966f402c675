"""DQN on Acrobot-v1 with rl-zoo's tuned settings (DLR-RM/rl-baselines3-zoo, hyperparams/dqn.yml,
``Acrobot-v1``, the same numbers as its LunarLander entry): the config the results page sets beside
Stable-Baselines3 (issue 34's rl-zoo parity). ``deploy/configs/acrobot_dqn.py`` stays the Acrobot
preset, with DI-engine's CartPole settings that pass -100 in tens of thousands of env steps.

Where each number comes from (rl-zoo's name in brackets):

- network 256x256 (``net_arch=[256, 256]``), a plain Q head, one-step returns, as SB3's DQN; the
  target is double DQN's (rqrl's default; ``--set policy.learn.double=False`` gives SB3's max).
- Adam at 6.3e-4 (``learning_rate``), batch 128 (``batch_size``), discount 0.99 (``gamma``),
  replay buffer 50,000 transitions (``buffer_size``), gradient norm clipped at 10 (SB3's
  ``max_grad_norm``), Huber loss.
- one update per env step (``train_freq: 4``, ``gradient_steps: -1``), learning from 128 env
  steps on (``learning_starts: 0``; rqrl draws its first batch of 128 from that many).
- target network copied every 250 env steps (``target_update_interval``): 250 train iterations.
- epsilon from 1.0 to 0.1 linearly over the first 12% of 100,000 env steps
  (``exploration_fraction: 0.12``, ``exploration_final_eps: 0.1``): 12,000 env steps.
- one env per collector, acting at most 16 env steps ahead of what the learner trained on, with
  weights published every 8 train iterations, as the MountainCar and LunarLander presets
  (deploy/configs/mountaincar_dqn.py says why).
- stop_value -100 (gymnasium's reward threshold); budget 100,000 env steps (``n_timesteps``),
  evals every 5,000 env steps on 5 episodes.
"""

main_config = dict(
    exp_name="acrobot_dqn_zoo",
    seed=0,
    env=dict(
        env_id="Acrobot-v1",
        collector_env_num=1,
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=-100.0,
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
