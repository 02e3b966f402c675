"""Policies and their four modes, as DI-engine's policy seam (learn / collect / eval / command).

The loop each mode serves::

    # learner (workers/learner.py)
    log_vars = policy.learn_mode.forward(batch)          # one train iteration
    blob = policy.learn_mode.publishable_state()         # weights for collectors, every N iters

    # collector (workers/collector.py)
    policy.collect_mode.load_weights(blob)               # when the published version changed
    actions = policy.collect_mode.forward(obs, eps=eps)  # batched over the vector env
    samples = policy.collect_mode.process_step(...)      # n-step transitions, ready to send

    # evaluator (eval tasks of the collector)
    actions = policy.eval_mode.forward(obs)              # greedy

    # commander (coordinator/commander.py)
    setting = policy.command_mode.get_setting_collect({"envstep": n})   # e.g. {"eps": 0.42}
"""

from common.policy.base import Policy, create_policy

__all__ = ["Policy", "create_policy"]
