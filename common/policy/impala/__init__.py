"""IMPALA (V-trace actor-critic, Espeholt et al. 2018) and, with ``policy.learn.appo_clip`` > 0,
APPO (PPO's clipped surrogate on V-trace advantages, as Sample Factory and RLlib): defaults, config
check (no torch; see policy.py for the math).

Collectors act on with whatever weights they hold (the ``consume_once`` source never makes them
wait for a new version) and send trajectories of ``unroll_length`` steps with the behaviour
policy's log-probabilities; the learner trains on each once, in arrival order, and corrects the
policy lag with V-trace. Defaults are the paper's for Atari (its appendix): unroll 20, rho_bar =
c_bar = 1, lambda = 1, baseline cost 0.5, entropy cost 0.01, discount 0.99, gradient-norm clip 40;
Adam (the project's optimiser, common/policy/nets.py) in place of the paper's RMSProp.
"""

from __future__ import annotations

from typing import Any

from common.policy.base import Algorithm

CONFIG: dict[str, Any] = dict(
    # PPO's actor-critic (common/policy/ppo/policy.py), so the two compare on the same net.
    model=dict(encoder_hidden_size_list=[64, 64, 128], actor_head_hidden_size=128, critic_head_hidden_size=128,
               init_log_std=-0.5),
    learn=dict(
        batch_size=32,  # trajectories of unroll_length steps per train iteration
        learning_rate=6e-4,
        value_weight=0.5,
        entropy_weight=0.01,
        rho_bar=1.0,  # clip of the importance weights in the value targets' TD errors
        c_bar=1.0,  # clip of the trace-cutting weights
        pg_rho_bar=1.0,  # clip of the importance weight of the policy-gradient advantage
        # 0: IMPALA's policy gradient. > 0: APPO, PPO's clipped surrogate of pi/mu with this clip on
        # V-trace advantages (policy.py); Sample Factory's APPO default is 0.1, RLlib's 0.4.
        appo_clip=0.0,
        grad_clip_norm=40.0,
        # Back-pressure (workers/sources/consume_once.py): collectors pause once this many rows
        # (trajectories) wait untrained, and a row more than max_policy_lag versions old is dropped
        # and counted. 4 batches queued keep the lag near 4 versions, far inside the lag cap.
        max_queued_rows=128,
        max_policy_lag=50,
    ),
    collect=dict(unroll_length=20, discount_factor=0.99, vtrace_lambda=1.0),
    eval=dict(sample=False),  # as PPO's: True samples from the policy
)


def check_config(policy: dict[str, Any]) -> None:
    """Raises ValueError naming the first ``policy.*`` key out of its range."""
    learn, collect = policy["learn"], policy["collect"]
    for name in ("rho_bar", "c_bar", "pg_rho_bar"):
        if not learn[name] > 0:
            raise ValueError(f"config key 'policy.learn.{name}' must be > 0 (an importance-weight clip), got {learn[name]!r}")
    if not 0 <= learn["appo_clip"] < 1:
        raise ValueError(f"config key 'policy.learn.appo_clip' must be in [0, 1) (0: IMPALA, else APPO's clip), "
                         f"got {learn['appo_clip']!r}")
    if int(collect["unroll_length"]) < 1:
        raise ValueError(f"config key 'policy.collect.unroll_length' must be >= 1, got {collect['unroll_length']!r}")
    for name in ("discount_factor", "vtrace_lambda"):
        if not 0 <= collect[name] <= 1:
            raise ValueError(f"config key 'policy.collect.{name}' must be in [0, 1], got {collect[name]!r}")
    if int(learn["max_queued_rows"]) < int(learn["batch_size"]):
        raise ValueError(f"config key 'policy.learn.max_queued_rows' must be >= policy.learn.batch_size "
                         f"({learn['batch_size']}: a batch must fit in the queue), got {learn['max_queued_rows']!r}")
    if int(learn["max_policy_lag"]) < 0:
        raise ValueError(f"config key 'policy.learn.max_policy_lag' must be >= 0, got {learn['max_policy_lag']!r}")
    if learn["grad_clip_norm"] < 0:
        raise ValueError(f"config key 'policy.learn.grad_clip_norm' must be >= 0 (0: no clip), got {learn['grad_clip_norm']!r}")


ALGORITHM = Algorithm(name="impala", data_source="consume_once", policy_class="common.policy.impala.policy:ImpalaPolicy",
                      config=CONFIG, check_config=check_config)
