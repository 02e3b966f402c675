"""SAC on MuJoCo Hopper-v5 (needs the extra: pip install -e ".[mujoco]"), with rl-zoo's MuJoCo
settings (DLR-RM/rl-baselines3-zoo, hyperparams/sac.yml, ``Hopper-v3``: SB3's SAC defaults with
``learning_starts: 10000`` and ``n_timesteps: 1e6``).

Twin critics and an actor of 256x256, Adam at 3e-4 for critics, actor and temperature, batch
256, Polyak 0.005, discount 0.99, automatic entropy tuning towards -|A|, a replay buffer of
1,000,000 transitions, uniformly random actions for the first 10,000 env steps, then one update
per env step (``train_freq: 1``, ``gradient_steps: 1``). stop_value 3000 (gymnasium's threshold
for Hopper is 3800; SB3's SAC reaches about 2,600-3,000 in 1 M env steps). Budget: 1,000,000 env
steps, which a 2-core machine does not finish in an hour (docs/results.md says what it ran).
"""

main_config = dict(
    exp_name="hopper_sac",
    seed=0,
    env=dict(
        env_id="Hopper-v5",
        collector_env_num=4,
        evaluator_env_num=2,
        n_evaluator_episode=4,
        stop_value=3000.0,
    ),
    policy=dict(
        model=dict(actor_hidden_size_list=[256, 256], critic_hidden_size_list=[256, 256]),
        learn=dict(batch_size=256, learning_rate_q=3e-4, learning_rate_policy=3e-4, learning_rate_alpha=3e-4,
                   target_theta=0.005, train_iter_per_env_step=1.0),
        collect=dict(n_sample=128),
        other=dict(replay_buffer=dict(replay_buffer_size=1_000_000, replay_start_size=10_000)),
    ),
    commander=dict(eval_every_train_iter=0, eval_every_env_step=20_000, eval_interval=0.0, max_env_step=1_000_000),
)

create_config = dict(policy=dict(type="sac"))
