"""coordinator.stall.StallGuard: a late liveness read is distrusted, with a grace period after it;
coordinator.write_pause: neither is one made while Redis holds or refuses writes."""

from __future__ import annotations

import logging

from common import keys
from coordinator.liveness import Liveness
from coordinator.stall import StallGuard
from coordinator.write_pause import WriteProbe


def test_a_read_later_than_one_beat_period_starts_a_grace_period():
    now = [100.0]
    g = StallGuard(heartbeat_timeout_s=6.0, pass_every_s=1.0, clock=lambda: now[0])
    assert g.read_done() and g.stall_s == 0.0
    now[0] += 2.9  # 1 s pause + 1.9 s late: less than one refresh period (2 s)
    assert g.read_done() and g.stall_s == 0.0
    now[0] += 8.0  # a read that waited out an 8 s Redis stall
    assert not g.read_done() and g.stall_s == 7.0
    now[0] += 1.0  # workers have one heartbeat timeout (6 s) to beat again
    assert not g.read_done() and g.stall_s == 0.0
    for _ in range(4):
        now[0] += 1.0
        assert not g.read_done()
    now[0] += 1.0
    assert g.read_done() and g.stall_s == 0.0
    g.grace(3.0)  # e.g. after a Sentinel failover
    now[0] += 1.0
    assert not g.read_done()


def _liveness(fake_redis, tasks: list[str], probe, now: list[float]) -> Liveness:
    snapshot = [(t, {"started": True}) for t in tasks]
    return Liveness(fake_redis, "wp/r1", 3.0, lambda: snapshot, logging.getLogger("test_write_pause"),
                    probe=probe, clock=lambda: now[0])


def test_heartbeats_missed_while_writes_are_held_are_no_deaths(fake_redis, caplog):
    """A write pause (CLIENT PAUSE WRITE: reads on time, so no stall) of 8 s, heartbeat timeout 3 s:
    no task is declared dead while it lasts nor for 3 s after; the task that died in it is then."""
    now, held = [100.0], [None]
    live = _liveness(fake_redis, ["alive", "died"], lambda: held[0], now)
    beat = {t: keys.heartbeat("wp/r1", t) for t in ("alive", "died")}
    fake_redis.mset({k: "w" for k in beat.values()})
    caplog.set_level(logging.WARNING, logger="test_write_pause")
    assert live.find_dead() == []
    held[0] = "no reply within 0.5 s"
    fake_redis.delete(*beat.values())  # expired: nobody could write them
    for _ in range(8):
        now[0] += 1.0
        assert live.find_dead() == []
    assert caplog.text.count("Redis takes no writes (a write probe: no reply within 0.5 s)") == 1
    held[0] = None  # writes resume; the live task's held beat lands
    fake_redis.set(beat["alive"], "w")
    verdicts = []
    for _ in range(4):
        now[0] += 1.0
        verdicts.append(live.find_dead())
    assert verdicts[:3] == [[]] * 3, verdicts  # one heartbeat timeout (3 s) after the pause
    assert [t for t, _ in verdicts[3]] == ["died"] and "heartbeat lost" in verdicts[3][0][1]
    assert caplog.text.count("Redis paused writes (CLIENT PAUSE / failover) for 8.0 s: heartbeats missed during "
                             "it are not deaths") == 1


def test_refused_writes_are_named_and_a_stall_is_left_to_the_stall_guard(fake_redis, caplog):
    now, held = [100.0], ["ReadOnlyError: You can't write against a read only replica."]
    live = _liveness(fake_redis, ["t"], lambda: held[0], now)
    caplog.set_level(logging.WARNING, logger="test_write_pause")
    assert live.find_dead() == []  # no heartbeat, but writes are refused: a failover
    now[0] += 1.0
    held[0] = None
    assert live.find_dead() == []
    assert "Redis refused writes (ReadOnlyError: You can't write against a read only replica.) for 1.0 s" \
        in caplog.text
    for _ in range(2):  # one heartbeat timeout (3 s) to beat again
        now[0] += 1.0
        assert live.find_dead() == []
    now[0] += 1.0
    assert [t for t, _ in live.find_dead()] == ["t"]
    # Reads late as well: a stall of the whole server, which the stall guard names.
    held[0] = "no reply within 0.5 s"
    now[0] += 6.0
    assert live.find_dead() == []
    held[0] = None
    now[0] += 1.0
    assert live.find_dead() == []
    assert "heartbeat checks paused" in caplog.text and "reads waited too: a stall" in caplog.text
    assert "Redis paused writes" not in caplog.text


def test_the_write_probe_sets_its_key(fake_redis):
    probe = WriteProbe(fake_redis, keys.write_probe("wp/r1"), wait_s=0.5, ttl_s=3.0)
    assert probe() is None
    assert fake_redis.get(keys.write_probe("wp/r1")) == b"1" and 0 < fake_redis.pttl(keys.write_probe("wp/r1")) <= 3000
    probe.close()


def test_a_task_ended_by_a_full_redis_is_no_worker_death(fake_redis, caplog):
    """Redis at its maxmemory refuses writes on and off: the probe is refused for memory, then served
    while the full check reads memory just under the limit. A task whose own write was refused
    ended without a failure event; its missing heartbeat is not a death for two heartbeat
    timeouts (3 s here) after the last refusal, then it is."""
    now, held = [100.0], ["OutOfMemoryError: command not allowed when used memory > 'maxmemory'."]
    live = _liveness(fake_redis, ["t"], lambda: held[0], now)
    caplog.set_level(logging.WARNING, logger="test_write_pause")
    assert live.find_dead() == []
    held[0] = None  # served again; fakeredis has no maxmemory, so only the refusal says "full"
    verdicts = []
    for _ in range(7):
        now[0] += 1.0
        verdicts.append(live.find_dead())
    assert verdicts[:6] == [[]] * 6, verdicts
    assert "heartbeat(s) missing while Redis is full" in caplog.text
    assert [t for t, _ in verdicts[6]] == ["t"]


def test_an_oom_reply_to_any_worker_keeps_missing_heartbeats_from_being_deaths(fake_redis, caplog):
    """At its maxmemory Redis refuses writes on and off, and every probe may get through while a
    worker's writes are refused (a CI run: two tasks declared dead 12 s after the last refused
    probe, their workers alive). Redis counts each OOM reply to any client (INFO errorstats); a rise
    in that count marks Redis full for two heartbeat timeouts (3 s here), as a refused probe does."""
    import redis

    oom = [4]

    def info(section=None):
        if section != "errorstats":
            raise redis.ResponseError("unknown command 'info'")  # as fakeredis: no memory figures
        return {"errorstat_OOM": {"count": oom[0]}}

    fake_redis.info = info
    now = [100.0]
    live = _liveness(fake_redis, ["t"], lambda: None, now)  # every probe served
    caplog.set_level(logging.WARNING, logger="test_write_pause")
    assert [t for t, _ in live.find_dead()] == ["t"]  # OOM replies of long ago (the first count) are no excuse
    verdicts = []
    for step in range(9):
        now[0] += 1.0
        oom[0] += 1 if step == 0 else 0  # a worker's write refused for memory, once
        verdicts.append([t for t, _ in live.find_dead()])
    assert verdicts[:7] == [[]] * 7, verdicts  # up to 6 s after the pass that saw the rise: full
    assert verdicts[7:] == [["t"], ["t"]], verdicts
    assert "heartbeat(s) missing while Redis is full" in caplog.text


def test_oom_counts_read_as_redis_py_leaves_them_and_a_failover_starts_a_new_baseline(fake_redis, monkeypatch):
    """redis-py 5.0 (the floors' pin) leaves ``errorstat_OOM`` as the string ``"count=3"``;
    after a Sentinel failover the count is another server's, so a higher one is no refusal."""
    from coordinator import liveness
    from coordinator.liveness import _count_of

    assert (_count_of({"count": 3}), _count_of("count=3"), _count_of(None)) == (3, 3, 0)
    stats, changes = [{"errorstat_OOM": "count=2"}], [[]]
    fake_redis.info = lambda section=None: stats[0]
    monkeypatch.setattr(liveness, "primary_changes", lambda conn: changes[0])
    now = [100.0]
    live = _liveness(fake_redis, [], lambda: None, now)
    live.find_dead()
    stats[0] = {"errorstat_OOM": "count=3"}
    live.find_dead()
    assert live.writes.full_within(6.0)  # a rise, in the string form
    now[0] += 10.0
    changes[0] = [{"time": 0, "from": "a:1", "to": "b:2"}]
    stats[0] = {"errorstat_OOM": "count=40"}  # the new primary's own count
    live.find_dead()
    assert not live.writes.full_within(6.0)
