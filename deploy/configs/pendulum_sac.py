"""SAC on Pendulum-v1 (stop_value -250, mean over the eval episodes), after DI-engine's
pendulum_sac_config: twin critics, hidden 128, batch 128, lr 1e-3 / 1e-3 / 3e-4, tau 0.005,
discount 0.99, automatic entropy tuning, 1000 random env steps first."""

main_config = dict(
    exp_name="pendulum_sac",
    seed=0,
    env=dict(
        env_id="Pendulum-v1",
        collector_env_num=4,
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=-250.0,
    ),
    policy=dict(
        learn=dict(batch_size=128, learning_rate_q=1e-3, learning_rate_policy=1e-3, learning_rate_alpha=3e-4,
                   target_theta=0.005, train_iter_per_env_step=1.0),
        collect=dict(n_sample=64),
        other=dict(replay_buffer=dict(replay_buffer_size=100_000, replay_start_size=1000)),
    ),
    commander=dict(eval_every_train_iter=500, eval_interval=60.0, max_wall_seconds=600.0),
)

create_config = dict(
    policy=dict(type="sac"),
    learner=dict(type="base"),
    commander=dict(type="solo"),
)
