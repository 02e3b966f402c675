"""The benchmark suite: one command, one table, one JSON file.

    python -m tests.bench.run [--quick] [--json bench.json]

Runs, in order: time to solve (``rqrl train``, 5 seeds; 3 with --quick), the single-process
baseline on the same config, the component benchmarks (collector vs bare loop, transport vs
raw redis-py, policy propagation, per-task overhead, learner) and the coordinator scale test
(8 / 64 / 256 simulated collectors). Figures are medians; ratios are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tests.bench import bench_components, bench_coordinator, bench_serial, bench_solve

GOALS = [
    ("time to solve, median wall s (launch to exit)", lambda r: r["solve"]["median_wall_s"], "<= 12"),
    ("env steps to solve vs single process", lambda r: r["solve_vs_serial_envstep"], "<= 1.5"),
    ("collector env steps/s vs bare loop", lambda r: r["components"]["collector"]["collector_vs_bare"], ">= 0.8"),
    ("transport MB/s vs raw redis-py (64-row chunks)", lambda r: r["components"]["transport"]["transport_vs_raw"], ">= 0.8"),
    ("policy propagation p95 ms", lambda r: r["components"]["propagation"]["policy_lag_p95_ms"], "<= 100"),
    ("learner share of time waiting for data", lambda r: r["solve_learner_wait_share"], "<= 0.05"),
    ("coordinator burst events/s (256 sims)", lambda r: r["coordinator"][-1]["burst_events_per_s"], ">= 20000"),
    ("dispatch latency p99 ms (256 sims)", lambda r: r["coordinator"][-1]["dispatch_p99_ms"], "<= 50"),
]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="bench.json")
    args = ap.parse_args(argv)
    seeds = ["0", "1", "2"] if args.quick else ["0", "1", "2", "3", "4"]
    r: dict = {}
    print("== time to solve (rqrl train)")
    r["solve"] = bench_solve.main(["--seeds", *seeds])
    print("== single-process baseline")
    r["serial"] = bench_serial.main(["--seeds", *seeds])
    if r["solve"]["median_envstep"] and r["serial"]["median_envstep"]:
        r["solve_vs_serial_envstep"] = round(r["solve"]["median_envstep"] / r["serial"]["median_envstep"], 2)
    waits = [x["learner_wait_share"] for x in r["solve"]["runs"] if x.get("learner_wait_share") is not None]
    r["solve_learner_wait_share"] = sorted(waits)[len(waits) // 2] if waits else None
    print("== components")
    r["components"] = bench_components.main(["--quick"] if args.quick else [])
    print("== coordinator scale")
    r["coordinator"] = bench_coordinator.main(["--seconds", "5" if args.quick else "10",
                                               "--burst", "20000" if args.quick else "50000"])
    print("\n== summary")
    print(f"{'figure':<50} {'measured':>10}  goal")
    for name, get, goal in GOALS:
        try:
            value = get(r)
        except (KeyError, IndexError, TypeError):
            value = None
        print(f"{name:<50} {value if value is not None else '-':>10}  {goal}")
    Path(args.json).write_text(json.dumps(r, indent=2) + "\n")
    print(f"\nfigures written to {args.json}")
    return r


if __name__ == "__main__":
    main()
