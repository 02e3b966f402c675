"""Independent random streams for every task and env of a run, derived from the run's seed.

``seed + 1`` per task and ``seed + i`` per env made consecutive tasks share all but one env
seed (and so most episode start states). Here every seed is a child of
``numpy.random.SeedSequence(run_seed)`` keyed by the task number, and each env's seed a child
of the task's: streams are independent, and a run is reproducible from its seed::

    task_seed(run_seed, n)      -> the seed stamped on task n (n = 1, 2, ... in dispatch order)
    env_seeds(task_seed, k)     -> k env seeds for that task's vector env (reset(seed=list))

Task seeds are 63-bit; env seeds are 32-bit, [0, 2**32): envs that seed numpy's legacy
``RandomState`` (MinAtar) refuse larger ones ("Seed must be between 0 and 2**32 - 1").
"""

from __future__ import annotations

import numpy as np

_BITS = 63  # task seeds travel as JSON ints and through task validation: [0, 2**63)
ENV_SEED_BITS = 32  # what every env's reset(seed=...) accepts, legacy RandomState ones included


def _as_int(seq: np.random.SeedSequence) -> int:
    hi, lo = (int(x) for x in seq.generate_state(2, np.uint32))
    return ((hi << 32) | lo) & ((1 << _BITS) - 1)


def task_seed(run_seed: int, task_number: int) -> int:
    """The seed of task ``task_number`` of the run seeded ``run_seed`` (both >= 0).

    Returns:
        An int in [0, 2**63), a pure function of the two arguments.

    Raises:
        common.config.ConfigError: ``run_seed`` is negative (config key ``seed``).
    """
    if int(run_seed) < 0:
        from common.config import ConfigError

        raise ConfigError(f"config key 'seed' must be >= 0, got {run_seed}")
    return _as_int(np.random.SeedSequence(int(run_seed), spawn_key=(int(task_number),)))


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """``num_envs`` independent env seeds for a task seeded ``seed`` (its vector env's reset).

    Returns:
        Ints in [0, 2**32), one 32-bit word of each child ``SeedSequence``.
    """
    children = np.random.SeedSequence(int(seed)).spawn(int(num_envs))
    return [int(child.generate_state(1, np.uint32)[0]) for child in children]


def episode_seed(seed: int, episode: int) -> int:
    """The reset seed of episode ``episode`` of ``rqrl eval --seed seed``: ``seed + episode``,
    wrapped into [0, 2**32) (:data:`ENV_SEED_BITS`)."""
    return (int(seed) + int(episode)) % (1 << ENV_SEED_BITS)
