"""PPO on CartPole-v1 (stop_value 195), after DI-engine's cartpole_ppo_config.

DI-engine's hyperparameters: n_sample 256 rows per update, 2 epochs of minibatch 64, learning
rate 1e-3, discount 0.9, GAE lambda 0.95. The n_sample rows of each update are split over the
collector tasks running at once; the learner trains only on rows of its current policy version.
With the default 2 collector tasks of 4 envs each, one update sees 8 envs x 32 steps, the
rollout of DI-engine's serial config (8 envs); 2 x 8 envs x 16 steps needs about 1.25-1.5x the
env steps (docs/performance.md).
"""

main_config = dict(
    exp_name="cartpole_ppo",
    seed=0,
    env=dict(
        env_id="CartPole-v1",
        collector_env_num=4,  # per collector task
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=195.0,
    ),
    policy=dict(
        model=dict(encoder_hidden_size_list=[64, 64, 128], actor_head_hidden_size=128, critic_head_hidden_size=128),
        learn=dict(epoch_per_collect=2, batch_size=64, learning_rate=1e-3, value_weight=0.5, entropy_weight=0.01,
                   clip_ratio=0.2),
        collect=dict(n_sample=256, discount_factor=0.9, gae_lambda=0.95),
    ),
    commander=dict(eval_every_train_iter=5, eval_interval=60.0, max_wall_seconds=300.0),
)

create_config = dict(
    policy=dict(type="ppo"),
    learner=dict(type="base"),
    commander=dict(type="solo"),
)
