"""The ``rqrl`` command: ``train``, ``sweep``, ``status``, ``config show``, ``eval``, ``curve``, ``clean``."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from common import keys, presets, spaces
from common.config import ConfigError, apply_overrides, is_deterministic, load_config
from common.data_shards import DataShardConfigError, resolve_urls
from common.connection import RedisUnavailable
from common.redis_memory import RedisNotSuitable
from coordinator import runs
from coordinator.children import unblock_stop_signals
from coordinator.commander import commander_class


def _load(path: str, overrides: list[str], seed: int | None):
    cfg = load_config(path)
    extra = list(overrides) + ([f"seed={seed}"] if seed is not None else [])
    return apply_overrides(cfg, extra) if extra else cfg


def _check_redis(url: str | None, cfg, allow_eviction: bool, collectors: int, data_urls: list[str] = ()) -> None:
    """An existing Redis (``--redis-url``) and every data shard (``data_urls``) answer at once and
    suit a run (noeviction, or ``--allow-eviction``), checked before anything is launched or
    created (one try, at most 2 s each).

    Raises:
        RedisUnavailable, RedisNotSuitable: naming the redacted URL (and the data shard).
    """
    if data_urls:
        from common.data_shards import DataShards

        shards = DataShards(data_urls)
        try:
            shards.check(cfg, allow_eviction, collectors, patient=False)
        finally:
            shards.close()
    if url is None:
        return  # a private redis-server: started, and checked, by the launcher
    from common import server_limits
    from common.connection import connect_checked
    from common.redis_memory import check_memory_settings

    conn = connect_checked(url, socket_timeout=5, patient=False)
    try:
        check_memory_settings(conn, cfg, allow_eviction, collectors)  # raises; the launcher prints warnings
        server_limits.check(conn, cfg, collectors)  # maxclients, proto-max-bulk-len
    finally:
        conn.close()


def _pick_config(args: argparse.Namespace) -> None:
    """Set ``args.config`` from ``--env`` / ``--algo`` (a tuned preset, common/presets.py), or check
    that a config file was given instead; ``args.preset`` is the preset or None.

    Raises:
        ConfigError: both or neither of CONFIG and ``--env``, ``--algo`` without ``--env``, or no
            preset for them (the message lists the presets).
    """
    args.preset = None
    if args.env is None:
        if args.algo is not None:
            raise ConfigError("--algo picks a preset for --env ID: give --env too (or a config file alone)")
        if args.config is None:
            raise ConfigError(f"give a config file (see deploy/configs/) or --env ID [--algo NAME] for a tuned "
                              f"preset; presets:\n{presets.listing()}")
        return
    if args.config is not None:
        raise ConfigError(f"give a config file or --env, not both (--env {args.env} picks its own config file)")
    try:
        args.preset = presets.find(args.env, args.algo)
    except presets.NoPreset as e:
        raise ConfigError(str(e)) from None
    args.config = str(args.preset.path)
    print(f"preset for {args.preset.env_id}: {args.preset.algo}, config {_shown(args.preset.path)}", file=sys.stderr)


def _shown(path: Path) -> str:
    """``path`` relative to the working folder when it is below it (as users type it), else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _probe(cfg, preset) -> None:
    """The commander's own checks (``BaseCommander.check_config``), then env spaces against
    ``policy.model`` (spaces.check_model); a preset whose env cannot be built names the pip extra
    it needs."""
    try:
        check = getattr(commander_class(cfg), "check_config", None)
        if check is not None:
            check(cfg)
    except (KeyError, ValueError) as e:
        raise ConfigError(str(e.args[0] if e.args else e)) from None
    try:
        spaces.check_model(cfg, spaces.probe(cfg))
    except spaces.SpaceError as e:
        if preset is not None and preset.extra:
            raise spaces.SpaceError(f"{e} (the {preset.env_id} preset needs the {preset.extra} extra: "
                                    f"pip install -e \".[{preset.extra}]\")") from None
        raise


def _collector_workers(asked: int | None, cfg) -> int:
    """The collector workers ``rqrl train`` starts: ``--collectors`` (default 2); one for a
    deterministic run, where training and evals take turns on one worker (common/config.py).

    Raises:
        ConfigError: fewer than one, or more than one for a deterministic run.
    """
    if is_deterministic(cfg):
        if asked not in (None, 1):
            raise ConfigError(f"--collectors {asked}: a deterministic run has one collector worker")
        return 1
    if asked is not None and asked < 1:
        raise ConfigError("--collectors must be >= 1")
    return 2 if asked is None else asked


def cmd_train(args: argparse.Namespace) -> int:
    """``rqrl train``. Everything checkable from the config, the env's spaces and the URL is checked
    before any process, folder, ``latest`` link or Redis key is made (a refusal takes ~1-2 s).
    The run's clock starts here, at the launch."""
    started_at = time.time()
    _pick_config(args)
    if args.deterministic:
        args.overrides.append("system.deterministic=True")
    cfg = _load(args.config, args.overrides, args.seed)
    args.collectors = _collector_workers(args.collectors, cfg)
    if args.name is not None:
        try:
            keys.namespace(cfg.exp_name, args.name)
        except ValueError as e:
            raise ConfigError(f"--name: {e}") from None
        if (Path(cfg.exp_name) / args.name).exists():
            raise ConfigError(f"--name: run folder {Path(cfg.exp_name) / args.name} exists already: choose another "
                              "--name, or continue that run with --resume")
    run_dir, resume = None, None
    if args.resume:
        if args.name:
            raise ConfigError("--resume continues a run under its own name: give --resume or --name, not both")
        try:
            run_dir = runs.find_run_dir(Path("."), cfg.exp_name, args.resume)
        except ValueError as e:
            raise ConfigError(f"--resume: {e}") from None
        point, summary = run_dir / "resume.json", run_dir / "summary.json"
        if summary.is_file() and json.loads(summary.read_text()).get("exit_code") == 0:
            raise ConfigError(f"--resume: run {run_dir} converged (its summary.json says exit_code 0); "
                              "start a new run instead")
        if not point.is_file():
            raise ConfigError(f"--resume: {point} does not exist: the run saved no learner checkpoint to resume from")
        resume = json.loads(point.read_text())
        seed = int(resume["seed"])
        if args.seed is not None and args.seed != seed:
            raise ConfigError(f"--resume: the run was started with seed {seed}, not --seed {args.seed}")
        args.seed = seed
        cfg = _load(args.config, args.overrides, seed)
    # Env spaces against policy.model before anything is launched (fails in one line).
    _probe(cfg, args.preset)
    if cfg.policy.cuda is True:  # the learner runs here: no CUDA here means it would fail at start
        # Asked through NVML, the check leaves CUDA uninitialised in this process: the learner is
        # forked from it, and CUDA initialised before a fork cannot be used after it.
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("config key 'policy.cuda' is True but this machine has no CUDA device; "
                              "set policy.cuda=False, or 'auto' to use CUDA where it exists")
    data_urls = resolve_urls(args.data_redis_url, cfg)
    _check_redis(args.redis_url, cfg, args.allow_eviction, args.collectors, data_urls)
    if args.dry_run:
        what = f"resume run {run_dir}" if run_dir is not None else f"start a run in ./{cfg.exp_name}/"
        print(f"dry run: config, env spaces{' and Redis' if args.redis_url else ''} checked; would {what} with "
              f"{args.collectors} collector worker{'s' if args.collectors != 1 else ''} (nothing launched, nothing created)")
        return 0
    coord_args = [f"--set={o}" for o in args.overrides]
    if args.seed is not None:
        coord_args += ["--seed", str(args.seed)]
    if args.allow_eviction:
        coord_args.append("--allow-eviction")
    if run_dir is not None:
        coord_args.append("--resume")
    else:
        try:
            run_dir = runs.reserve_run_dir(Path("."), cfg.exp_name, int(cfg.seed), args.name)
        except ValueError as e:
            raise ConfigError(f"--name: {e}") from None
    print(f"run {cfg.exp_name}/{run_dir.name}{' (resumed)' if args.resume else ''}: files in "
          f"{Path(cfg.exp_name) / run_dir.name}/", file=sys.stderr)
    from coordinator.launcher import Launcher

    return Launcher(cfg, args.config, args.redis_url, args.collectors, coord_args, run_dir.name,
                    started_at=started_at, resume=resume, data_urls=data_urls).run()


def cmd_sweep(args: argparse.Namespace) -> int:
    from coordinator.sweep import Sweep, parse_seeds

    started_at = time.time()
    _pick_config(args)
    try:
        seeds = parse_seeds(args.seeds)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    cfg = _load(args.config, args.overrides, seeds[0])
    collectors = args.collectors if args.collectors is not None else 2 * len(seeds)
    if collectors < 1 or args.eval_episodes < 0:
        raise ConfigError("--collectors must be >= 1 and --eval-episodes >= 0")
    _probe(cfg, args.preset)
    _check_redis(args.redis_url, cfg, args.allow_eviction, collectors)
    if args.dry_run:
        print(f"dry run: config, env spaces{' and Redis' if args.redis_url else ''} checked; would run seeds {seeds} "
              f"with {collectors} collector tasks in ./{cfg.exp_name}/ (nothing launched, nothing created)")
        return 0
    coord_args = [f"--set={o}" for o in args.overrides] + (["--allow-eviction"] if args.allow_eviction else [])
    sweep = Sweep(cfg, args.config, args.redis_url, collectors, coord_args, seeds, args.eval_episodes,
                  started_at=started_at)
    code = sweep.run()
    if code > 128:  # interrupted: no table of half-finished runs
        return code
    sweep.report()
    return code


def cmd_presets(args: argparse.Namespace) -> int:
    print("Presets (rqrl train --env ID [--algo NAME]; the first algorithm of an env is its default):")
    print(presets.listing())
    return 0


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
    _pick_config(args)
    cfg = _load(args.config, args.overrides, None)
    try:
        spec = spaces.probe(cfg)
        spaces.check_model(cfg, spec)  # show the shapes the run will use
    except spaces.SpaceError as e:
        print(f"note: {e}", file=sys.stderr)
        spec = None
    from common import envs
    from common.policy import algorithm_of, create_policy

    warnings, notes = envs.cut_warnings(cfg)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    for line in notes:
        print(f"note: {line}", file=sys.stderr)

    from common.sources import get_source

    if spec is not None and get_source(algorithm_of(cfg).data_source).replay_buffer:
        from common import memory_budget

        schema = create_policy(cfg, spec, modes=("collect",), device="cpu").schema()
        try:  # the learner's check, run here against this machine's memory (stderr: stdout stays JSON)
            print(memory_budget.check(cfg, spec, schema)[1], file=sys.stderr)
        except memory_budget.MemoryBudgetError as e:
            print(f"note: {e}", file=sys.stderr)
    print(json.dumps(cfg, indent=2, default=str))
    return 0


def _add_preset_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", default=None, help="config file (see deploy/configs/); or --env")
    p.add_argument("--env", default=None, metavar="ID",
                   help="a gymnasium env id: use its tuned preset instead of a config file (rqrl presets lists them)")
    p.add_argument("--algo", default=None, metavar="NAME",
                   help=f"with --env: the preset of this algorithm ({', '.join(sorted({p.algo for p in presets.PRESETS}))}; "
                        "default: the env's first preset)")


def _add_fleet_commands(sub: Any) -> None:
    """``rqrl coordinator`` and ``rqrl worker QUEUE``: both hand their arguments on whole
    (:func:`main` routes them before parsing); listed here for ``rqrl --help``."""
    sub.add_parser("coordinator", add_help=False,
                   help="the coordinator daemon of a many-machines run (python -m coordinator's options; --help)")
    wk = sub.add_parser("worker", help="a collector or learner worker of a many-machines run: rq worker QUEUE with "
                                       "rqrl's worker class (rq worker's options follow, e.g. --url; --help)")
    wk.add_argument("queue", choices=sorted(WORKER_CLASS))


def _add_train_command(sub: Any, url_help: str) -> None:
    """``rqrl train``'s arguments."""
    t = sub.add_parser("train", help="train on this machine: Redis, coordinator and workers as child processes")
    _add_preset_arguments(t)
    t.add_argument("--redis-url", default=None, help=url_help + "; default: a private redis-server")
    t.add_argument("--data-redis-url", default=None, metavar="URL[,URL...]",
                   help="Redis servers for step data (chunks), one data shard each; queues, leases and the run's "
                        "records stay on --redis-url (default: $RQRL_DATA_REDIS_URL, else config "
                        "system.data_redis_url, else none: step data on --redis-url)")
    t.add_argument("--deterministic", action="store_true",
                   help="the same seed gives the same run: one collector worker in lockstep with the learner, "
                        "evals between collector tasks (as fast as one process; config system.deterministic)")
    t.add_argument("--collectors", type=int, default=None, help="collector workers to start (default 2), plus one kept free for evaluation; "
                   "the run's collector tasks follow the live workers")
    t.add_argument("--seed", type=int, default=None, help="override the config's seed")
    t.add_argument("--name", default=None,
                   help="the run's name: its folder ./EXP/NAME/ and Redis keys rqrl:EXP/NAME:* "
                        "(default: UTC time and seed, e.g. 20261130T021500Z-s1)")
    t.add_argument("--resume", default=None, metavar="RUN",
                   help="continue a stopped or interrupted run (its folder ./EXP/RUN or its name RUN) from its last "
                        "checkpoint, with its seed; e.g. with a larger budget: --set commander.max_env_step=...")
    t.add_argument("--allow-eviction", action="store_true",
                   help="run even if Redis's maxmemory-policy can evict keys (rqrl requires noeviction)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set policy.learn.batch_size=128")
    t.add_argument("--dry-run", action="store_true",
                   help="check the config, the env's spaces and --redis-url as a launch would, then exit "
                        "(0: it would start) without starting or creating anything")
    t.set_defaults(func=cmd_train)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rqrl", description="Distributed RL training on Redis and RQ.")
    sub = ap.add_subparsers(dest="cmd", required=True)

    url_help = "redis://[user:pass@]host:port/db, rediss:// or unix:// (default: $RQRL_REDIS_URL)"
    _add_train_command(sub, url_help)

    w = sub.add_parser("sweep", help="the seeds of one config as concurrent runs on one Redis and worker fleet; "
                                     "then a table and a plot across seeds")
    _add_preset_arguments(w)
    w.add_argument("--seeds", required=True, help="e.g. 0-4, or 1,3,7")
    w.add_argument("--collectors", type=int, default=None,
                   help="collector tasks at once across the sweep (default 2 per seed); each run gets an equal share "
                        "(at least 1); one more collector worker starts for evaluation")
    w.add_argument("--eval-episodes", type=int, default=20,
                   help="episodes to re-evaluate each run's final.pt on, with fresh seeds (default 20; 0: none)")
    w.add_argument("--redis-url", default=None, help=url_help + "; default: a private redis-server")
    w.add_argument("--allow-eviction", action="store_true",
                   help="run even if Redis's maxmemory-policy can evict keys (rqrl requires noeviction)")
    w.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run, e.g. --set env.stop_value=150")
    w.add_argument("--dry-run", action="store_true",
                   help="check the config, the env's spaces and --redis-url, then exit without starting anything")
    w.set_defaults(func=cmd_sweep)

    pr = sub.add_parser("presets", help="the tuned presets of rqrl train --env ID [--algo NAME]")
    pr.set_defaults(func=cmd_presets)

    s = sub.add_parser("status", help="queues, workers, tasks, throughput and last eval, read from Redis")
    s.add_argument("--redis-url", default=None, help=url_help)
    s.add_argument("--exp", default=None,
                   help="an experiment (all its runs) or one run, EXP/RUN (default: every run in this Redis)")
    s.add_argument("--watch", action="store_true", help="refresh every 2 s until Ctrl-C")
    s.add_argument("--json", action="store_true", help="print JSON for scripts")
    s.set_defaults(func=cmd_status)

    c = sub.add_parser("config", help="config tools")
    csub = c.add_subparsers(dest="config_cmd", required=True)
    cs = csub.add_parser("show", help="print the compiled config (defaults merged in)")
    _add_preset_arguments(cs)
    cs.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    cs.set_defaults(func=cmd_config_show)

    # The modules below import only the standard library at load time (torch etc. come later).
    from coordinator import clean, curve, evaluate

    e = sub.add_parser("eval", help="play episodes with a saved final.pt, acting as the run's evals did "
                       "(a DQN: epsilon-greedy with policy.eval.eps), optionally filmed")
    evaluate.add_arguments(e)
    e.set_defaults(func=cmd_eval)

    cu = sub.add_parser("curve", help="plot a run's eval reward against env steps and wall time (PNG)")
    curve.add_arguments(cu)
    cu.set_defaults(func=cmd_curve)

    cl = sub.add_parser("clean", help="list (dry run) or delete (--yes) one run's or experiment's Redis keys and RQ jobs")
    clean.add_arguments(cl)
    cl.set_defaults(func=cmd_clean)

    _add_fleet_commands(sub)
    return ap


# What each queue's worker runs (as rqrl train starts them): collectors keep their envs between
# tasks in-process, the learner forks a work-horse from a parent that imported torch already.
WORKER_CLASS = {"collector": "workers.worker.CollectorWorker", "learner": "workers.worker.PreloadWorker"}


def cmd_coordinator(argv: list[str]) -> int:
    """``rqrl coordinator ...``: ``python -m coordinator ...`` without the cwd first on sys.path."""
    from coordinator.__main__ import main as coordinator_main

    return coordinator_main(argv)


def cmd_worker(queue: str, argv: list[str]) -> int:
    """``rqrl worker QUEUE [rq worker options]``: RQ's own ``rq worker`` command, with rqrl's worker
    class for the queue. RQ puts its ``--path`` (default ``.``) first on sys.path, so a module in
    the folder it starts in would shadow rqrl's packages; the path given is where they are
    installed instead (a ``--path`` of the user's own comes after it)."""
    from rq.cli import main as rq_main

    home = str(Path(keys.__file__).resolve().parents[1])
    try:
        rq_main.main(args=["worker", queue, "-w", WORKER_CLASS[queue], "--path", home, *argv],
                     prog_name="rqrl", standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run one ``rqrl`` command; its exit code.

    Called as the program (``argv`` None), ``rqrl train`` ends with ``os._exit`` once its
    children and private Redis are gone: the interpreter's teardown of torch's modules would
    add about a second (measured, 2 cores) to every run and has nothing left to clean up.
    """
    if argv is None:
        # Started by a script's `rqrl ... &`, the process inherits SIGINT ignored, and Python then
        # installs no KeyboardInterrupt: Ctrl-C / kill -INT must still stop any rqrl command.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        unblock_stop_signals()  # nor can a parent's blocked mask stop them
    raw = sys.argv[1:] if argv is None else list(argv)
    if raw[:1] == ["coordinator"]:
        return cmd_coordinator(raw[1:])
    if raw[:1] == ["worker"] and raw[1:2] and raw[1] in WORKER_CLASS:
        return cmd_worker(raw[1], raw[2:])
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
    except (ConfigError, spaces.SpaceError) as e:
        print(f"config error: {e}", file=sys.stderr)
        code = 1
    except (RedisUnavailable, RedisNotSuitable, DataShardConfigError) as e:
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
