"""Data shards (common/data_shards.py): the URL list, the shard choice, the task fields, and the
step-data store split over a control server and two data shards (fakeredis servers).

* a chunk sent to a shard lands there (blob, stream entry, stats) while the env-step counter and
  the policy read-back stay on the control server; nothing of the step data reaches the control one;
* a resent chunk is counted once (``resent``), a revoked lease writes and acks nothing;
* the per-shard accounting balances and sums; the run-wide drop covers every shard;
* a dead shard's failure names the shard, its URL redacted.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import fakeredis
import pytest
import redis

from common import blobstore, keys, streams
from common.data_shards import (DataShardConfigError, DataShards, StoreGroup, parse_urls, pick_shard,
                                resolve_urls, shard_count, shard_label, worker_shards)
from common.messages import CollectorTask, LearnerTask, MessageError
from common.scripts import LeaseRevoked
from common.step_data import AckEntry, Chunk, DataShardError, StepDataStore
from tests.conftest import REPO

NS, BUF, POL, TASK, LEARNER = "shard_exp/r1", "buffer_s", "policy_s", "collector_task_s", "learner_task_s"


def chunk(data_id: str, env_steps: int = 8) -> Chunk:
    fields = streams.encode_fields({"data_id": data_id, "n_samples": env_steps, "env_steps": env_steps,
                                    "policy_version": 0})
    return Chunk(data_id, b"blob-" + data_id.encode(), env_steps, fields)


@pytest.fixture
def servers():
    """A control server (leases granted, a policy published) and two data shards: three fakeredis servers."""
    control, a, b = (fakeredis.FakeRedis(server=fakeredis.FakeServer()) for _ in range(3))
    for tid in (TASK, LEARNER):
        control.set(keys.lease(NS, tid), "1")
    blobstore.put_versioned(control, keys.policy(NS, POL), b"w", 3, meta={"envstep_limit": 1000})
    return control, [a, b]


def shard_store(control, conn, i: int) -> StepDataStore:
    return StepDataStore(conn, NS, BUF, control=control, label=shard_label(i, f"redis://u:pw@h{i}:6379/0"))


def send(store: StepDataStore, *chunks: Chunk):
    return store.put(list(chunks), keys.lease(NS, TASK), keys.policy(NS, POL), ttl_s=600, maxlen=1000)


def consume(store: StepDataStore) -> list[int]:
    store.ensure_group()
    entries = store.read("c1", 100, 1)
    plan = [AckEntry(eid, store.data_key(streams.decode_fields(raw)["data_id"]),
                     int(streams.decode_fields(raw)["env_steps"]), "consumed") for eid, raw in entries]
    return store.ack(keys.lease(NS, LEARNER), plan)


def test_a_chunk_goes_to_its_shard_and_the_counter_to_the_control_server(servers):
    control, (a, b) = servers
    reply = send(shard_store(control, a, 0), chunk("d1"), chunk("d2", 4))
    assert reply.counter == 12 and int(reply.policy_version) == 3 and int(reply.envstep_limit) == 1000
    assert not reply.stop and reply.policy_error == ""
    assert a.get(keys.data(NS, "d1")) == b"blob-d1" and a.xlen(keys.buffer_meta(NS, BUF)) == 2
    assert int(control.get(keys.envstep(NS))) == 12
    assert not control.keys(keys.data_pattern(NS)) and not control.keys(keys.buffers_pattern(NS))
    assert not b.keys("*")
    stats = shard_store(control, a, 0).stats()
    assert (stats["produced"], stats["produced_env_steps"], stats["produced_bytes"]) == (2, 12, 14)


def test_a_resent_chunk_counts_once_and_adds_no_env_steps(servers):
    control, (a, _) = servers
    store = shard_store(control, a, 0)
    send(store, chunk("d1"))
    assert send(store, chunk("d1")).counter == 8
    assert store.stats()["resent"] == 1 and a.xlen(store.meta_key) == 1
    assert not a.exists(keys.data_staged(NS, "d1"))


def test_a_revoked_lease_writes_and_acks_nothing_on_the_shard(servers):
    control, (a, _) = servers
    store = shard_store(control, a, 0)
    send(store, chunk("d1"))
    control.delete(keys.lease(NS, TASK), keys.lease(NS, LEARNER))
    before = sorted(a.keys("*"))
    with pytest.raises(LeaseRevoked, match=TASK):
        send(store, chunk("d2"))
    with pytest.raises(LeaseRevoked, match=LEARNER):
        consume(store)
    assert sorted(a.keys("*")) == before and "consumed" not in store.stats()


def test_each_shard_balances_and_the_sums_add_up(servers):
    control, shards = servers
    stores = [shard_store(control, conn, i) for i, conn in enumerate(shards)]
    send(stores[0], chunk("a1"), chunk("a2"))
    send(stores[1], chunk("b1"))
    assert consume(stores[0]) == [1, 1]
    send(stores[1], chunk("b2"))
    acc = [s.accounting() for s in stores]
    assert [(x["produced"], x["consumed"], x["unconsumed"]) for x in acc] == [(2, 2, 0), (2, 0, 2)]
    assert consume(stores[1]) == [1, 1] and consume(stores[1]) == []
    total = {k: sum(x[k] for x in (s.accounting() for s in stores)) for k in acc[0]}
    assert total["produced"] == total["consumed"] == 4 and total["duplicate"] == total["unconsumed"] == 0
    assert sum(s.consumed_env_steps() for s in stores) == 32
    assert StoreGroup(stores).drop_run() > 0
    assert not any(conn.keys("*") for conn in shards)


def test_a_dead_shard_is_named_with_its_url_redacted(servers):
    control, _ = servers
    dead = fakeredis.FakeServer()
    store = shard_store(control, fakeredis.FakeRedis(server=dead), 1)
    dead.connected = False  # fakeredis: every command now fails to connect
    with pytest.raises(DataShardError) as e:
        send(store, chunk("d1"))
    assert "data shard 1 (redis://u:***@h1:6379/0)" in str(e.value) and "pw" not in str(e.value)


def test_the_shard_with_fewest_tasks_is_chosen_in_turn():
    assert pick_shard([0, 0]) == 0 and pick_shard([1, 0]) == 1 and pick_shard([2, 1, 1]) == 1
    assert pick_shard([0, 0], turn=1) == 1 and pick_shard([2, 1, 1], turn=3) == 1 and pick_shard([1, 1, 0], 4) == 2
    loads = [0, 0, 0]
    for turn in range(9):
        loads[pick_shard(loads, turn)] += 1
    assert loads == [3, 3, 3]
    # One task at a time (a single collector): each shard in turn.
    assert [pick_shard([0, 0, 0], turn) for turn in range(4)] == [0, 1, 2, 0]


def test_urls_are_split_checked_and_resolved_flag_env_config(monkeypatch):
    assert parse_urls("redis://a:1/0, rediss://u:p@b:2/0,unix:///tmp/r.sock") == [
        "redis://a:1/0", "rediss://u:p@b:2/0", "unix:///tmp/r.sock"]
    assert parse_urls("") == [] and parse_urls(None) == []
    with pytest.raises(DataShardConfigError, match=r"redis\+sentinel://u:\*\*\*@") as e:
        parse_urls("redis+sentinel://u:secret@h:26379,h2:26379/mymaster")
    assert "secret" not in str(e.value)
    with pytest.raises(DataShardConfigError, match="twice"):
        parse_urls("redis://a:1/0,redis://a:1/0")
    cfg = {"system": {"data_redis_url": "redis://cfg:1/0"}}
    monkeypatch.delenv("RQRL_DATA_REDIS_URL", raising=False)
    assert resolve_urls(None, cfg) == ["redis://cfg:1/0"] and resolve_urls(None) == []
    monkeypatch.setenv("RQRL_DATA_REDIS_URL", "redis://env:1/0")
    assert resolve_urls(None, cfg) == ["redis://env:1/0"]
    assert resolve_urls("redis://flag:1/0", cfg) == ["redis://flag:1/0"]


def test_a_cluster_url_counts_as_its_shards_and_a_bad_one_is_named_redacted():
    urls = parse_urls("redis://a:1/0,redis+cluster://u:pw@c:7000/0?shards=3,rediss+cluster://d:7001")
    assert shard_count(urls) == 1 + 3 + 4  # ?shards=3, and the default 4
    assert shard_label(2, urls[1], keys.slot_tag(1, 3)) == "data shard 2 (redis+cluster://u:***@c:7000/0?shards=3 {shard1.0})"
    for bad, why in (("redis+cluster://u:pw@c:7000/0?shards=0", "shards='0' must be a positive integer"),
                     ("redis+cluster://u:pw@c:7000/0?shards=x", "shards='x' must be a positive integer"),
                     ("redis+cluster://u:pw@c:7000/2", "database 0 only")):
        with pytest.raises(DataShardConfigError, match=re.escape(why)) as e:
            parse_urls(bad)
        assert "pw" not in str(e.value) and "u:***@c:7000" in str(e.value)


def test_a_worker_with_another_number_of_shards_refuses_the_task(monkeypatch):
    monkeypatch.setenv("RQRL_DATA_REDIS_URL", "redis://u:pw@h:1/0")
    with pytest.raises(DataShardConfigError, match=r"2 data shard\(s\) but this worker has 1 \(redis://u:\*\*\*@h"):
        worker_shards({}, 2, "collector_t1")
    assert len(worker_shards({}, 1, "collector_t1")) == 1


def _collector(**extra):
    return {"task_type": "collector", "task_id": "collector_t1", "exp_name": "e", "run_id": "r", "buffer_id": "b",
            "policy_id": "p", "eval_flag": False, "collect_setting": {}, "config": {}, **extra}


def test_task_messages_carry_the_shard_and_old_ones_mean_the_control_redis():
    old = CollectorTask.from_dict(_collector())
    assert (old.data_shards, old.data_shard) == (None, None) and "data_shard" not in old.to_dict()
    new = CollectorTask.from_dict(_collector(data_shards=2, data_shard=1))
    assert (new.data_shards, new.data_shard) == (2, 1) and CollectorTask.from_dict(new.to_dict()) == new
    for bad, field in (({"data_shards": 2, "data_shard": 2}, "data_shard"), ({"data_shard": 0}, "data_shard"),
                       ({"data_shards": 2}, "data_shard"), ({"data_shards": 0, "data_shard": 0}, "data_shards"),
                       ({"data_shards": 2, "data_shard": True}, "data_shard")):
        with pytest.raises(MessageError) as e:
            CollectorTask.from_dict(_collector(**bad))
        assert e.value.field == field, bad
    learner = {k: v for k, v in _collector().items() if k not in ("eval_flag", "collect_setting")}
    learner.update(task_type="learner", task_id="learner_t1")
    assert LearnerTask.from_dict(learner).data_shards is None
    assert LearnerTask.from_dict({**learner, "data_shards": 3}).data_shards == 3


def test_the_task_table_spreads_collector_tasks_over_the_shards(fake_redis, small_cfg):
    import logging

    from coordinator.commander import create_commander
    from coordinator.task_table import TaskTable

    table = TaskTable(fake_redis, "e", small_cfg, create_commander(small_cfg), logging.getLogger("t"), data_shards=2)
    shards = []
    for i in range(4):
        task = table.with_shard("collector", {"task_id": f"c{i}", "eval_flag": False})
        table.running[task["task_id"]] = {"task": task, "kind": "collector"}
        shards.append(task["data_shard"])
    assert shards == [0, 1, 0, 1]
    del table.running["c1"], table.running["c3"]
    assert table.with_shard("collector", {"task_id": "c4"})["data_shard"] == 1
    del table.running["c0"], table.running["c2"]
    assert [table.with_shard("collector", {"task_id": "c5"})["data_shard"] for _ in range(3)] == [1, 0, 1]
    assert "data_shard" not in table.with_shard("collector", {"task_id": "e1", "eval_flag": True})
    assert table.with_shard("learner", {"task_id": "l1"}) == {"task_id": "l1", "data_shards": 2}
    plain = TaskTable(fake_redis, "e", small_cfg, create_commander(small_cfg), logging.getLogger("t"))
    assert plain.with_shard("collector", {"task_id": "c9"}) == {"task_id": "c9"}


def test_data_shards_connect_with_credentials_and_name_a_bad_url():
    shards = DataShards(["redis://user:pw@127.0.0.1:1/0", "rediss://127.0.0.1:2/1"])
    kwargs = shards.conns[0].connection_pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"]) == ("user", "pw")
    assert shards.conns[1].connection_pool.connection_class is redis.SSLConnection
    assert shards.label(0) == "data shard 0 (redis://user:***@127.0.0.1:1/0)"
    assert "unreachable" in shards.unreachable()[0] and "pw" not in " ".join(shards.unreachable())
    with pytest.raises(DataShardConfigError, match=r"\*\*\*") as e:
        DataShards(["redis://u:pw@host:notaport/0"])
    assert "pw" not in str(e.value)


class _Probe:
    """A shard's probe client: INFO memory as set, and the stats hash of fakeredis."""

    def __init__(self, fake, used: int, maxmemory: int) -> None:
        self.fake, self.used, self.maxmemory = fake, used, maxmemory

    def info(self, section: str) -> dict:
        return {"used_memory": self.used, "maxmemory": self.maxmemory, "maxmemory_policy": "noeviction"}

    def __getattr__(self, name):
        return getattr(self.fake, name)


def test_shard_totals_give_memory_and_a_chunk_rate_and_a_full_shard_is_named_once(fake_redis, monkeypatch, caplog):
    import logging

    from common.data_shards import ShardWatch
    from coordinator.status import shard_lines

    shards = DataShards(["redis://u:pw@127.0.0.1:1/0", "redis://127.0.0.1:2/0"])
    probes = [_Probe(fake_redis, 5 * 2**20, 0), _Probe(fake_redis, 64 * 2**20, 64 * 2**20)]
    monkeypatch.setattr(shards, "_probe", lambda i, timeout_s=2.0: probes[i])
    clock = iter([100.0, 104.0, 112.0])
    shards.clock = lambda: next(clock)
    produced = lambda n: fake_redis.hset(keys.buffer_stats("ns", "b1"), "produced", n)  # noqa: E731
    produced(10)
    first = shards.totals("ns", ["b1"])
    assert first[0]["chunks"] == 10 and first[0]["chunks_per_s"] == 0.0 and first[0]["used_memory"] == 5 * 2**20
    produced(50)
    assert shards.totals("ns", ["b1"])[0]["chunks_per_s"] == 10.0  # 40 chunks in 4 s
    produced(130)
    # 12 s after the first count: the window (10 s) starts at the second one, 80 chunks in 8 s.
    rows = shards.totals("ns", ["b1"])
    assert rows[0]["chunks_per_s"] == 10.0 and rows[1]["maxmemory"] == 64 * 2**20
    lines = shard_lines(rows)
    assert lines[0] == "  data shard 0  5.0 MB  chunks 130 (10/s)  redis://u:***@127.0.0.1:1/0"
    assert lines[1].startswith("  data shard 1  64.0 MB / 64 MB  chunks 130") and "pw" not in "".join(lines)
    watch = ShardWatch(shards, logging.getLogger("shard_watch_test"))
    monkeypatch.setattr(shards, "unreachable", lambda: [])
    with caplog.at_level(logging.WARNING, logger="shard_watch_test"):
        assert watch.poll() == [] and watch.poll() == []  # full is a wait, not a stop
    named = [r.getMessage() for r in caplog.records]
    assert named == ["data shard 1 (redis://127.0.0.1:2/0) is full (67,108,864 of maxmemory 67,108,864 bytes): "
                     "collectors writing to it wait for room"]



def test_a_cluster_that_does_not_answer_is_one_line_naming_it_redacted(tmp_path):
    from common.connection import RedisUnavailable, connect_cluster

    url = "redis+cluster://u:secret@127.0.0.1:1/0?shards=3"  # nothing listens on port 1
    with pytest.raises(RedisUnavailable, match=r"Redis Cluster at redis\+cluster://u:\*\*\*@127\.0\.0\.1:1/0") as e:
        connect_cluster(url, socket_timeout=2, retries=False)
    assert "secret" not in str(e.value)
    with pytest.raises(RedisUnavailable):
        DataShards([url])
    res = subprocess.run([sys.executable, "-m", "coordinator.cli", "train", str(REPO / "deploy" / "configs" / "cartpole_dqn.py"),
                          "--dry-run", "--data-redis-url", url], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 1 and "Traceback" not in res.stderr and "secret" not in res.stderr + res.stdout, res.stderr
    assert "Redis Cluster at redis+cluster://u:***@127.0.0.1:1/0" in res.stderr, res.stderr
