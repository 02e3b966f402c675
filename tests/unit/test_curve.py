"""Unit tests for coordinator/curve.py: the PNG and the eval points rebuilt from the events stream."""

from __future__ import annotations

import pytest
from PIL import Image

from common import keys, streams
from coordinator import curve
from coordinator.cli import main as rqrl_main

T0 = 1_700_000_000.0


def points(n=5):
    return [{"envstep": 1000 * (i + 1), "reward_mean": 20.0 * (i + 1), "reward_std": 3.0, "time": T0 + 30 * i,
             "policy_version": 200 * (i + 1)} for i in range(n)]


def check_png(path, size=(1200, 450)):
    assert path.is_file() and path.stat().st_size > 1000
    with Image.open(path) as im:
        assert im.format == "PNG"
        assert im.size == size


def plotted(fig):
    """What each axes of ``fig`` shows: xlabel, data line (x, y), stop lines (y), std band (y range), notes."""
    out = []
    for ax in fig.axes:
        data = [ln for ln in ax.get_lines() if ln.get_label() == "eval reward mean"]
        stops = [ln for ln in ax.get_lines() if ln.get_label().startswith("stop value")]
        bands = [c.get_paths()[0].vertices[:, 1] for c in ax.collections]
        out.append({
            "xlabel": ax.get_xlabel(),
            "x": data[0].get_xdata().tolist() if data else None,
            "y": data[0].get_ydata().tolist() if data else None,
            "stop": [ln.get_ydata()[0] for ln in stops],
            "stop_style": [ln.get_linestyle() for ln in stops],
            "band": (round(min(bands[0]), 6), round(max(bands[0]), 6)) if bands else None,
            "texts": [t.get_text() for t in ax.texts],
        })
    return out


def test_figure_plots_points_axes_and_stop_line():
    fig = curve.build_figure(points(), 195.0)
    step, wall = plotted(fig)
    assert step["xlabel"] == "env steps" and wall["xlabel"] == "wall time since the first eval (s)"
    assert step["x"] == [1000, 2000, 3000, 4000, 5000]
    assert wall["x"] == [0, 30, 60, 90, 120]
    assert step["y"] == wall["y"] == [20.0, 40.0, 60.0, 80.0, 100.0]
    assert step["stop"] == wall["stop"] == [195.0] and step["stop_style"] == ["--"]
    assert step["band"] == wall["band"] == (17.0, 103.0)  # mean ± std: 20 - 3 .. 100 + 3
    assert fig._suptitle.get_text() == "eval reward (5 evals, best 100)"
    assert [round(v) for v in fig.get_size_inches() * fig.dpi] == [1200, 450]


def test_figure_any_order_t0_minutes_and_no_stop_value():
    pts = list(reversed(points(8)))
    step, wall = plotted(curve.build_figure(pts, None, t0=T0 - 5000, title="exp"))
    assert step["x"] == [1000 * (i + 1) for i in range(8)]  # sorted by time
    assert wall["xlabel"] == "wall time since start (min)"
    assert wall["x"] == pytest.approx([(5000 + 30 * i) / 60 for i in range(8)])
    assert step["stop"] == wall["stop"] == []


def test_figure_hours_axis():
    pts = [dict(p, time=T0 + 3600 * i) for i, p in enumerate(points(4))]
    _, wall = plotted(curve.build_figure(pts, 1.0))
    assert wall["xlabel"] == "wall time since the first eval (h)" and wall["x"] == [0, 1, 2, 3]


def test_figure_without_evals_still_draws_stop_line():
    step, wall = plotted(curve.build_figure([], 195.0))
    assert step["x"] is None and step["texts"] == ["no evaluations"] and step["stop"] == [195.0]


def test_plot_curve_writes_png(tmp_path):
    out = curve.plot_curve(points(), 195.0, tmp_path / "sub" / "curve.png")
    assert out == tmp_path / "sub" / "curve.png"
    check_png(out)


def test_plot_curve_names_bad_point(tmp_path):
    bad = points(2)
    del bad[1]["envstep"]
    with pytest.raises(ValueError, match=r"eval point 1 has no 'envstep'"):
        curve.plot_curve(bad, 195.0, tmp_path / "x.png")
    bad = points(1)
    bad[0]["time"] = "soon"
    with pytest.raises(ValueError, match=r"'time' = 'soon' is not a number"):
        curve.plot_curve(bad, 195.0, tmp_path / "x.png")


def add_event(conn, exp, **fields):
    streams.add(conn, keys.events(exp), fields)


def fill_stream(conn, exp="cp"):
    """A run's events: evals between learner_info updates, plus entries that must be ignored."""
    c = "collector"
    add_event(conn, exp, type="started", task_id="L", task_type="learner", ts=T0)
    add_event(conn, exp, type="finished", task_id="e0", task_type=c, eval_flag=True, reward_mean=9.5,
              reward_std=0.5, policy_version=0, ts=T0 + 1)
    # An older learner's report, under the seed's field name.
    add_event(conn, exp, type="learner_info", task_id="L", task_type="learner", collector_envstep=100,
              train_iter=50, ts=T0 + 2)
    add_event(conn, exp, type="finished", task_id="t1", task_type=c, eval_flag=False, reward_mean=15.0,
              reward_std=1.0, policy_version=40, ts=T0 + 3)  # a training task: not an eval
    add_event(conn, exp, type="finished", task_id="e1", task_type=c, eval_flag=True, reward_mean=20.0,
              reward_std=2.0, policy_version=50, ts=T0 + 4)
    add_event(conn, exp, type="learner_info", task_id="L", task_type="learner", consumed_env_steps=300,
              train_iter=150, ts=T0 + 5)
    add_event(conn, exp, type="learner_info", task_id="L", task_type="learner", consumed_env_steps=500,
              train_iter=250, ts=T0 + 6)
    add_event(conn, exp, type="failed", task_id="e2", task_type=c, eval_flag=True, error="boom", ts=T0 + 7)
    add_event(conn, exp, type="finished", task_id="e3", task_type=c, eval_flag=True, reward_mean=150.0,
              reward_std=12.5, policy_version=250, ts=T0 + 8)
    add_event(conn, exp, type="finished", task_id="e3", task_type=c, eval_flag=True, reward_mean=150.0,
              reward_std=12.5, policy_version=250, ts=T0 + 9)  # a duplicate report
    add_event(conn, "other", type="finished", task_id="x", task_type=c, eval_flag=True, reward_mean=1.0,
              reward_std=0.0, policy_version=1, ts=T0 + 10)


EXPECTED = [
    {"envstep": 0, "reward_mean": 9.5, "reward_std": 0.5, "time": T0 + 1, "policy_version": 0},
    {"envstep": 100, "reward_mean": 20.0, "reward_std": 2.0, "time": T0 + 4, "policy_version": 50},
    {"envstep": 500, "reward_mean": 150.0, "reward_std": 12.5, "time": T0 + 8, "policy_version": 250},
]


@pytest.mark.parametrize("page", [5000, 2, 1])
def test_evals_from_events(fake_redis, page):
    fill_stream(fake_redis)
    pts, t0 = curve.evals_from_events(fake_redis, "cp", page=page)
    assert pts == EXPECTED
    assert t0 == T0


def test_evals_from_empty_stream(fake_redis):
    assert curve.evals_from_events(fake_redis, "nothing") == ([], None)


@pytest.fixture
def patched_connect(monkeypatch, fake_redis):
    monkeypatch.setattr("common.connection.connect", lambda url=None, **kw: fake_redis)
    return fake_redis


@pytest.fixture
def figures(monkeypatch):
    """The figures the CLI builds, kept for inspection."""
    built = []
    real = curve.build_figure

    def keep(*a, **kw):
        built.append(real(*a, **kw))
        return built[-1]

    monkeypatch.setattr(curve, "build_figure", keep)
    return built


def test_cli_curve_from_redis(patched_connect, tmp_path, capsys, figures):
    fill_stream(patched_connect)
    patched_connect.hset(keys.commander("cp"), mapping={"stop_value": "195.0", "envstep": "500"})
    out = tmp_path / "cp_curve.png"
    assert rqrl_main(["curve", "--exp", "cp", "--out", str(out), "--redis-url", "redis://run-redis:6379/0"]) == 0
    text = capsys.readouterr().out
    assert "3 evals" in text and "stop value 195" in text
    check_png(out)
    step, wall = plotted(figures[0])
    assert step["x"] == [0, 100, 500] and step["y"] == [9.5, 20.0, 150.0]
    assert wall["x"] == [1, 4, 8]  # seconds since the stream's first event
    assert step["stop"] == [195.0]


def test_cli_curve_default_path(patched_connect, tmp_path, monkeypatch, figures):
    fill_stream(patched_connect)
    monkeypatch.chdir(tmp_path)
    assert curve.main(["--exp", "cp", "--stop-value", "100", "--redis-url", "redis://run-redis:6379/0"]) == 0
    check_png(tmp_path / "cp" / "curve.png")
    assert plotted(figures[0])[0]["stop"] == [100.0]


def test_cli_curve_without_evals(patched_connect, tmp_path, capsys):
    assert curve.main(["--exp", "nothing", "--out", str(tmp_path / "x.png"), "--redis-url", "redis://r:6379/0"]) == 1
    assert "no finished eval in rqrl:nothing:evals or rqrl:nothing:events" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_cli_curve_bad_exp_name(patched_connect, capsys):
    assert curve.main(["--exp", "a:b"]) == 1
    assert "exp_name" in capsys.readouterr().err


def test_curve_from_a_run_folder_needs_no_redis(tmp_path, monkeypatch, capsys):
    """After `rqrl train` the private Redis is gone: `rqrl curve --exp E` reads ./E/evals.jsonl."""
    import json as _json

    from coordinator.curve import evals_from_folder, main

    run = tmp_path / "cp"
    run.mkdir()
    rows = [{"task_id": f"e{i}", "envstep": 100 * i, "reward_mean": 10.0 * i, "reward_std": 1.0,
             "time": T0 + i, "policy_version": 5 * i} for i in range(1, 4)]
    (run / "evals.jsonl").write_text("".join(_json.dumps(r) + "\n" for r in rows + rows[-1:]))  # a duplicate line
    (run / "summary.json").write_text(_json.dumps({"stop_value": 25.0}))
    points, t0, stop = evals_from_folder(run)
    assert [p["reward_mean"] for p in points] == [10.0, 20.0, 30.0] and t0 == T0 + 1 and stop == 25.0
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RQRL_REDIS_URL", raising=False)
    assert main(["--exp", "cp"]) == 0
    out = capsys.readouterr().out
    assert "3 evals, last reward_mean 30 at 300 env steps (stop value 25)" in out
    assert (run / "curve.png").stat().st_size > 1000
    (run / "evals.jsonl").write_text("not json\n")
    assert main(["--run-dir", str(run)]) == 1
    assert "line 1: not JSON" in capsys.readouterr().err
