"""The commander and Policy contracts: what the coordinator and the workers rely on is declared,
and an implementation that lacks a part of it is refused when built, naming what is missing."""

from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

from common.policy.base import Policy
from common.registry import COMMANDER_REGISTRY
from coordinator.commander import BaseCommander, SoloCommander, create_commander


class _NoExports(BaseCommander):
    """A commander that hands out tasks but never says which evals were best or final."""

    def get_collector_task(self) -> Optional[dict]:
        return None

    def get_learner_task(self) -> Optional[dict]:
        return None

    def finish_collector_task(self, task_id: str, finished_task: dict) -> bool:
        return False

    def finish_learner_task(self, task_id: str, finished_task: dict) -> str:
        return ""

    def notify_fail_collector_task(self, task: dict) -> None:
        pass

    def notify_fail_learner_task(self, task: dict) -> None:
        pass

    def update_learner_info(self, task_id: str, info: dict) -> None:
        pass


def test_a_commander_without_the_members_the_coordinator_reads_cannot_be_built():
    with pytest.raises(TypeError) as e:
        _NoExports()
    for member in ("best_eval", "eval_bundles_in_use", "final_eval_task", "last_eval", "players", "summary",
                   "state_dict", "load_state_dict",
                   "restore", "total_envstep", "train_iter"):
        assert member in str(e.value)


def test_create_commander_refuses_a_class_outside_the_contract(small_cfg):
    COMMANDER_REGISTRY.register("not_a_commander")(lambda cfg, **kw: object())
    cfg = dict(small_cfg, create={"commander": {"type": "not_a_commander"}})
    with pytest.raises(TypeError, match="'not_a_commander' .*does not subclass coordinator.commander.BaseCommander"):
        create_commander(type(small_cfg)(cfg))
    assert isinstance(create_commander(small_cfg), SoloCommander)


class _DictPolicy(Policy):
    """Optimizers and networks kept in containers, where an attribute scan would not see them."""

    def __init__(self) -> None:
        super().__init__({"policy": {"cuda": False}}, spec=None, modes=("learn",), device="cpu")
        self.nets = {"actor": torch.nn.Linear(2, 1), "critic": torch.nn.Linear(2, 1)}
        self.optims = [torch.optim.SGD(self.nets["actor"].parameters(), lr=0.1),
                       torch.optim.SGD(self.nets["critic"].parameters(), lr=0.1)]
        self._target = self.nets["critic"]  # the same module under a second name is listed once

    def schema(self) -> Any: ...
    def act(self, obs, setting, rng) -> Any: ...
    def act_eval(self, obs, rng) -> Any: ...
    def make_adder(self, env_num, setting) -> Any: ...
    def learn(self, batch) -> Any: ...
    def get_weights(self) -> Any: ...
    def set_weights(self, weights) -> None: ...
    def state_dict(self) -> Any: ...
    def load_state_dict(self, state) -> None: ...


def test_a_policy_finds_optimizers_and_modules_held_in_containers():
    p = _DictPolicy()
    assert p.device == torch.device("cpu")
    assert p.optimizers() == p.optims  # both: gradient averaging covers every update
    assert list(p.modules()) == ["nets.actor", "nets.critic"]
