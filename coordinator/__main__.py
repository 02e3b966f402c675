"""``python -m coordinator CONFIG [--redis-url URL] [--data-redis-url URL[,URL...]] [--seed S] [--run-name NAME]
[--set KEY=VALUE ...]``."""

from __future__ import annotations

import argparse
import sys

from common import keys, spaces
from common.config import ConfigError, apply_overrides, load_config
from common.connection import RedisUnavailable, connect_checked


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m coordinator``."""
    ap = argparse.ArgumentParser(prog="python -m coordinator", description="Run an rqrl coordinator daemon.")
    ap.add_argument("config", help="DI-engine style config file defining main_config (and create_config)")
    ap.add_argument("--redis-url", default=None, help="redis://[user:pass@]host:port/db, rediss:// or unix:// "
                                                      "(default: $RQRL_REDIS_URL or redis://127.0.0.1:6379/0)")
    ap.add_argument("--data-redis-url", default=None, metavar="URL[,URL...]",
                    help="Redis servers for the run's step data, one data shard each (default: "
                         "$RQRL_DATA_REDIS_URL, else config system.data_redis_url, else the --redis-url one); "
                         "workers need the same list in $RQRL_DATA_REDIS_URL (or the config)")
    ap.add_argument("--seed", type=int, default=None, help="override the config's seed")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set policy.learn.batch_size=128 (repeatable)")
    ap.add_argument("--out-dir", default=".",
                    help="where the run folder {exp_name}/{run_name}/ is written (default: current directory)")
    ap.add_argument("--run-name", default=None,
                    help="the run's name (its folder and Redis keys); default: the newest unfinished run of this "
                         "exp_name and seed in Redis (a restart), else a new one, UTC time and seed "
                         "(e.g. 20261130T021500Z-s1)")
    ap.add_argument("--resume", action="store_true",
                    help="continue run --run-name: from Redis if it is unfinished there, else from its run folder "
                         "(ckpt/latest.pth, resume.json, evals.jsonl)")
    ap.add_argument("--allow-eviction", action="store_true",
                    help="run even if Redis's maxmemory-policy can evict keys (rqrl requires noeviction)")
    ap.add_argument("--started-at", type=float, default=None, metavar="UNIX_SECONDS",
                    help="where the run's wall clock starts (rqrl train passes its launch time); default: now")
    ap.add_argument("--fresh", action="store_true",
                    help="start a new run even if an unfinished run of this experiment and seed is in Redis "
                         "(default: resume it)")
    ap.add_argument("--done-fd", type=int, default=None, help=argparse.SUPPRESS)  # rqrl train's pipe (Coordinator)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config)
        overrides = list(args.overrides) + ([f"seed={args.seed}"] if args.seed is not None else [])
        if overrides:
            cfg = apply_overrides(cfg, overrides)
        spaces.check_model(cfg, spaces.probe(cfg))  # model shapes from the env; tasks carry them
        if args.run_name is not None:
            try:
                keys.namespace(cfg.exp_name, args.run_name)
            except ValueError as e:
                raise ConfigError(f"--run-name: {e}") from None
    except (ConfigError, spaces.SpaceError) as e:
        print(f"config error: {e}", file=sys.stderr)
        return 1
    from coordinator.daemon import Coordinator, CoordinatorError, live_workers

    from common.data_shards import DataShardConfigError, DataShards, resolve_urls

    try:
        conn = connect_checked(args.redis_url)
        urls = resolve_urls(args.data_redis_url, cfg)
        data = DataShards(urls) if urls else None
    except (RedisUnavailable, DataShardConfigError) as e:
        print(e, file=sys.stderr)
        return 1
    from common import server_limits
    from common.redis_memory import RedisNotSuitable, check_memory_settings

    from rq import Queue

    # Collector tasks in flight: the cap, else the workers up now (at least the launcher's two).
    collectors = cfg.commander.collector_task_space or max(
        2, live_workers(conn, Queue(keys.COLLECTOR_QUEUE, connection=conn)))
    try:
        warnings = check_memory_settings(conn, cfg, args.allow_eviction, int(collectors))
        if data:
            warnings += data.check(cfg, args.allow_eviction, int(collectors))
        for warning in warnings + server_limits.check(conn, cfg, int(collectors)):
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    except (RedisUnavailable, RedisNotSuitable) as e:
        print(f"coordinator: {e}", file=sys.stderr)
        return 1
    try:
        return Coordinator(cfg, conn, args.out_dir, fresh=args.fresh, run_name=args.run_name,
                           resume=args.resume, started_at=args.started_at, done_fd=args.done_fd, data=data).run()
    except CoordinatorError as e:
        print(f"coordinator: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
