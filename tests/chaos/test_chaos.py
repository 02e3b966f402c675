"""The chaos run as a test: kills of collectors, the learner and the coordinator; training must converge."""

from __future__ import annotations

import pytest

from tests.chaos.chaos import main

pytestmark = [pytest.mark.redis_server, pytest.mark.slow]


def test_chaos_run_converges_detects_every_kill_and_loses_nothing(tmp_path, redis_server):
    # A high stop value keeps the run going long enough for every kill in the schedule.
    r = main(["--seed", "3", "--collector-kills", "2", "--stop-value", "400", "--duration", "240",
              "--workdir", str(tmp_path)])
    assert r["converged"], r
    whats = [k["what"] for k in r["kills"]]
    assert any(w.startswith("learner") for w in whats) and any(w.startswith("coordinator") for w in whats), whats
    assert sum(w.startswith("collector") for w in whats) >= 1, whats
    detected = [k for k in r["kills"] if not k.get("run_ended_first")]
    assert any(k["what"].startswith("collector") for k in detected), r["kills"]
    for k in detected:
        assert k["detect_s"] is not None and k["detect_s"] <= 10.0, k
        if "resumed_from_iter" in k:
            assert k["resumed_from_iter"] and k["resumed_from_iter"] > 0, "the replacement learner did not resume"
        if "same_run" in k:
            assert k["same_run"], "the restarted coordinator started a new run instead of resuming"
    c = r["chunks"]
    assert c["duplicate"] == 0
    assert c["produced"] == c["consumed"] + c["expired"] + c["corrupt"] + c["malformed"] + c["unconsumed"]
    assert c["corrupt"] == c["malformed"] == 0
