"""DQN on Atari Pong (ALE/Pong-v5, stop_value 20), after DI-engine's pong_dqn_config; needs the
``atari`` extra (``pip install 'rqrl[atari]'``: ale-py, whose wheel ships the ROMs).

``env.preset="atari"`` wraps the game as SB3's AtariWrapper and CleanRL do (frame skip 4, 84x84
grey, 4 stacked frames; sticky actions 0.25 as v5; noop starts; FIRE after reset; life loss
terminal and rewards clipped to [-1, 1] for training only; common/envs.py). Evals act
epsilon-greedy with epsilon 0.05 (``policy.eval.eps``). Observations are uint8 (4, 84, 84)
and get the Nature DQN conv torso (policy.model.conv) with one 512-unit layer; they stay uint8
until the learner's device. Pong needs millions of env steps; give the run a budget, e.g.
``--set commander.max_wall_seconds=3600``.
"""

main_config = dict(
    exp_name="pong_dqn",
    seed=0,
    env=dict(
        env_id="ALE/Pong-v5",
        preset="atari",
        collector_env_num=8,
        evaluator_env_num=4,
        n_evaluator_episode=4,
        stop_value=20.0,
    ),
    policy=dict(
        nstep=3,
        discount_factor=0.99,
        model=dict(hidden_size_list=[512], dueling=True),
        learn=dict(batch_size=32, learning_rate=1e-4, target_update_freq=500, train_iter_per_env_step=0.25,
                   max_env_step_lead=2048),
        collect=dict(n_sample=128),
        # No env-step cap of our own: ALE's 108,000-frame limit (27,000 env steps) ends every eval episode.
        eval=dict(evaluator=dict(max_episode_seconds=300.0, max_env_steps=0)),
        other=dict(
            eps=dict(type="exp", start=1.0, end=0.05, decay=250_000),
            replay_buffer=dict(replay_buffer_size=100_000, replay_start_size=2000),
        ),
    ),
    commander=dict(eval_every_train_iter=5000, eval_interval=60.0),
)

create_config = dict(policy=dict(type="dqn"))
