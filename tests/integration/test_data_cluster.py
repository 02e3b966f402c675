"""Step data on a Redis Cluster (``--data-redis-url redis+cluster://...?shards=3``): a CartPole DQN
run converges with its three shards on three primaries, each chunk counted once per shard, no step
data on the control Redis; a primary that dies mid-run stops the run naming the shard it held."""

from __future__ import annotations

import json
import os

import pytest
from redis.cluster import RedisCluster

from common import keys
from common.connection import connect, connect_cluster
from common.embedded_redis import EmbeddedCluster
from common.step_data import StepDataStore
from tests.conftest import REPO, run_rqrl, train_until_a_shard_dies, wait_gone

# The runs are bounded by env steps; the timeout is a hang guard only.
pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.timeout(900)]

CONFIG = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")


@pytest.fixture
def cluster(redis_exe):
    """A private 3-primary Redis Cluster of the suite's redis-server."""
    with EmbeddedCluster(3, exe=redis_exe) as c:
        yield c


def _stores(cluster: EmbeddedCluster, ns: str, buffer_id: str) -> list[StepDataStore]:
    client = connect_cluster(cluster.url)
    return [StepDataStore(client, ns, buffer_id, tag=keys.slot_tag(i, 3)) for i in range(3)]


def test_cartpole_dqn_on_a_three_primary_cluster_converges_and_counts_each_chunk_once(tmp_path, redis_server,
                                                                                       cluster):
    exp = f"cluster_{os.getpid()}"
    res = run_rqrl("train", CONFIG, "--redis-url", redis_server.url, "--data-redis-url", f"{cluster.url}?shards=3",
                   "--set", f"exp_name={exp}", "--set", "env.stop_value=150", "--seed", "1",
                   "--set", "commander.max_wall_seconds=0", "--set", "commander.max_env_step=60000",
                   "--set", "policy.collect.collector.task_env_steps=200", cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    summary = json.loads((tmp_path / exp / "latest" / "summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["last_eval_reward_mean"] >= 150
    per_shard = summary["data_shards"]
    assert [d["tag"] for d in per_shard] == [keys.slot_tag(i, 3) for i in range(3)], per_shard
    assert all(d["chunks"] > 0 and d["bytes"] > 0 and d["used_memory"] > 0 for d in per_shard), per_shard
    assert wait_gone(exp) == [], "child processes outlived rqrl train's teardown"
    ns = keys.namespace(exp, summary["run_name"])
    stores = _stores(cluster, ns, summary["buffer_id"])
    # One shard per primary: the tags' slots fall in the three primaries' equal slot ranges.
    client: RedisCluster = stores[0].conn
    assert len({client.get_node_from_key(s.meta_key).port for s in stores}) == 3
    for store, d in zip(stores, per_shard):
        a = store.accounting()
        held = a["consumed"] + a["expired"] + a["corrupt"] + a["malformed"] + a["trimmed"] + a["unconsumed"]
        # summary.json is written at the stop; a collector may flush one more chunk before it ends.
        assert a["produced"] == held and d["chunks"] <= a["produced"] and a["duplicate"] == 0, (a, d)
        assert a["consumed"] > 0
    control = connect(redis_server.url)
    assert control.exists(keys.run(ns)) and not control.keys(keys.data_pattern(ns) + "*")
    assert not control.keys(f"rqrl:{ns}:*data:*") and not control.keys(f"rqrl:{ns}:*buffer:*")
    status = run_rqrl("status", "--redis-url", redis_server.url, "--exp", exp, cwd=tmp_path, timeout=120)
    shown = [ln for ln in status.stdout.splitlines() if ln.startswith("  data shard ")]
    assert [ln.split()[2] for ln in shown] == ["0", "1", "2"], status.stdout
    print(f"\ncluster: envstep {summary['envstep']}, wall {summary['wall_seconds']} s, "
          f"chunks per shard {[d['chunks'] for d in per_shard]}")


def test_a_cluster_primary_that_dies_stops_the_run_naming_its_shard(tmp_path, redis_server, cluster):
    exp = f"cluster_dies_{os.getpid()}"
    tag = keys.slot_tag(1, 3)
    primary = connect_cluster(cluster.url).get_node_from_key(tag)
    server = next(s for s in cluster.servers if s.port == primary.port)  # it holds shard 1's slot
    code, out, err, summary = train_until_a_shard_dies(tmp_path, redis_server.url, f"{cluster.url}?shards=3", exp,
                                                       server)
    assert code == 1, out + err[-3000:]
    assert summary["status"].startswith(f"data shard 1 ({cluster.url}?shards=3 {tag}) unreachable"), summary["status"]
    assert "the worker process died" not in summary["status"]
