"""The closing block is rendered from summary.json by one function (coordinator/closing.py): the
coordinator prints it, and ``rqrl train`` prints the same block from the same file."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

from easydict import EasyDict

from common import blobstore, keys
from coordinator import closing
from coordinator.daemon import Coordinator
from coordinator.launcher import Launcher


def test_the_coordinator_and_the_launcher_print_the_block_of_summary_json(tmp_path, fake_redis, small_cfg, capsys):
    cfg = EasyDict(copy.deepcopy(small_cfg))
    c = Coordinator(cfg, fake_redis, tmp_path, run_name="r1")
    blobstore.put_versioned(fake_redis, keys.ckpt(c.exp, "final_model"), b"trained bundle", 4)
    c._finish(2, "max_train_iter 4 reached")
    c.tb.close()
    printed = capsys.readouterr().out
    summary = json.loads((c.out / "summary.json").read_text())
    block = closing.render(summary)
    assert block in printed
    assert block.splitlines()[0] == f"rqrl {c.exp}: max_train_iter 4 reached"
    assert f"  final policy   {c.out / 'final.pt'} (policy version 4)" in block
    assert f"(stop_value {cfg.env.stop_value})" in block and "  curve          no evaluations" in block
    Launcher._print_closing_block(SimpleNamespace(run_dir=c.out, log_dir=c.out / "log"))
    assert capsys.readouterr().out.strip() == block


def test_a_run_without_summary_json_prints_no_block(tmp_path, capsys):
    Launcher._print_closing_block(SimpleNamespace(run_dir=tmp_path, log_dir=tmp_path / "log"))
    assert capsys.readouterr().out == ""  # and without a coordinator log, no last words either


def test_missing_figures_read_as_none():
    block = closing.render({"exp_name": "e", "run_name": "r", "status": "interrupted by SIGINT", "wall_seconds": 1.25,
                            "envstep": 0, "train_iter": 0, "last_eval_reward_mean": None, "stop_value": 195,
                            "final_pt": "", "phases": {}})
    assert block.splitlines() == [
        "rqrl e/r: interrupted by SIGINT", "  wall time      1.2 s", "  env steps      0", "  train iters    0",
        "  last eval      - (stop_value 195)", "  final policy   not saved", "  curve          no evaluations",
        "  phases         none"]


def test_a_closing_eval_is_named_on_the_last_eval_line():
    summary = {"exp_name": "e", "run_name": "r", "status": "max_env_step 5000 reached without convergence",
               "wall_seconds": 9.0, "envstep": 5100, "train_iter": 900, "last_eval_reward_mean": 120.5,
               "stop_value": 100000, "final_pt": "", "phases": {},
               "final_eval": {"task_id": "t", "policy_version": 880, "envstep": 5064, "reward_mean": 120.5,
                              "closing": True}}
    assert "  last eval      120.50 (stop_value 100000, the closing eval at 5064 env steps)" in closing.render(summary)
    summary["final_eval"]["closing"] = False
    assert "  last eval      120.50 (stop_value 100000)\n" in closing.render(summary)


def test_final_pt_is_copied_from_the_main_players_own_final_checkpoint(tmp_path, fake_redis, small_cfg):
    """A player whose checkpoint is not "latest" has final checkpoints of its own name
    (common.keys.final_ckpt_name): final.pt comes from the main player's, never another's."""
    from coordinator.commander_view import AtStop

    c = Coordinator(EasyDict(copy.deepcopy(small_cfg)), fake_redis, tmp_path, run_name="r1")
    blobstore.put_versioned(fake_redis, keys.ckpt(c.exp, "final_model"), b"another player's bundle", 9)
    blobstore.put_versioned(fake_redis, keys.ckpt(c.exp, "p1_latest_final_model"), b"main player's bundle", 4)
    at_stop = AtStop(envstep=0, train_iter=4, final_eval_task="", best={}, last={}, policy_id="", buffer_id="",
                     ckpt_name="p1_latest")
    final = c.exports.export_final(at_stop, redis_lost=False)
    assert final.path.read_bytes() == b"main player's bundle" and final.policy_version == 4
    c.tb.close()
