"""Step data on two data shards (``--data-redis-url``): a CartPole DQN run converges, both shards
carry chunks, nothing is counted twice; a shard that dies mid-run stops the run, named."""

from __future__ import annotations

import json
import os

import pytest

from common import keys
from common.connection import connect
from common.embedded_redis import EmbeddedRedis
from common.step_data import StepDataStore
from tests.conftest import REPO, run_rqrl, train_until_a_shard_dies, wait_gone

# The runs are bounded by env steps; the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


@pytest.fixture
def shards():
    """Two private redis-servers, the run's data shards."""
    servers = [EmbeddedRedis().start() for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


def test_cartpole_dqn_on_two_data_shards_converges_and_counts_each_chunk_once(tmp_path, redis_server, shards):
    exp = f"shards_{os.getpid()}"
    control = connect(redis_server.url)
    res = run_rqrl("train", CONFIG, "--redis-url", redis_server.url,
                   "--data-redis-url", ",".join(s.url for s in shards), "--set", f"exp_name={exp}",
                   "--set", "env.stop_value=150", "--seed", "1", "--set", "commander.max_wall_seconds=0",
                   "--set", "commander.max_env_step=60000", "--set", "policy.collect.collector.task_env_steps=200",
                   cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["last_eval_reward_mean"] >= 150
    per_shard = summary["data_shards"]
    assert [d["url"] for d in per_shard] == [s.url for s in shards]
    assert all(d["chunks"] > 0 and d["bytes"] > 0 and d["used_memory"] > 0 and "chunks_per_s" in d
               for d in per_shard), per_shard
    status = run_rqrl("status", "--redis-url", redis_server.url, "--exp", exp, cwd=tmp_path, timeout=120)
    shown = [ln for ln in status.stdout.splitlines() if ln.startswith("  data shard ")]
    assert [ln.split()[2] for ln in shown] == ["0", "1"] and all(" MB  chunks " in ln for ln in shown), status.stdout
    assert wait_gone(exp) == [], "child processes outlived rqrl train's teardown"
    ns = keys.namespace(exp, summary["run_name"])
    stores = [StepDataStore(connect(s.url), ns, summary["buffer_id"]) for s in shards]
    acc = [s.accounting() for s in stores]
    print(f"\naccounting per shard: {acc}")
    for a, d in zip(acc, per_shard):
        lost = a["consumed"] + a["expired"] + a["corrupt"] + a["malformed"] + a["trimmed"] + a["unconsumed"]
        # summary.json is written at the stop; a collector may flush one more chunk before it ends.
        assert a["produced"] == lost and d["chunks"] <= a["produced"] and a["duplicate"] == 0, (acc, per_shard)
    assert all(a["consumed"] > 0 for a in acc) and all(s.consumed_env_steps() > 0 for s in stores)
    # The control Redis holds the run's records and no step data.
    assert control.exists(keys.run(ns)) and not control.keys(keys.data_pattern(ns))
    assert not control.keys(keys.buffers_pattern(ns))
    print(f"\ntwo shards: envstep {summary['envstep']}, wall {summary['wall_seconds']} s, "
          f"chunks per shard {[d['chunks'] for d in per_shard]}")


def test_a_data_shard_that_dies_stops_the_run_naming_it(tmp_path, redis_server, shards):
    exp = f"shard_dies_{os.getpid()}"
    code, out, err, summary = train_until_a_shard_dies(tmp_path, redis_server.url, ",".join(s.url for s in shards),
                                                       exp, shards[1])
    assert code == 1, out + err[-3000:]
    assert summary["status"].startswith(f"data shard 1 ({shards[1].url}) unreachable"), summary["status"]
    assert "failed in a row" not in summary["status"]
    # The shard that lived still balances: every chunk written to it was consumed or is accounted
    # for, none twice (the dead one's count died with it).
    acc = StepDataStore(connect(shards[0].url), keys.namespace(exp, summary["run_name"]), summary["buffer_id"]).accounting()
    assert acc["produced"] > 0 and acc["duplicate"] == 0, acc
    assert acc["produced"] == (acc["consumed"] + acc["expired"] + acc["corrupt"] + acc["malformed"] + acc["trimmed"]
                               + acc["unconsumed"]), acc
