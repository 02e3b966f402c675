"""A third data source from outside rqrl's tree (tests/fixtures/fifo_algo: a consume-once FIFO and
a one-step V-trace actor-critic) runs on the full stack with no edit to the collector, the
learner, the config check or the coordinator: its spec says what they need to know."""

from __future__ import annotations

import os

import pytest

from common import keys, streams
from common.config import ConfigError, apply_overrides, load_config
from common.connection import connect
from tests.conftest import REPO, run_rqrl

CONFIG = str(REPO / "tests" / "fixtures" / "fifo_cartpole.py")


def test_the_config_check_reads_the_new_sources_spec():
    cfg = load_config(CONFIG)  # imports tests.fixtures.fifo_algo: registers the source and the algorithm
    with pytest.raises(ConfigError, match="'policy.learn.learner_num' = 2: 'fifo_ac' learns from fifo data"):
        apply_overrides(cfg, ["policy.learn.learner_num=2"])
    with pytest.raises(ConfigError, match="'policy.other.replay_buffer.priority' is True but 'fifo_ac'"):
        apply_overrides(cfg, ["policy.other.replay_buffer.priority=True"])


@pytest.mark.redis_server
@pytest.mark.slow
@pytest.mark.server_agnostic
@pytest.mark.timeout(300)
def test_a_fifo_source_trains_on_every_row_once_in_arrival_order(tmp_path, redis_server):
    exp = f"fifo_{os.getpid()}"
    res = run_rqrl("train", CONFIG, "--redis-url", redis_server.url, "--set", f"exp_name={exp}", "--name", "r",
                   cwd=tmp_path, timeout=280)
    assert res.returncode == 2 and "max_env_step 6000 reached" in res.stdout, res.stdout + res.stderr[-3000:]
    evs = [streams.decode_fields(raw) for _, raw in connect(redis_server.url).xrange(keys.events(keys.namespace(exp, "r")))]
    learner = next(e for e in evs if e["type"] == "finished" and e["task_type"] == "learner")
    chunks = [e for e in evs if e["type"] == "finished" and e["task_type"] == "collector" and not e["eval_flag"]]
    assert learner["train_iter"] > 0 and chunks
    # Every batch was the oldest 64 rows queued: taken once each, never more than arrived.
    assert learner["fifo_taken"] == 64 * learner["train_iter"] <= learner["pushed"]
    assert learner["pushed"] - learner["fifo_taken"] == learner["buffer_size"]
    # The learner published and reported every iteration (the spec's publish_every_iter): a
    # learner_info for each train_iter. (How old the collectors' weights were depends on how the
    # machine schedules them, so the policy lag itself is not bounded here.)
    reported = sorted({int(e["train_iter"]) for e in evs if e["type"] == "learner_info"})
    assert reported == list(range(1, learner["train_iter"] + 1)), (reported, learner)
