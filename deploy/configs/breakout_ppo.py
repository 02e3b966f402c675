"""PPO on Atari Breakout (ALE/Breakout-v5), with the hyperparameters of Schulman et al.'s Atari
runs (as CleanRL's ppo_atari); needs the ``atari`` extra (``pip install 'rqrl[atari]'``).

``env.preset="atari"`` as in pong_dqn.py: uint8 (4, 84, 84) observations, the Nature conv torso
with a 512-unit layer shared by the actor and critic heads. One update is ``n_sample`` = 1024
rows (2 collector tasks x 8 envs x 64 steps), 4 epochs of minibatches of 256. Training episodes
end at each lost life (the game plays on) and FIRE serves the ball after every reset. Evals play
whole games (ALE's 108,000-frame limit) for the raw score and sample from the policy
(``policy.eval.sample``): a policy that puts most of its probability on NOOP would, acting
greedily, never serve the ball again after a lost life and play until that limit. Evals keep to
commander.eval_max_share of the time, so a weak policy's long evals do not starve training on a
small machine.
"""

main_config = dict(
    exp_name="breakout_ppo",
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
        learn=dict(epoch_per_collect=4, batch_size=256, learning_rate=2.5e-4, value_weight=0.5, entropy_weight=0.01,
                   clip_ratio=0.1, grad_clip_norm=0.5),
        collect=dict(n_sample=1024, discount_factor=0.99, gae_lambda=0.95),
        # No env-step cap of our own: ALE's 108,000-frame limit (27,000 env steps) ends every eval episode.
        eval=dict(evaluator=dict(max_episode_seconds=300.0, max_env_steps=0), sample=True),
    ),
    commander=dict(eval_every_train_iter=50, eval_interval=30.0),
)

create_config = dict(policy=dict(type="ppo"))
