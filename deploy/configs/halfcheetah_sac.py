"""SAC on MuJoCo HalfCheetah-v5 (needs the extra: pip install -e ".[mujoco]").

Sizes as the usual SAC MuJoCo setups (hidden 256, batch 256, 10k random env steps, one train
iteration per env step). On a 2-core machine it does not converge in a benchmark budget; the
benchmark runs it for a fixed time and reports env steps/s and the eval return it reached.
"""

main_config = dict(
    exp_name="halfcheetah_sac",
    seed=0,
    env=dict(
        env_id="HalfCheetah-v5",
        collector_env_num=4,
        evaluator_env_num=2,
        n_evaluator_episode=2,
        stop_value=3000.0,
    ),
    policy=dict(
        model=dict(actor_hidden_size_list=[256, 256], critic_hidden_size_list=[256, 256]),
        learn=dict(batch_size=256, learning_rate_q=3e-4, learning_rate_policy=3e-4, learning_rate_alpha=3e-4,
                   target_theta=0.005, train_iter_per_env_step=1.0),
        collect=dict(n_sample=128),
        other=dict(replay_buffer=dict(replay_buffer_size=1_000_000, replay_start_size=10_000)),
    ),
    commander=dict(eval_every_train_iter=5000, eval_interval=120.0, max_wall_seconds=3600.0),
)

create_config = dict(
    policy=dict(type="sac"),
    learner=dict(type="base"),
    commander=dict(type="solo"),
)
