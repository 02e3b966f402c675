"""rqrl train's terminal output when the coordinator ends without its closing summary."""

from __future__ import annotations

from coordinator.launcher import Launcher


def test_a_coordinator_that_ended_without_a_summary_has_its_last_words_shown(tmp_path, capsys):
    url = "redis://:s3cret@127.0.0.1:1/0"
    launcher = object.__new__(Launcher)  # only what the closing block reads
    launcher.log_dir, launcher.ns, launcher.url = tmp_path, "exp/r1", url
    launcher.run_dir = tmp_path / "exp" / "r1"  # no summary.json there
    (tmp_path / "coordinator.log").write_text(
        "[12:00:00] INFO rqrl.coordinator: started\n\n"
        f"coordinator: run 'exp/r1' is owned by coordinator-h-1 (key rqrl:exp/r1:coordinator); {url}\n")
    launcher._print_closing_block()
    err = capsys.readouterr().err
    assert "ended without a summary" in err and "is owned by coordinator-h-1" in err
    assert "s3cret" not in err


def test_a_launch_refused_before_any_process_leaves_no_run_folder(tmp_path, monkeypatch, small_cfg):
    import pytest

    from common import connection
    from common.connection import RedisUnavailable
    from common.embedded_redis import free_port
    from coordinator import runs

    monkeypatch.setattr(connection, "PATIENCE_S", 0.0)  # one try: nothing listens there
    monkeypatch.chdir(tmp_path)
    run_dir = runs.reserve_run_dir(tmp_path, small_cfg.exp_name, 0, "r")
    launcher = Launcher(small_cfg, "config.py", f"redis://127.0.0.1:{free_port()}/0", 1, [], "r", out_dir=str(tmp_path))
    with pytest.raises(RedisUnavailable):
        launcher.run()
    assert not run_dir.exists() and not (tmp_path / small_cfg.exp_name).exists()
