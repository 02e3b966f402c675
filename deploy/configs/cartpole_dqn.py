"""DQN on CartPole-v1 (stop_value 195), the rqrl counterpart of DI-engine's cartpole_dqn_config.

Observation and action shapes are read from the env (policy.model.obs_shape / action_shape
unset), so ``--set env.env_id=Acrobot-v1 --set env.stop_value=-100`` trains Acrobot as is.
"""

main_config = dict(
    exp_name="cartpole_dqn",
    seed=0,
    env=dict(
        env_id="CartPole-v1",
        collector_env_num=8,
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=195.0,
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
    commander=dict(eval_every_train_iter=200, eval_interval=60.0, max_wall_seconds=300.0),
)

create_config = dict(
    policy=dict(type="dqn"),
    learner=dict(type="base"),
    commander=dict(type="solo"),
)
