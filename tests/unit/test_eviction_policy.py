"""Every Redis eviction policy but ``noeviction`` is refused before a run (issue 21, planted bug 4).

``volatile-*`` policies evict only keys with a TTL, and rqrl's step data, heartbeats and leases
all carry one, so they lose data as surely as ``allkeys-*``. A stub ``INFO memory`` keeps this a
unit test: the real-server path is tests/integration/test_redis_memory.py.
"""

from __future__ import annotations

import pytest
from easydict import EasyDict

from common.redis_memory import RedisNotSuitable, check_memory_settings

EVICTING = ["allkeys-lru", "allkeys-lfu", "allkeys-random",
            "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"]


class _Info:
    def __init__(self, policy: str):
        self.policy = policy

    def info(self, section: str) -> dict:
        assert section == "memory"
        return {"used_memory": 1 << 20, "maxmemory": 0, "maxmemory_policy": self.policy}


@pytest.mark.parametrize("policy", EVICTING)
def test_an_evicting_policy_is_refused_by_name(policy):
    with pytest.raises(RedisNotSuitable, match=f"maxmemory-policy is '{policy}'.*--allow-eviction"):
        check_memory_settings(_Info(policy), EasyDict())


@pytest.mark.parametrize("policy", EVICTING)
def test_allow_eviction_runs_with_a_warning(policy):
    (warning,) = check_memory_settings(_Info(policy), EasyDict(), allow_eviction=True)
    assert policy in warning and "allowed by --allow-eviction" in warning


def test_noeviction_passes_without_a_word():
    assert check_memory_settings(_Info("noeviction"), EasyDict()) == []
