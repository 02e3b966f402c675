"""The coordinator's work beside its event loop: counting workers, the liveness pass, logs and scalars."""

from __future__ import annotations

import copy
import logging
import time

from easydict import EasyDict
from rq import Queue, Worker
from rq.job import Job

from common import keys
from coordinator.daemon import Coordinator, live_workers
from coordinator.offload import DeferredScalars, offload_logging


def test_live_workers_counts_registered_workers_whose_key_lives(real_redis):
    q = Queue(keys.COLLECTOR_QUEUE, connection=real_redis)
    assert live_workers(real_redis, q) == 0
    workers = [Worker([keys.COLLECTOR_QUEUE], name=f"w{i}", connection=real_redis) for i in range(4)]
    for w in workers:
        w.register_birth()
    Worker([keys.LEARNER_QUEUE], name="learner", connection=real_redis).register_birth()  # another queue
    assert live_workers(real_redis, q) == 4
    workers[0].register_death()  # a warm or cold shutdown leaves the registry
    real_redis.delete(workers[1].key)  # a worker killed outright, once RQ's key for it expired
    assert live_workers(real_redis, q) == 2


def _coordinator(tmp_path, fake_redis, small_cfg) -> Coordinator:
    cfg = EasyDict(copy.deepcopy(small_cfg))
    cfg.commander.update(collector_task_space=4, eval_every_train_iter=0, eval_interval=0.0)
    return Coordinator(cfg, fake_redis, tmp_path)


def test_liveness_pass_finds_dead_tasks_and_the_loop_fails_them(tmp_path, fake_redis, small_cfg):
    c = _coordinator(tmp_path, fake_redis, small_cfg)
    cm = c.commander
    cm.get_learner_task()
    alive, silent, queued, gone = (cm.get_collector_task() for _ in range(4))
    for t, started in ((alive, True), (silent, True), (queued, False), (gone, False)):
        c.tasks.running[t["task_id"]] = {"task": t, "kind": "collector", "started": started}
    fake_redis.set(keys.heartbeat(c.exp, alive["task_id"]), "w:1")
    fake_redis.hset(Job.key_for(queued["task_id"]), "status", "queued")
    dead = dict(c.liveness.find_dead())
    assert set(dead) == {silent["task_id"], gone["task_id"]}
    assert "heartbeat lost" in dead[silent["task_id"]] and "RQ job is gone" in dead[gone["task_id"]]
    # A task that finished between the pass and the loop applying it is left alone.
    del c.tasks.running[gone["task_id"]]
    cm.notify_fail_collector_task(gone)
    c.liveness.dead.put(list(dead.items()))
    c._apply_dead()
    assert set(c.tasks.running) == {alive["task_id"], queued["task_id"]}
    assert cm.summary()["collector_tasks_running"] == 2
    assert not fake_redis.hexists(keys.tasks(c.exp), silent["task_id"])
    c.tb.close()


def test_task_records_are_persisted_without_the_config(tmp_path, fake_redis, small_cfg):
    import json

    c = _coordinator(tmp_path, fake_redis, small_cfg)
    c.commander.follow_collector_workers(3)
    c._dispatch()
    records = {k.decode(): json.loads(v) for k, v in fake_redis.hgetall(keys.tasks(c.exp)).items()}
    assert len(records) == 3  # the learner and two collectors (three workers, one kept for evals)
    assert all("config" not in r["task"] and r["task"]["task_id"] == t for t, r in records.items())
    assert all("config" in e["task"] for e in c.tasks.running.values())  # the jobs still carry it
    c.tb.close()


class _Writer:
    def __init__(self) -> None:
        self.scalars: list[tuple] = []
        self.closed = False

    def add_scalar(self, tag, value, step, walltime=None):
        self.scalars.append((tag, value, step, walltime))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_deferred_scalars_reach_the_writer_with_their_wall_time():
    w = _Writer()
    d = DeferredScalars(w, interval_s=60.0)  # no timed drain during the test
    t0 = time.time()
    d.add_scalar("collector_iter/reward_mean", 1.5, 10)
    d.add_scalar("collector_step/reward_mean", 2.5, 20)
    assert w.scalars == []  # queued only
    d.close()
    assert [s[:3] for s in w.scalars] == [("collector_iter/reward_mean", 1.5, 10), ("collector_step/reward_mean", 2.5, 20)]
    assert all(t0 <= s[3] <= time.time() for s in w.scalars) and w.closed


def test_offloaded_log_lines_are_all_written_and_handlers_come_back():
    logger = logging.getLogger("rqrl.test_offload")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(self.format(record))

    h = Keep()
    logger.addHandler(h)
    try:
        restore = offload_logging(logger)
        assert logger.handlers != [h]
        for i in range(100):
            logger.info("line %d of %s", i, "many")
        logger.debug("not at INFO")
        restore()
        assert seen == [f"line {i} of many" for i in range(100)]
        assert logger.handlers == [h]
        restore()  # a second call changes nothing
        assert logger.handlers == [h]
    finally:
        logger.removeHandler(h)
