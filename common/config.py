"""Config files: DI-engine style Python files merged over defaults into an EasyDict.

A config file is Python that defines ``main_config`` (the experiment) and optionally
``create_config`` (which registered implementations to build: ``policy.type``,
``learner.type``, ``commander.type``, each with optional ``import_names``). Every key in the
user's ``main_config`` must exist in the defaults: an unknown or mistyped key raises
:class:`ConfigError` naming the dotted key and the closest valid one, as does a value whose
type does not match the default's.
"""

from __future__ import annotations

import copy
import math
import difflib
import os
import runpy
from pathlib import Path
from typing import Any

from easydict import EasyDict

from common.policy import DEFAULT_ALGORITHM, get_algorithm
from common.spaces import make_importable


class ConfigError(ValueError):
    """A bad config: the message names the file or the dotted key at fault."""


# Defaults for everything except the policy's own section, which each algorithm supplies as
# its ``Algorithm.config`` (common/policy/base.py).
SYSTEM_DEFAULTS: dict[str, Any] = dict(
    exp_name="default_experiment",
    seed=0,
    # Where step data goes (common/data_shards.py): "" = the control Redis (--redis-url); else
    # "URL[,URL...]", one data shard each (--data-redis-url and $RQRL_DATA_REDIS_URL take precedence).
    system=dict(
        data_redis_url="",
        # Same seed, same run: one collector acting in lockstep with the learner (apply_deterministic).
        deterministic=False,
    ),
    env=dict(
        env_id="CartPole-v1",
        # gymnasium.make keyword arguments, e.g. dict(max_episode_steps=200)
        env_kwargs=dict(),
        collector_env_num=8,
        evaluator_env_num=5,
        n_evaluator_episode=5,
        stop_value=195.0,
        manager=dict(type="sync"),  # gymnasium vector env: "sync" (in-process) or "async" (subprocesses)
        # Modules to import before building the env (custom envs that register themselves). A config
        # file's own top-level imports are added here when it is loaded, so workers import them too.
        import_names=[],
        # "" or "atari": the Atari wrappers of SB3 / CleanRL with the settings of env.atari (common/envs.py).
        preset="",
        atari=dict(
            frame_skip=4,
            screen_size=84,
            grayscale=True,
            frame_stack=4,
            noop_max=30,  # up to this many NOOP steps at the start of each game
            repeat_action_probability=0.25,  # sticky actions, as ALE v5
            # Training envs only: a lost life ends the learner's episode while the game plays on
            # (common/atari.py EpisodicLife); eval envs play whole games.
            terminal_on_life_loss=True,
            fire_reset=True,  # press FIRE after each reset in games that have a FIRE action
            clip_rewards=True,  # to [-1, 1], training envs only: eval returns are game scores
        ),
        # More gymnasium wrappers, applied in order after the preset:
        # [dict(type="module:Class", kwargs={...}, train_only=False), ...]
        wrappers=[],
    ),
    # The infrastructure part of the ``policy`` section; each algorithm adds its own hyperparameters
    # (common/policy/<name>/__init__.py) over these.
    policy=dict(
        # Learner device: True = CUDA (a learner task fails at start without it), "auto" = CUDA where
        # it exists, False = CPU. Collectors act on the CPU; exported weights are always on the CPU.
        cuda=False,
        # None: read from the env's spaces (common/spaces.py); a set value must agree with the env.
        model=dict(obs_shape=None, action_shape=None,
                   # Conv torso for image observations, [channels, kernel, stride] per layer (the Nature
                   # DQN's); unused for flat observations (common/policy/nets.py) unless ``board`` is set.
                   conv=[[32, 8, 4], [64, 4, 2], [64, 3, 1]],
                   # A flat observation that starts with a board game's board: its [height, width,
                   # planes], the planes last (PettingZoo's classic boards); the board goes through
                   # ``conv`` and the rest of the observation (e.g. legal-action flags) beside it.
                   board=None),
        learn=dict(
            # Replay-ratio limiter (replay data): at most this many train iterations per env step received ...
            train_iter_per_env_step=0.5,
            # ... and collectors wait once they are this many env steps ahead of that ratio.
            max_env_step_lead=256,
            # Learner tasks trained as one torch.distributed group (data-parallel; workers/ddp.py).
            # Each rank reads its own share of the step data and the gradients are averaged;
            # replay data only (an on-policy source needs every row of a version in one process).
            learner_num=1,
            learner=dict(
                # Train iterations of one learner task; 0: until the stop flag or the data source
                # ends it (the run's own limit is commander.max_train_iter).
                train_iterations=0,
                log_policy=True,
                # Publish weights every N train iterations (on-policy data: every one). A collector
                # adopts the newest version once per chunk it sends; with two collectors the learner
                # trains 2 x n_sample x train_iter_per_env_step iterations meanwhile, >= 64 in the
                # shipped off-policy presets but the one-env MountainCar and LunarLander DQN ones (16
                # and 32, which publish every 8): the weights a collector acts with age by that much,
                # and 16 adds at most 15 to it. At 4 most versions went unread (CartPole DQN: 4,690
                # published for 296 chunks), and Redis and the learner paid for each
                # (docs/performance.md). Collectors stop at the limit of the last version published:
                # policy.learn.max_env_step_lead must cover the iterations since (min_env_step_lead).
                send_policy_freq=16,
                send_info_freq=20,  # learner info event every N train iterations
                # learner_num > 1: seconds a rank waits for the group to form, and for any collective
                # (a rank waiting for data holds the others); past it the rank fails and the group restarts.
                group_timeout=120.0,
                hook=dict(
                    load_ckpt_before_run="",  # checkpoint name in Redis ("latest", ...); "" = none
                    log_show_after_iter=100,
                    save_ckpt_after_iter=500,
                    # ... or once this many seconds passed since the last save, whichever comes first
                    # (0 = by count only): what a replacement learner loses stays under a minute.
                    save_ckpt_every_s=60.0,
                    save_ckpt_after_run=True,
                ),
            ),
        ),
        collect=dict(
            n_sample=128,  # rows per step-data chunk (replay data); rows per train iteration (on-policy data)
            collector=dict(
                # A collector task ends after this many env steps or seconds, whichever comes first.
                # Envs live on the collector worker (workers/live_envs.py), so a task's end cuts no
                # episode and long tasks cost nothing; the collect setting is read at every chunk.
                task_env_steps=20_000,
                task_max_seconds=60.0,
                # Seconds a worker keeps a run's envs with no task of the run before closing them.
                env_idle_s=300.0,
                # Seconds one env.step may take before the task fails naming the env (a hung
                # simulator would otherwise hold the task, or every later eval, until the job
                # timeout); 0 = no limit (workers/step_watch.py).
                step_timeout_s=60.0,
                data_ttl=600,  # seconds a step-data blob lives in Redis
                torch_threads=1,
                policy_wait_s=120.0,  # seconds a task waits for the learner's first policy
                # Step-data chunk compression: "auto" (zstd for image observations, else none), "none",
                # "lz4" or "zstd" (common/chunk_codec.py).
                compression="auto",
            ),
        ),
        # An eval task ends when its episodes are done, after max_env_steps env steps (0 = no cap)
        # or after max_episode_seconds per episode of its largest per-env quota.
        eval=dict(evaluator=dict(max_episode_seconds=60.0, max_env_steps=100_000)),
        other=dict(replay_buffer=dict(
            replay_buffer_size=20000,
            replay_start_size=256,
            # Proportional prioritized replay (Schaul et al. 2016), for algorithms that report |TD error|.
            priority=False,
            priority_alpha=0.6,
            priority_beta=0.4,  # importance-sampling exponent, annealed linearly to 1 over ...
            priority_beta_anneal_iters=10_000,  # ... this many train iterations
            priority_eps=1e-6,
        )),
    ),
    commander=dict(
        # Collector tasks at once follow the live `rq worker collector` processes (RQ's worker
        # registry), less one kept free for evals when eval_task_space is 1, and at least one.
        # An int caps that number; None follows the workers alone.
        collector_task_space=None,
        learner_task_space=1,
        # 1: an eval task has its own slot (and a worker is kept free for it);
        # 0: evals share collector space, as the seed's commander.
        eval_task_space=1,
        # Evaluate when any of these passes since the last eval (0 disables that trigger).
        eval_interval=60.0,  # seconds, as the seed's SoloCommander
        eval_every_train_iter=200,
        eval_every_env_step=0,
        # Evals (not their confirmations) keep to this share of the time: after an eval that ran
        # d seconds the next waits d * (1 / share - 1) seconds, so on a small, busy machine evals
        # cannot take more of the CPU than this from training (1 = no spacing).
        eval_max_share=0.25,
        # An eval that reaches stop_value is confirmed by a second eval of the *same* weights on
        # this many fresh episodes (other seeds) before the run converges; 0 = converge at once.
        # final.pt holds exactly the confirmed weights; best.pt the best-evaluated so far.
        confirm_eval_episodes=20,
        # ... and the confirmation passes only when its mean minus this many standard errors
        # (reward_std / sqrt(episodes)) still reaches stop_value: a policy that passed by luck
        # near the threshold trains on instead of being exported.
        confirm_margin_se=2.0,
        # Give up (exit non-zero) when one of these passes without convergence (0 = no limit).
        max_env_step=0,
        max_train_iter=0,
        max_wall_seconds=0.0,
        # Seconds to wait for the learner's final checkpoint after convergence.
        finish_timeout=30.0,
        # A run that stops on a budget above (or Ctrl-C / SIGTERM: then at most 10 s) ends with one
        # eval of the learner's newest policy version, waited for this many seconds (0 = none).
        closing_eval_timeout=60.0,
        # RQ job_timeout (seconds) of each task; a learner task runs for the whole experiment.
        collector_job_timeout=600,
        learner_job_timeout=86400,
        # Seconds without a heartbeat after which a running task is declared dead.
        heartbeat_timeout=6.0,
        # Give up (exit 1) after this many task failures in a row with no success (0 = never).
        max_task_failures=10,
        # The league commander's (create_config.commander.type="league", coordinator/league.py):
        # a snapshot of main every snapshot_every train iterations; each training task plays
        # main itself with probability self_play_share, else a snapshot chosen by PFSP with this
        # weighting ("hard", "variance", "uniform") among the newest max_snapshots (0 = all).
        # opponent_acts: "sample" (as a collector of that version acts) or "eval" (its eval action);
        # opponent_lookahead: "none"; "win": the opponent seat plays a move that wins at once when it
        # has one, else its policy; "win_or_block": that, else a move that blocks a win at once.
        league=dict(snapshot_every=20, self_play_share=0.2, weighting="hard", max_snapshots=0, elo_k=16.0,
                    initial_elo=1000.0, opponent_acts="sample", opponent_lookahead="none"),
    ),
)

_CREATE_DEFAULTS: dict[str, Any] = dict(
    policy=dict(type=DEFAULT_ALGORITHM, import_names=[]),
    learner=dict(type="base", import_names=[]),
    commander=dict(type="solo", import_names=[]),
)


def _type_ok(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    if isinstance(default, dict):
        return isinstance(value, dict)
    return isinstance(value, type(default))


def merge_strict(base: dict, override: dict, path: str = "", open_keys: frozenset[str] = frozenset()) -> dict:
    """Deep-merge ``override`` into a copy of ``base``; every key must already exist in ``base``.

    ``open_keys`` lists dotted paths whose dicts accept any keys (e.g. ``env.env_kwargs``).

    Raises:
        ConfigError: an unknown key (with the nearest valid key) or a value of the wrong type.
    """
    out = copy.deepcopy(base)
    if not isinstance(override, dict):
        raise ConfigError(f"{path or 'config'}: expected a dict, got {type(override).__name__}")
    for key, value in override.items():
        dotted = f"{path}.{key}" if path else str(key)
        if path in open_keys:
            out[key] = copy.deepcopy(value)
            continue
        if key not in out:
            raise ConfigError(f"unknown config key {dotted!r}{_did_you_mean(out, path, str(key))}")
        default = out[key]
        if value in _ALTERNATIVES.get(dotted, ()):
            out[key] = value
            continue
        if not _type_ok(default, value):
            raise ConfigError(
                f"config key {dotted!r}: expected {type(default).__name__}, got {type(value).__name__} ({value!r})"
            )
        if isinstance(default, dict) and dotted in open_keys:
            # A free-form dict (e.g. env.env_kwargs) takes any key; entries merge, not replace.
            out[key] = {**default, **copy.deepcopy(value)}
        elif isinstance(default, dict):
            out[key] = merge_strict(default, value, dotted, open_keys)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _did_you_mean(node: dict, path: str, key: str) -> str:
    """``"; did you mean 'a.b'?"`` for an unknown ``key`` below ``path``: the nearest key beside it,
    else the keys deeper down whose last part is (nearly) ``key`` (``batch_size`` ->
    ``policy.learn.batch_size``); ``""`` when nothing is near."""
    near = difflib.get_close_matches(key, [str(k) for k in node], n=1)
    if near:
        return f"; did you mean {'.'.join(filter(None, [path, near[0]]))!r}?"
    leaves: list[str] = []

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            leaves.append(f"{prefix}.{k}" if prefix else str(k))
            if isinstance(v, dict):
                walk(v, leaves[-1])

    walk(node, path)
    last = {leaf: leaf.rsplit(".", 1)[-1] for leaf in leaves}
    found = [leaf for leaf, name in last.items() if name == key]
    if not found:
        names = difflib.get_close_matches(key, list(set(last.values())), n=3, cutoff=0.75)
        found = [leaf for leaf, name in last.items() if name in names]
    if not found:
        return ""
    return "; did you mean " + " or ".join(repr(f) for f in sorted(found)[:3]) + "?"


_OPEN_KEYS = frozenset({"env.env_kwargs"})
# Values a key accepts besides its default's type.
_ALTERNATIVES: dict[str, tuple[Any, ...]] = {"policy.cuda": ("auto",)}


def _merge_defaults(base: dict, extra: dict) -> dict:
    """Deep-merge an algorithm's defaults over the system's (new keys allowed, unlike user config)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge_defaults(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def compile_config(main_config: dict, create_config: dict | None = None) -> EasyDict:
    """Merge a user's ``main_config`` / ``create_config`` over the defaults.

    The policy section's defaults are the system's (infrastructure) with the algorithm's own
    hyperparameters over them, from the algorithm named by ``create_config.policy.type``
    (``dqn`` unless given; see common/policy/__init__.py).

    Returns:
        The full config as an EasyDict, with ``cfg.create`` holding the resolved create_config.

    Raises:
        ConfigError: unknown keys, wrong types, or an unknown policy type.
    """
    from common.registry import import_names

    create = merge_strict(_CREATE_DEFAULTS, create_config or {}, "create_config")
    import_names(create["policy"]["import_names"])
    try:
        algo = get_algorithm(create["policy"]["type"])
    except KeyError as e:
        raise ConfigError(f"create_config.policy.type: {e.args[0]}") from None
    base = copy.deepcopy(SYSTEM_DEFAULTS)
    base["policy"] = _merge_defaults(base["policy"], algo.config)
    cfg = merge_strict(base, main_config, "", _OPEN_KEYS)
    cfg["create"] = create
    apply_deterministic(cfg)
    _validate(cfg)
    return EasyDict(cfg)


def apply_deterministic(cfg: dict) -> None:
    """With ``system.deterministic``, set what makes a run repeat itself for one seed (in place).

    A run is asynchronous by default: collectors act with whatever policy version was published
    when they last sent a chunk, the learner trains on whatever arrived, evals start when a
    timer fires. Deterministic mode takes every clock out of that:

    - one collector task at a time, evals in the same slot (``collector_task_space`` 1,
      ``eval_task_space`` 0; ``rqrl train --deterministic`` starts one collector worker), so
      training and evals alternate on one worker;
    - lockstep: the learner publishes every train iteration (``send_policy_freq`` 1) and lets
      collectors no env step past what it trained on (the replay source's limit, exact there);
      after each chunk the collector waits for the version that trained on it, and computes its
      collect setting (epsilon) from the run's env steps itself;
    - evals on env steps only (``eval_every_env_step``; the train-iteration and wall-time
      triggers and the eval time share are off; an unset interval evaluates every
      ``task_env_steps``), counted from finished collector tasks by the commander, which also
      stops at ``max_env_step`` there; tasks end on env steps (``task_max_seconds`` out of reach),
      at most ``eval_every_env_step`` and ``max_env_step`` of them, so evals and the stop fall
      where they were asked for (a task ends on the first whole vector step past its quota).

    Training runs no faster than one process then (nothing overlaps). ``max_wall_seconds`` and a
    stop by signal still end a run at a moment no seed decides.
    """
    if not cfg.get("system", {}).get("deterministic"):
        return
    com, pol = cfg["commander"], cfg["policy"]
    collector = pol["collect"]["collector"]
    # Tasks no longer than the eval interval or the budget, so that evals and the stop land on them.
    collector["task_env_steps"] = min(n for n in (collector["task_env_steps"], com["eval_every_env_step"],
                                                  com["max_env_step"]) if n > 0)
    com.update(collector_task_space=1, eval_task_space=0, eval_interval=0.0, eval_max_share=1.0,
               eval_every_env_step=com["eval_every_env_step"] or collector["task_env_steps"], eval_every_train_iter=0)
    collector["task_max_seconds"] = 1e9
    pol["learn"]["learner"]["send_policy_freq"] = 1


def is_deterministic(cfg: Any) -> bool:
    """Whether ``cfg`` (a compiled config, or a task's copy of one) runs in deterministic mode
    (:func:`apply_deterministic`); False for a config from before the mode existed."""
    return bool((cfg.get("system") or {}).get("deterministic", False))


def _validate(cfg: dict) -> None:
    from common import keys

    try:
        keys.check_path_component("exp_name", cfg["exp_name"])
    except ValueError as e:
        raise ConfigError(f"config key 'exp_name': {e}") from None
    positive = {
        "env.collector_env_num": cfg["env"]["collector_env_num"],
        "env.evaluator_env_num": cfg["env"]["evaluator_env_num"],
        "env.n_evaluator_episode": cfg["env"]["n_evaluator_episode"],
        "commander.learner_task_space": cfg["commander"]["learner_task_space"],
        "policy.collect.n_sample": cfg["policy"].get("collect", {}).get("n_sample", 1),
        "policy.learn.batch_size": cfg["policy"].get("learn", {}).get("batch_size", 1),
        "policy.learn.learner_num": cfg["policy"]["learn"]["learner_num"],
    }
    for name, value in positive.items():
        if value < 1:
            raise ConfigError(f"config key {name!r} must be >= 1, got {value}")
    # numpy's SeedSequence (common/seeding.py) takes non-negative entropy only.
    if cfg.get("seed", 0) < 0:
        raise ConfigError(f"config key 'seed' must be >= 0, got {cfg['seed']}")
    cap = cfg["commander"]["collector_task_space"]
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise ConfigError("config key 'commander.collector_task_space' must be None (follow the collector workers) "
                          f"or an int >= 1 (a cap), got {cap!r}")
    for key in ("obs_shape", "action_shape"):
        v = cfg["policy"]["model"].get(key)
        ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0) or (
            isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and x > 0 for x in v))
        if not ok:
            raise ConfigError(f"config key 'policy.model.{key}' must be unset (read from the env), a positive int "
                              f"or a list of them, got {v!r}")
    rb = cfg["policy"].get("other", {}).get("replay_buffer", {})
    if not rb.get("priority_eps", 1.0) > 0:
        raise ConfigError(f"config key 'policy.other.replay_buffer.priority_eps' must be > 0 (no transition's "
                          f"probability may reach 0), got {rb.get('priority_eps')!r}")
    create = cfg.get("create") or {}
    learner_num = cfg["policy"]["learn"]["learner_num"]
    if (rb.get("priority") or learner_num > 1) and create:
        algo, source = _algorithm_and_source(create)
        if rb.get("priority") and not source.replay_buffer:
            raise ConfigError(f"config key 'policy.other.replay_buffer.priority' is True but {algo.name!r} learns from "
                              f"{algo.data_source} data, not from a replay buffer")
        # Each rank would hold only part of the rows (the consumer group splits chunks unevenly):
        # on-policy ranks, say, could wait forever for rows of a version that went elsewhere.
        if learner_num > 1 and not source.learner_groups:
            raise ConfigError(f"config key 'policy.learn.learner_num' = {learner_num}: {algo.name!r} learns from "
                              f"{algo.data_source} data, which one learner must see whole; use learner_num=1")
    from common import envs

    try:
        envs.check(EasyDict(cfg["env"]))
    except envs.EnvConfigError as e:
        raise ConfigError(str(e)) from None
    col = cfg["policy"].get("collect", {}).get("collector", {})
    for name in ("task_env_steps", "task_max_seconds"):
        if name in col and not col[name] > 0:
            raise ConfigError(f"config key 'policy.collect.collector.{name}' must be > 0, got {col[name]!r}")
    for name in ("env_idle_s", "step_timeout_s"):
        if col.get(name, 0) < 0:
            raise ConfigError(f"config key 'policy.collect.collector.{name}' must be >= 0, got {col[name]!r}")
    share = cfg["commander"]["eval_max_share"]
    if not 0 < share <= 1:
        raise ConfigError(f"config key 'commander.eval_max_share' must be in (0, 1], got {share!r}")
    cap = cfg["policy"].get("eval", {}).get("evaluator", {}).get("max_env_steps", 0)
    if cap < 0:
        raise ConfigError(f"config key 'policy.eval.evaluator.max_env_steps' must be >= 0 (0 = no cap), got {cap!r}")
    codec = col.get("compression", "auto")
    if codec not in ("auto", "none", "lz4", "zstd"):
        raise ConfigError(f"config key 'policy.collect.collector.compression' must be 'auto', 'none', 'lz4' or "
                          f"'zstd', got {codec!r}")
    if cfg["env"]["manager"]["type"] not in ("sync", "async"):
        raise ConfigError(f"config key 'env.manager.type' must be 'sync' or 'async', got {cfg['env']['manager']['type']!r}")
    _check_limiter(cfg)
    _check_algorithm_keys(cfg)


def _algorithm_and_source(create: dict) -> tuple[Any, Any]:
    """The algorithm ``create.policy.type`` names and the spec of its data source (common/sources.py)."""
    from common.sources import get_source

    algo = get_algorithm(create["policy"]["type"])
    return algo, get_source(algo.data_source)


def min_env_step_lead(send_policy_freq: int, ratio: float) -> int:
    """The least ``max_env_step_lead`` (env steps) with which the replay-ratio limiter cannot stall:
    the learner may be ``send_policy_freq`` - 1 train iterations past the version whose limit
    stopped the collectors, and at ``ratio`` train iterations per env step those need
    ceil((send_policy_freq - 1) / ratio) env steps, one of which the collectors' first step past
    the limit brings."""
    return math.ceil((send_policy_freq - 1) / ratio) - 1


def _check_limiter(cfg: dict) -> None:
    """The replay-ratio limiter must not stall: collectors stop ``max_env_step_lead`` env steps past
    the limit of the last published version, which may be ``send_policy_freq`` - 1 iterations
    behind the learner; were that lag worth more env steps than the lead, the learner would wait
    for data the collectors wait to be let send (workers/sources/replay.py)."""
    learn = cfg["policy"]["learn"]
    ratio, lead, freq = learn["train_iter_per_env_step"], learn["max_env_step_lead"], learn["learner"]["send_policy_freq"]
    if freq < 1:
        raise ConfigError(f"config key 'policy.learn.learner.send_policy_freq' must be >= 1, got {freq!r}")
    if is_deterministic(cfg) or ratio <= 0 or not cfg.get("create"):
        return  # deterministic mode publishes every iteration (apply_deterministic)
    if _algorithm_and_source(cfg["create"])[1].replay_buffer:
        need = min_env_step_lead(freq, ratio)
        if lead < need:
            raise ConfigError(f"config key 'policy.learn.max_env_step_lead' = {lead} is below {need}, the env steps "
                              f"{freq - 1} train iterations take at train_iter_per_env_step {ratio}: the learner "
                              f"publishes the collectors' limit every send_policy_freq = {freq} iterations, and in "
                              "between it and the collectors would wait for each other; raise the lead or lower "
                              "policy.learn.learner.send_policy_freq")


def _check_algorithm_keys(cfg: dict) -> None:
    """The algorithm's own ``policy.*`` keys (``Algorithm.check_config``); ConfigError names the key."""
    create = cfg.get("create") or {}
    if create:
        try:
            get_algorithm(create["policy"]["type"]).check_config(cfg["policy"])
        except ValueError as e:
            raise ConfigError(str(e)) from None


def load_config(path: str | Path) -> EasyDict:
    """Load and compile a config file (see module docstring).

    Raises:
        ConfigError: the file is missing, has a syntax error or raises, lacks ``main_config``,
            or fails :func:`compile_config`; the message names the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} " + ("is not a file" if path.exists() else "does not exist"))
    # A module next to the config file (or in the cwd) that registers a custom env is importable
    # from the file, whichever command runs it (a console script does not put the cwd on sys.path).
    make_importable(str(path.resolve().parent), os.getcwd())
    try:
        ns = runpy.run_path(str(path))
    except SyntaxError as e:
        raise ConfigError(f"config file {str(path)!r}: syntax error at line {e.lineno}: {e.msg}") from None
    except Exception as e:
        raise ConfigError(f"config file {str(path)!r} raised {type(e).__name__}: {e}") from None
    if "main_config" not in ns:
        raise ConfigError(f"config file {str(path)!r} defines no 'main_config'")
    main = copy.deepcopy(dict(ns["main_config"]))
    own = _top_level_imports(path)
    if own:
        env = main.setdefault("env", {})
        if isinstance(env, dict):
            env["import_names"] = list(dict.fromkeys([*env.get("import_names", []), *own]))
    try:
        return compile_config(main, ns.get("create_config"))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _top_level_imports(path: Path) -> list[str]:
    """Non-standard-library modules a config file imports at its top level (e.g. one that registers
    a custom env): workers never see the file, so they import these before building the env."""
    import ast
    import sys

    names: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] not in sys.stdlib_module_names]


# The spellings of true / false / null users type from JSON and YAML (YAML 1.2 core schema).
_WORDS = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False,
          "null": None, "Null": None, "NULL": None, "~": None, "None": None}


def parse_value(raw: str) -> Any:
    """The value of a ``--set KEY=VALUE``: a Python literal (``128``, ``1e-3``, ``[64, 64]``,
    ``'text'``), a JSON document (``[true, null]``, ``{"a": 1}``), or the JSON / YAML words for
    true, false and null in any of their spellings (``true``, ``True``, ``TRUE``, ``null``, ``~``);
    anything else is the string itself (``CartPole-v1``)."""
    import ast
    import json

    text = raw.strip()
    if text in _WORDS:
        return _WORDS[text]
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        pass
    try:
        return json.loads(text)
    except ValueError:
        return raw


def apply_overrides(cfg: EasyDict, overrides: list[str]) -> EasyDict:
    """Apply ``key.path=value`` overrides (values parsed by :func:`parse_value`).

    Raises:
        ConfigError: a malformed override, an unknown key or a wrong type.
    """
    patch: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. policy.learn.batch_size=128")
        dotted, raw = item.split("=", 1)
        value = parse_value(raw)
        node = patch
        parts = dotted.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    create = cfg.get("create")
    plain = {k: v for k, v in to_plain(cfg).items() if k != "create"}
    merged = merge_strict(plain, patch, "", _OPEN_KEYS)
    merged["create"] = to_plain(create) if create is not None else None
    apply_deterministic(merged)
    _validate(merged)
    return EasyDict(merged)


def to_plain(obj: Any) -> Any:
    """EasyDict (and tuples) -> plain dicts with str keys and lists, so configs travel as builtin
    types (RQ job payloads, final.pt, JSON)."""
    if isinstance(obj, dict):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj
