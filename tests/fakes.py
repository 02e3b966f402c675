"""In-memory stand-ins shared by unit tests."""

from __future__ import annotations


class FakeComm:
    """What workers/collector.py calls on RedisCommCollector, in memory: one published version, kept."""

    def __init__(self, weights) -> None:
        self.weights, self.sent, self.meta = weights, [], []
        self.episode_events = []  # the fields of each episodes event (workers/episode_shipper.py)
        self.policy_version, self.policy_published_at, self.stop_flag, self.limiter_wait_s = 0, 0.0, False, 0.0
        self.policy_envstep = 0  # env steps counted when the held version was published
        self.collect_setting_raw = None  # no coordinator writes a collect setting here

    def wait_for_policy(self, timeout):
        pass

    def get_policy_update_info(self):
        return self.weights

    def poll_stop(self):
        return False

    def send_stepdata(self, data_id, arrays, codec="none"):
        assert codec == "none"  # flat observations are not compressed by default
        self.sent.append(arrays)
        return 1

    def send_metadata(self, meta):
        self.meta.append(meta)

    def send_episodes(self, fields):
        self.episode_events.append(fields)

    def flush(self):
        return False

    def wait_for_policy_update(self, timeout):
        return False

    def store_evaluated(self, blob, version):
        self.evaluated = (version, blob)
