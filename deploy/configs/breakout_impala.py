"""IMPALA (V-trace) on Atari Breakout (ALE/Breakout-v5); needs the ``atari`` extra
(``pip install 'rqrl[atari]'``).

- env: ``env.preset="atari"`` as breakout_ppo.py (uint8 (4, 84, 84) frames, a lost life terminal
  for learning while the game plays on, FIRE after each reset, rewards clipped to [-1, 1]).
- network: the Nature conv torso and a 512-unit layer shared by the actor and critic heads (the
  IMPALA paper's "shallow" agent is this torso; Espeholt et al. 2018, figure 3).
- V-trace and the loss: the IMPALA paper's Atari settings (its appendix): unroll length 20, 32
  trajectories per train iteration, rho_bar = c_bar = 1, lambda = 1, baseline cost 0.5, entropy
  cost 0.01, discount 0.99, gradient-norm clip 40, step size 6e-4 (Adam here, RMSProp there).
- back-pressure: collectors pause once 4 batches wait untrained; a trajectory more than 50
  policy versions old is dropped and counted.
- evals: whole games (ALE's 108,000-frame limit) sampling from the policy (``policy.eval.sample``,
  as breakout_ppo.py: a greedy policy that favours NOOP would never serve the ball again), every
  50 train iterations or 30 s. No budget: the paper trains for 200 M frames; stop at 200.
"""

main_config = dict(
    exp_name="breakout_impala",
    seed=0,
    env=dict(
        env_id="ALE/Breakout-v5",
        preset="atari",
        collector_env_num=8,
        evaluator_env_num=4,
        n_evaluator_episode=4,
        stop_value=200.0,
    ),
    policy=dict(
        model=dict(encoder_hidden_size_list=[512], actor_head_hidden_size=128, critic_head_hidden_size=128),
        learn=dict(batch_size=32, learning_rate=6e-4, value_weight=0.5, entropy_weight=0.01, rho_bar=1.0, c_bar=1.0,
                   grad_clip_norm=40.0, max_queued_rows=128, max_policy_lag=50),
        collect=dict(unroll_length=20, discount_factor=0.99, vtrace_lambda=1.0),
        eval=dict(evaluator=dict(max_episode_seconds=300.0, max_env_steps=0), sample=True),
    ),
    commander=dict(eval_every_train_iter=50, eval_interval=30.0),
)

create_config = dict(policy=dict(type="impala"))
