"""DQN on Acrobot-v1 (stop_value -100, gymnasium's reward threshold for the env).

The hyperparameters are DI-engine's CartPole DQN settings (dizoo/classic_control/cartpole/config/
cartpole_dqn_config.py, as deploy/configs/cartpole_dqn.py: double DQN with a dueling head of
128x128, 3-step returns, discount 0.97, batch 64, Adam 1e-3, target network copied every 100
train iterations, epsilon from 0.95 to 0.1 exponentially over 10,000 env steps), which solve
Acrobot as they are: this is the README's ``--set env.env_id=Acrobot-v1 --set env.stop_value=-100``
run as a file of its own (docs/results.md has its 5 seeds). DI-engine's own Acrobot config
(acrobot_dqn_config.py: Adam 1e-4, epsilon decayed over 250,000 env steps, stop_value -60) and
rl-zoo's tuned one (hyperparams/dqn.yml: 100,000 env steps, 256x256, one update per env step)
train far longer; this machine-sized one learns in tens of thousands of env steps.

Budget: 100,000 env steps (rl-zoo's ``n_timesteps`` for Acrobot-v1).
"""

main_config = dict(
    exp_name="acrobot_dqn",
    seed=0,
    env=dict(
        env_id="Acrobot-v1",
        collector_env_num=8,
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=-100.0,
    ),
    policy=dict(
        nstep=3,
        discount_factor=0.97,
        model=dict(hidden_size_list=[128, 128], dueling=True),
        learn=dict(batch_size=64, learning_rate=1e-3, target_update_freq=100, train_iter_per_env_step=0.5),
        collect=dict(n_sample=128),
        other=dict(
            eps=dict(type="exp", start=0.95, end=0.1, decay=10000),
            replay_buffer=dict(replay_buffer_size=20000, replay_start_size=256),
        ),
    ),
    commander=dict(eval_every_train_iter=0, eval_every_env_step=5000, eval_interval=0.0, max_env_step=100_000),
)

create_config = dict(policy=dict(type="dqn"))
