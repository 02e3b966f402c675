"""PPO on MinAtar Space Invaders (MinAtar/SpaceInvaders-v1); needs the ``minatar`` extra
(``pip install 'rqrl[minatar]'``, or ``pip install minatar --no-deps``).

Where each number comes from:

- the game: ``MinAtar/SpaceInvaders-v1``, MinAtar's minimal action set (4: no-op, left, right,
  fire), sticky actions 0.1 and difficulty ramping (MinAtar's defaults). Observations are bool
  (10, 10, 6) grids, image channels scaled by 1.
- network: the MinAtar paper's torso (Young & Tian 2019: one conv of 16 3x3 filters, stride 1)
  and one shared layer of 128 units, then actor and critic heads of 64 units (the heads' width
  as pgx's MinAtar PPO example, sotetsuk/pgx examples/minatar-ppo/train.py).
- PPO's loss and optimisation settings are pgx's MinAtar PPO example's (itself from PureJaxRL):
  Adam at 3e-4, 3 epochs per rollout, clip 0.2, value weight 0.5, entropy weight 0.01, gradient
  norm 0.5, discount 0.99, GAE lambda 0.95, normalised advantages.
- the rollout's shape is CleanRL's ppo_atari (Schulman et al. 2017's Atari setting): 8 envs x
  128 steps = 1,024 rows per update (``n_sample``, split over the collector tasks), in 4
  minibatches of 256. pgx steps 4,096 envs at once on an accelerator; this is its CPU-sized form.
- budget: 5 M env steps (``commander.max_env_step``), as the MinAtar paper's runs; evals every
  50,000 env steps on 8 episodes, acting with the most likely action. stop_value 300 is not
  expected within the budget: the run ends at it, and its evals give the curve.
- MinAtar episodes have no step limit of their own, so evals have no env-step cap.
"""

main_config = dict(
    exp_name="minatar_space_invaders_ppo",
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
        learn=dict(epoch_per_collect=3, batch_size=256, learning_rate=3e-4, clip_ratio=0.2, value_weight=0.5,
                   entropy_weight=0.01, grad_clip_norm=0.5, adv_norm=True),
        collect=dict(n_sample=1024, discount_factor=0.99, gae_lambda=0.95),
        eval=dict(evaluator=dict(max_episode_seconds=60.0, max_env_steps=0)),
    ),
    commander=dict(eval_every_env_step=50_000, eval_every_train_iter=0, eval_interval=0.0, max_env_step=5_000_000),
)

create_config = dict(policy=dict(type="ppo"))
