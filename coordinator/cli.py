"""The ``rqrl`` command: ``train``, ``status``, ``config show``, ``eval``, ``curve``, ``clean``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from common import spaces
from common.config import ConfigError, apply_overrides, load_config
from common.connection import RedisUnavailable
from common.redis_memory import RedisNotSuitable


def _load(path: str, overrides: list[str], seed: int | None):
    cfg = load_config(path)
    extra = list(overrides) + ([f"seed={seed}"] if seed is not None else [])
    return apply_overrides(cfg, extra) if extra else cfg


def cmd_train(args: argparse.Namespace) -> int:
    from coordinator.launcher import Launcher

    cfg = _load(args.config, args.overrides, args.seed)
    # Env spaces against policy.model before anything is launched (fails in one line).
    spaces.check_model(cfg, spaces.probe(cfg))
    if cfg.policy.cuda is True:  # the learner runs here: no CUDA here means it would fail at start
        # Asked through NVML, the check leaves CUDA uninitialised in this process: the learner is
        # forked from it, and CUDA initialised before a fork cannot be used after it.
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("config key 'policy.cuda' is True but this machine has no CUDA device; "
                              "set policy.cuda=False, or 'auto' to use CUDA where it exists")
    coord_args = [f"--set={o}" for o in args.overrides]
    if args.seed is not None:
        coord_args += ["--seed", str(args.seed)]
    if args.collectors < 1:
        raise ConfigError("--collectors must be >= 1")
    coord_args.append(f"--set=commander.collector_task_space={args.collectors}")
    if args.allow_eviction:
        coord_args.append("--allow-eviction")
    return Launcher(cfg, args.config, args.redis_url, args.collectors, coord_args).run()


def cmd_status(args: argparse.Namespace) -> int:
    from coordinator.status import run_status

    return run_status(args.redis_url, args.exp, watch=args.watch, as_json=args.json)


def cmd_eval(args: argparse.Namespace) -> int:
    from coordinator import evaluate

    return evaluate.run(args)


def cmd_curve(args: argparse.Namespace) -> int:
    from coordinator import curve

    return curve.run(args)


def cmd_clean(args: argparse.Namespace) -> int:
    from coordinator import clean

    return clean.run(args)


def cmd_config_show(args: argparse.Namespace) -> int:
    cfg = _load(args.config, args.overrides, None)
    try:
        spaces.check_model(cfg, spaces.probe(cfg))  # show the shapes the run will use
    except spaces.SpaceError as e:
        print(f"note: {e}", file=sys.stderr)
    print(json.dumps(cfg, indent=2, default=str))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rqrl", description="Distributed RL training on Redis and RQ.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    url_help = "redis://[user:pass@]host:port/db, rediss:// or unix:// (default: $RQRL_REDIS_URL)"
    t = sub.add_parser("train", help="train on this machine: Redis, coordinator and workers as child processes")
    t.add_argument("config", help="config file (see deploy/configs/)")
    t.add_argument("--redis-url", default=None, help=url_help + "; default: a private redis-server")
    t.add_argument("--collectors", type=int, default=2, help="collector tasks at once (default 2); one more collector worker starts for evaluation")
    t.add_argument("--seed", type=int, default=None, help="override the config's seed")
    t.add_argument("--allow-eviction", action="store_true",
                   help="run even if Redis's maxmemory-policy can evict keys (rqrl requires noeviction)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set policy.learn.batch_size=128")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("status", help="queues, workers, tasks, throughput and last eval, read from Redis")
    s.add_argument("--redis-url", default=None, help=url_help)
    s.add_argument("--exp", default=None, help="experiment name (default: every experiment in this Redis)")
    s.add_argument("--watch", action="store_true", help="refresh every 2 s until Ctrl-C")
    s.add_argument("--json", action="store_true", help="print JSON for scripts")
    s.set_defaults(func=cmd_status)

    c = sub.add_parser("config", help="config tools")
    csub = c.add_subparsers(dest="config_cmd", required=True)
    cs = csub.add_parser("show", help="print the compiled config (defaults merged in)")
    cs.add_argument("config")
    cs.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    cs.set_defaults(func=cmd_config_show)

    # The modules below import only the standard library at load time (torch etc. come later).
    from coordinator import clean, curve, evaluate

    e = sub.add_parser("eval", help="play deterministic episodes with a saved final.pt (optionally film them)")
    evaluate.add_arguments(e)
    e.set_defaults(func=cmd_eval)

    cu = sub.add_parser("curve", help="plot a run's eval reward against env steps and wall time (PNG)")
    curve.add_arguments(cu)
    cu.set_defaults(func=cmd_curve)

    cl = sub.add_parser("clean", help="list (dry run) or delete (--yes) one experiment's Redis keys and RQ jobs")
    clean.add_arguments(cl)
    cl.set_defaults(func=cmd_clean)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run one ``rqrl`` command; its exit code.

    Called as the program (``argv`` None), ``rqrl train`` ends with ``os._exit`` once its
    children and private Redis are gone: the interpreter's teardown of torch's modules would
    add about a second (measured, 2 cores) to every run and has nothing left to clean up.
    """
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except (ConfigError, spaces.SpaceError) as e:
        print(f"config error: {e}", file=sys.stderr)
        code = 1
    except (RedisUnavailable, RedisNotSuitable) as e:
        print(f"rqrl: {e}", file=sys.stderr)
        code = 1
    if argv is None and args.func is cmd_train:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
