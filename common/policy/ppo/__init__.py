"""PPO (clipped surrogate, GAE): defaults and collect setting (no torch; see policy.py for the math).

Defaults follow DI-engine's ``dizoo/classic_control/cartpole/config/cartpole_ppo_config.py``:
n_sample 256, 2 epochs of minibatch 64, learning rate 1e-3, discount 0.9, GAE lambda 0.95.
"""

from __future__ import annotations

import math
from typing import Any

from easydict import EasyDict

from common.policy.base import Algorithm

CONFIG: dict[str, Any] = dict(
    model=dict(encoder_hidden_size_list=[64, 64, 128], actor_head_hidden_size=128, critic_head_hidden_size=128,
               init_log_std=-0.5,
               # The last action_n observation entries are legal-action flags (a two-player game
               # of common/games.py): illegal actions are never taken (policy.py ActorCritic).
               action_mask=False),
    learn=dict(
        epoch_per_collect=2,
        batch_size=64,  # minibatch rows
        learning_rate=1e-3,
        clip_ratio=0.2,
        value_weight=0.5,
        entropy_weight=0.01,
        value_clip=True,  # clip the value update around the old value, as the policy ratio
        adv_norm=True,
        grad_clip_norm=0.5,
        # 0: a constant learning rate; N > 0: it falls linearly from learning_rate to 0 over N train
        # iterations (CleanRL's anneal_lr, over its run's updates: set N to the budget's iterations).
        lr_anneal_iters=0,
        # A board game that plays the same mirrored left to right, one action per column (Connect
        # Four): each minibatch row is its mirror image with probability 1/2 (policy.py).
        mirror_board=False,
    ),
    collect=dict(n_sample=256, discount_factor=0.9, gae_lambda=0.95),
    # Evals act with the most likely action (Discrete) / the mean (Box); True samples from the
    # policy as in training (from the eval's own seeded generator), so a policy that is nearly
    # sure of a do-nothing action cannot stall a game that waits for another one.
    eval=dict(sample=False),
)


def collect_setting(cfg: EasyDict, info: dict[str, Any]) -> dict[str, Any]:
    """Each collector's share of one rollout: ``n_sample`` rows per train iteration split over
    ``info["collectors"]`` concurrent collector tasks, so an update waits for all of them once
    rather than dropping all but the first one's rollout."""
    share = max(1, int(info.get("collectors", 1)))
    return {"rollout_rows": int(math.ceil(int(cfg.collect.n_sample) / share))}


def check_config(policy: dict[str, Any]) -> None:
    """Raises ValueError naming a ``policy.learn`` key out of its range (its type is the merge's check)."""
    if policy["learn"]["lr_anneal_iters"] < 0:
        raise ValueError(f"config key 'policy.learn.lr_anneal_iters' must be an int >= 0 (train iterations; "
                         f"0 = a constant learning rate), got {policy['learn']['lr_anneal_iters']!r}")


ALGORITHM = Algorithm(name="ppo", data_source="on_policy", policy_class="common.policy.ppo.policy:PPOPolicy",
                      config=CONFIG, collect_setting=collect_setting, check_config=check_config)
