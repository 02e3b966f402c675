"""coordinator.stall.StallGuard: a late liveness read is distrusted, with a grace period after it."""

from __future__ import annotations

from coordinator.stall import StallGuard


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
