"""IMPALA (V-trace) on MinAtar Space Invaders (MinAtar/SpaceInvaders-v1); needs the ``minatar``
extra (``pip install 'rqrl[minatar]'``, or ``pip install minatar --no-deps``).

The MinAtar Breakout impala preset (deploy/configs/minatar_breakout_impala.py) on another game:

- network: the MinAtar PPO preset's (the MinAtar paper's torso, Young & Tian 2019: one conv of
  16 3x3 filters, stride 1; one shared layer of 128 units; heads of 64), so IMPALA and PPO
  compare on one net.
- V-trace and the loss: the IMPALA paper's Atari settings (Espeholt et al. 2018, its appendix):
  unroll length 20, 32 trajectories per train iteration, rho_bar = c_bar = 1, lambda = 1,
  baseline cost 0.5, entropy cost 0.01, discount 0.99, gradient-norm clip 40, step size 6e-4
  (Adam here, the paper's RMSProp there).
- back-pressure: collectors pause once 4 batches (128 trajectories) wait untrained; a trajectory
  more than 50 policy versions old is dropped and counted.
- budget: 5 M env steps, as the MinAtar paper's runs; evals every 50,000 env steps on 8
  episodes, acting with the most likely action. stop_value 300 is not expected within the
  budget: the run ends at it, and its evals give the curve. No env-step cap on evals (MinAtar
  episodes have no step limit of their own).
"""

main_config = dict(
    exp_name="minatar_space_invaders_impala",
    seed=0,
    env=dict(
        env_id="MinAtar/SpaceInvaders-v1",
        collector_env_num=8,
        evaluator_env_num=4,
        n_evaluator_episode=8,
        stop_value=300.0,
    ),
    policy=dict(
        model=dict(conv=[[16, 3, 1]], encoder_hidden_size_list=[128], actor_head_hidden_size=64,
                   critic_head_hidden_size=64),
        learn=dict(batch_size=32, learning_rate=6e-4, value_weight=0.5, entropy_weight=0.01, rho_bar=1.0, c_bar=1.0,
                   grad_clip_norm=40.0, max_queued_rows=128, max_policy_lag=50),
        collect=dict(unroll_length=20, discount_factor=0.99, vtrace_lambda=1.0),
        eval=dict(evaluator=dict(max_episode_seconds=60.0, max_env_steps=0)),
    ),
    commander=dict(eval_every_env_step=50_000, eval_every_train_iter=0, eval_interval=0.0, max_env_step=5_000_000),
)

create_config = dict(policy=dict(type="impala"))
