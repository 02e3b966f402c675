"""The collect setting (``rqrl:{exp}:collect_setting``): the commander's, written when it changes.

Collectors read it with every chunk, so a task lasting minutes acts on the current setting
(DQN's epsilon, PPO's rollout share); the value is JSON ``{"setting": {...}, "ts": unix s}``.
"""

from __future__ import annotations

import json
import time

import redis

from common import keys
from coordinator.commander import BaseCommander


class SettingPublisher:
    """Writes ``commander.collect_setting()`` of run ``exp`` when it differs from the last one written."""

    def __init__(self, conn: redis.Redis, exp: str, commander: BaseCommander) -> None:
        self.conn, self.exp, self.commander = conn, exp, commander
        self._sent = ""  # the setting last written (JSON)

    def publish(self) -> None:
        setting = json.dumps(self.commander.collect_setting(), sort_keys=True)
        if setting != self._sent:
            self.conn.set(keys.collect_setting(self.exp), json.dumps({"setting": json.loads(setting), "ts": time.time()}))
            self._sent = setting
