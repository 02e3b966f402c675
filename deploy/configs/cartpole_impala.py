"""IMPALA (V-trace) on CartPole-v1 (stop_value 195), asynchronous: collectors never wait for the learner.

V-trace settings are the IMPALA paper's (Espeholt et al. 2018, its Atari appendix): rho_bar = c_bar
= 1, lambda = 1, baseline cost 0.5, entropy cost 0.01, discount 0.99, unroll length 20. The net is
PPO's CartPole one (deploy/configs/cartpole_ppo.py, after DI-engine's cartpole_ppo_config), and the
learning rate and gradient-norm clip are that config's (Adam 1e-3, 0.5) rather than the paper's
RMSProp 6e-4 and clip 40, sized for a 64-unit MLP. 16 trajectories per train iteration (320 env
steps, near PPO's 256 rows per update); collectors pause once 8 batches wait untrained.

Budget: 300 s of wall time, as the PPO preset.
"""

main_config = dict(
    exp_name="cartpole_impala",
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
        learn=dict(batch_size=16, learning_rate=1e-3, value_weight=0.5, entropy_weight=0.01, rho_bar=1.0, c_bar=1.0,
                   grad_clip_norm=0.5, max_queued_rows=128, max_policy_lag=50),
        collect=dict(unroll_length=20, discount_factor=0.99, vtrace_lambda=1.0),
    ),
    commander=dict(eval_every_train_iter=10, eval_interval=30.0, max_wall_seconds=300.0),
)

create_config = dict(
    policy=dict(type="impala"),
    learner=dict(type="base"),
    commander=dict(type="solo"),
)
