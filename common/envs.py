"""How the config's ``env`` section becomes a gymnasium env: the base env plus wrappers.

Every process that builds an env (the collector's vector env, the learner's and the CLI's probe
of the spaces, ``rqrl eval``) goes through here, so they all see the same spaces.

    base env   gym.make(env.env_id, **kwargs)       kwargs = env.env_kwargs (+ the preset's)
    preset     env.preset = "atari", as SB3's AtariWrapper and CleanRL's ppo_atari (common/atari.py):
                 gymnasium's AtariPreprocessing   noop starts on a real reset, frame skip, max-pool,
                                                  resize, grey
              -> EpisodicLife [training only]     a lost life is terminal for the learner, the game
                                                  plays on; info["game_over"] marks the real end
              -> FireReset                        FIRE after each reset, games with a FIRE action
              -> ClipReward(-1, 1) [training only]
              -> FrameStackObservation
               The base env is built with frameskip=1 (the wrapper skips) and sticky actions
               (repeat_action_probability, 0.25 as ALE v5). Settings: ``env.atari``.
    wrappers   env.wrappers = [dict(type="module:Class", kwargs={...}, train_only=False), ...],
               applied in order after the preset (any gymnasium wrapper, or your own; train_only
               ones on training envs only, eval_only ones on eval envs and `rqrl eval` only), except
               wrappers with running statistics across episodes (NormalizeObservation,
               NormalizeReward): refused, since every collector, eval task and `rqrl eval`
               has envs of its own and the statistics would not travel with the policy.

MinAtar ids (``MinAtar/Breakout-v0``, ...; the ``minatar`` extra) work without an import of
the user's: gymnasium 1.x does not load MinAtar's plugin, so the first env id that starts with
``MinAtar/`` registers its games (:func:`register_minatar`). Their bool (10, 10, C) grids are
image channels (common/spaces.py). Ids starting with ``rqrl/`` are the two-player games of
common/games.py (the ``league`` extra), registered the same way.

``train`` is True for collector tasks that send training data, False for eval tasks and
``rqrl eval``: training-only wrappers are skipped there, so eval returns are true game scores.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

PRESETS = ("", "atari")
MINATAR_PREFIX = "MinAtar/"
GAMES_PREFIX = "rqrl/"

# Wrappers that keep running statistics across episodes (gymnasium's normalisers). Each collector,
# eval task and `rqrl eval` has envs of its own, so the statistics would differ between them and
# never reach final.pt: refused by name.
STATEFUL_WRAPPERS = ("NormalizeObservation", "NormalizeReward")


def _stateful_error(i: int, type_: str) -> "EnvConfigError":
    return EnvConfigError(
        f"config key 'env.wrappers[{i}].type': {type_!r} keeps running statistics across episodes, which rqrl "
        "cannot carry between collectors, eval tasks, final.pt and `rqrl eval` (each has envs of its own, so "
        "the policy would be evaluated on differently scaled inputs); normalise in the env itself with fixed "
        "statistics, or leave the wrapper out")


class EnvConfigError(ValueError):
    """A bad ``env`` section (preset, wrapper, kwargs) or a missing optional dependency (one line)."""


def check(env_cfg: Any) -> None:
    """Validate ``env.preset`` and ``env.wrappers`` without importing anything.

    Raises:
        EnvConfigError: naming the key at fault.
    """
    if env_cfg.get("preset", "") not in PRESETS:
        raise EnvConfigError(f"config key 'env.preset' must be one of {PRESETS}, got {env_cfg.get('preset')!r}")
    if env_cfg.get("preset") == "atari" and "frameskip" in dict(env_cfg.get("env_kwargs") or {}):
        raise EnvConfigError("config key 'env.env_kwargs.frameskip' cannot be set with env.preset='atari': the preset "
                             "builds the base env with frameskip=1 and skips frames itself (env.atari.frame_skip)")
    for i, w in enumerate(env_cfg.get("wrappers") or []):
        ok = (isinstance(w, dict) and isinstance(w.get("type"), str) and ":" in w["type"]
              and set(w) <= {"type", "kwargs", "train_only", "eval_only"} and isinstance(w.get("kwargs", {}), dict)
              and isinstance(w.get("train_only", False), bool) and isinstance(w.get("eval_only", False), bool)
              and not (w.get("train_only") and w.get("eval_only")))
        if not ok:
            raise EnvConfigError(f"config key 'env.wrappers[{i}]' must be dict(type='module:Class', kwargs={{...}}, "
                                 f"train_only=False, eval_only=False) with at most one of the two flags, got {w!r}")
        if w["type"].rpartition(":")[2] in STATEFUL_WRAPPERS:
            raise _stateful_error(i, w["type"])


def base_kwargs(env_cfg: Any) -> dict[str, Any]:
    """Keyword arguments of ``gym.make`` for the base env (``env.env_kwargs`` plus the preset's)."""
    kwargs = dict(env_cfg.get("env_kwargs") or {})
    if env_cfg.get("preset") == "atari":
        kwargs["frameskip"] = 1
        kwargs.setdefault("repeat_action_probability", float(env_cfg.atari.repeat_action_probability))
    return kwargs


def import_preset(env_cfg: Any) -> None:
    """Import what the preset's or the env id's envs need: ``ale_py`` registers ``ALE/...`` ids
    (``env.preset="atari"``); an id starting with ``MinAtar/`` registers MinAtar's games, one
    starting with ``rqrl/`` the two-player games (common/games.py).

    Raises:
        EnvConfigError: the optional dependency is not installed (names the extra to install).
    """
    if env_cfg.get("preset") == "atari":
        try:
            import ale_py
            import gymnasium as gym
        except ImportError as e:
            raise EnvConfigError(f"config key 'env.preset' is 'atari' but ale-py is not installed ({e}); "
                                 "pip install 'rqrl[atari]'") from None
        gym.register_envs(ale_py)
    if str(env_cfg.get("env_id", "")).startswith(MINATAR_PREFIX):
        register_minatar(env_cfg.env_id)
    if str(env_cfg.get("env_id", "")).startswith(GAMES_PREFIX):
        from common import games

        games.register()


def register_minatar(env_id: str) -> None:
    """Register MinAtar's gymnasium ids (``minatar.gym.register_envs``), once per process.

    Raises:
        EnvConfigError: minatar is not installed (names ``env_id`` and the extra).
    """
    import logging

    import gymnasium as gym

    if any(name.startswith(MINATAR_PREFIX) for name in gym.registry):
        return
    muted = logging.root.manager.disable
    # MinAtar logs at import that seaborn / matplotlib (for its own display) are missing: not ours to show.
    logging.disable(logging.WARNING)
    try:
        import minatar.gym
    except ImportError as e:
        raise EnvConfigError(f"config key 'env.env_id' is {env_id!r} but minatar is not installed ({e}); "
                             "pip install 'rqrl[minatar]'") from None
    finally:
        logging.disable(muted)
    minatar.gym.register_envs()


def wrappers(env_cfg: Any, train: bool) -> list[Callable[[Any], Any]]:
    """The wrapper functions for the base env, outermost last (module docstring).

    Raises:
        EnvConfigError: a wrapper type that cannot be imported (names ``env.wrappers[i]``).
    """
    from gymnasium import wrappers as gw

    out: list[Callable[[Any], Any]] = []
    if env_cfg.get("preset") == "atari":
        from common import atari

        a = env_cfg.atari
        # gymnasium's own terminal_on_life_loss would restart the whole game at every lost life.
        out.append(lambda e: gw.AtariPreprocessing(
            e, noop_max=int(a.noop_max), frame_skip=int(a.frame_skip), screen_size=int(a.screen_size),
            terminal_on_life_loss=False, grayscale_obs=bool(a.grayscale)))
        if a.terminal_on_life_loss and train:
            out.append(atari.EpisodicLife)
        if a.fire_reset:
            out.append(lambda e: atari.FireReset(e) if atari.has_fire(e) else e)
        if a.clip_rewards and train:
            out.append(lambda e: gw.ClipReward(e, -1.0, 1.0))
        if int(a.frame_stack) > 1:
            out.append(lambda e: gw.FrameStackObservation(e, int(a.frame_stack)))
    for i, w in enumerate(env_cfg.get("wrappers") or []):
        if (w.get("train_only", False) and not train) or (w.get("eval_only", False) and train):
            continue
        module, _, name = w["type"].partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise EnvConfigError(f"config key 'env.wrappers[{i}].type': cannot import {w['type']!r} "
                                 f"({type(e).__name__}: {e})") from None
        if isinstance(cls, type) and issubclass(cls, (gw.NormalizeObservation, gw.NormalizeReward)):
            raise _stateful_error(i, w["type"])  # a subclass or another name for one
        kw = dict(w.get("kwargs") or {})
        out.append(lambda e, cls=cls, kw=kw: cls(e, **kw))
    return out


def make(env_cfg: Any, train: bool, **extra: Any) -> Any:
    """One env: ``gym.make(env_id, **base_kwargs, **extra)`` wrapped for ``train`` or eval.

    Raises:
        EnvConfigError: see :func:`import_preset` / :func:`wrappers`.
        Exception: whatever gymnasium raises for an unknown id or bad kwargs (callers name the keys).
    """
    import gymnasium as gym

    import_preset(env_cfg)
    env = gym.make(env_cfg.env_id, **base_kwargs(env_cfg), **extra)
    for wrap in wrappers(env_cfg, train):
        env = wrap(env)
    return env


def max_episode_steps(env_cfg: Any) -> int | None:
    """Env steps after which the env itself ends an episode: ``env.env_kwargs.max_episode_steps``
    or the id's registered TimeLimit; for ``env.preset="atari"`` ALE's frame limit
    (``max_num_frames_per_episode``, 108,000 frames in v5) over ``env.atari.frame_skip``.
    None when nothing bounds an episode.

    Raises:
        EnvConfigError: see :func:`import_preset`.
        gymnasium.error.Error: an unknown env id.
    """
    import gymnasium as gym

    import_preset(env_cfg)
    kwargs = dict(env_cfg.get("env_kwargs") or {})
    spec = gym.spec(env_cfg.env_id)
    if kwargs.get("max_episode_steps"):
        return int(kwargs["max_episode_steps"])
    if env_cfg.get("preset") == "atari":
        frames = kwargs.get("max_num_frames_per_episode", spec.kwargs.get("max_num_frames_per_episode"))
        if frames:
            return -(-int(frames) // int(env_cfg.atari.frame_skip))
    return int(spec.max_episode_steps) if spec.max_episode_steps else None


def cut_warnings(cfg: Any) -> tuple[list[str], list[str]]:
    """What in ``cfg`` would end episodes before the env does (``rqrl config show`` prints these).

    Returns:
        ``(warnings, notes)``: warnings apply to every run of the config (an eval's env-step cap
        below its episodes' length); notes only on a stock forking ``rq worker collector``, which
        rebuilds envs at every task (workers/live_envs.py), so tasks shorter than an episode cut it.
    """
    longest = max_episode_steps(cfg.env)
    warnings: list[str] = []
    notes: list[str] = []
    cap = int(cfg.policy.eval.evaluator.max_env_steps)
    episodes = max(int(cfg.env.n_evaluator_episode), int(cfg.commander.confirm_eval_episodes))
    if cap and (longest is None or cap < episodes * longest):
        need = "unbounded episodes" if longest is None else f"{episodes} episodes of up to {longest:,} env steps"
        warnings.append(f"config key 'policy.eval.evaluator.max_env_steps' = {cap:,} can cut evals short: an eval plays "
                        f"{need} (env.n_evaluator_episode, commander.confirm_eval_episodes)")
    per_env = int(cfg.policy.collect.collector.task_env_steps) // int(cfg.env.collector_env_num)
    if longest is None or per_env < longest:
        notes.append(f"on a stock forking `rq worker collector` (no env cache) every task ends its episodes after "
                     f"{per_env:,} env steps per env (policy.collect.collector.task_env_steps / env.collector_env_num)"
                     + ("" if longest is None else f", shorter than the env's {longest:,}")
                     + "; `-w workers.worker.CollectorWorker` (what rqrl train runs) keeps envs between tasks")
    return warnings, notes
