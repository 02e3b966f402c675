"""Every command documented in README.md and docs/*.md runs as documented (issue 20), so the docs
cannot drift from the CLI again.

The commands are read from the Markdown itself: the lines of fenced code blocks and the inline
code spans that start with ``rqrl``, ``python -m coordinator``, ``rq worker`` / ``rq info``,
``redis-cli``, ``tensorboard`` or ``python -m tests.``. Placeholders of the docs (``CONFIG``,
``RUN``, ``<run_name or folder>``, example run names, ``redis://head:6379/0``, ``$R``,
``<buffer_id>``) become the values of one real, tiny run trained first on a private Redis. Then:

* ``rqrl train`` / ``rqrl sweep``: run with ``--dry-run`` (every check a launch makes, nothing
  started);
* other ``rqrl`` commands of code blocks: run against that run's folder and Redis (``clean``
  last; ``--watch`` until its first screen); inline ones, which are synopses: parsed by
  ``rqrl``'s own parser (a bare ``rqrl X`` must name a subcommand);
* ``python -m coordinator``: parsed by its parser; ``rq worker`` / ``rq info``: by RQ's click
  commands; ``redis-cli``: run against the private Redis; ``tensorboard --logdir D``: D must
  hold exactly one TensorBoard run per run; ``python -m tests...``: every option it uses must be
  in its ``--help``.

Shell-only lines (``pip``, ``docker``, ``kubectl``, ``systemctl``, ``redis-server``) are left to
tests/unit/test_deploy.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO, run_rqrl, worker_env

pytestmark = [pytest.mark.redis_server, pytest.mark.slow, pytest.mark.server_agnostic]

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
STARTS = ("rqrl ", "python -m coordinator", "rq worker", "rq info", "redis-cli ", "tensorboard ", "python -m tests.")
EXAMPLE_RUN = re.compile(r"20261130T021500Z-s\d")


@dataclass
class Doc:
    where: str  # file:line
    text: str
    block: bool  # from a code block (an example to run), not an inline span (a synopsis)


def documented() -> list[Doc]:
    """The commands in the docs, in order (module docstring)."""
    found: list[Doc] = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"```[a-z]*\n(.*?)```", text, re.S):
            first = text[: m.start(1)].count("\n") + 1
            lines = m.group(1).replace("\\\n", " ").splitlines()
            for i, line in enumerate(lines):
                cmd = line.strip()
                if cmd.startswith(STARTS):
                    found.append(Doc(f"{path.name}:{first + i}", cmd, True))
        prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
        for m in re.finditer(r"`([^`]+)`", prose):
            cmd = " ".join(m.group(1).split())
            if cmd.startswith(STARTS) and not cmd.startswith("rq worker collector`"):
                found.append(Doc(f"{path.name}:{prose[: m.start()].count(chr(10)) + 1}", cmd, False))
    return found


def concrete(cmd: str, ctx: dict[str, str]) -> list[str]:
    """The command's argv with the docs' placeholders replaced by the run's values."""
    cmd = cmd.replace("<run_name or folder>", ctx["run"]).replace("$R", ctx["ns"])
    cmd = cmd.replace("<buffer_id>", ctx["buffer_id"]).replace("<policy_id>", ctx["policy_id"])
    cmd = re.sub(r"\[--set \.\.\.\]", "", cmd)
    cmd = cmd.replace("=...", "=200000").replace("[", "").replace("]", "")
    cmd = EXAMPLE_RUN.sub(ctx["run"], cmd)
    cmd = re.sub(r"redis://(head|host):6379/0", ctx["url"], cmd)
    argv = shlex.split(cmd, comments=True)
    out = []
    for i, tok in enumerate(argv):
        prev = argv[i - 1] if i else ""
        if tok == "CONFIG":
            tok = str(REPO / "deploy" / "configs" / "cartpole_dqn.py")
        elif tok.startswith("deploy/configs/"):
            tok = str(REPO / tok)
        elif tok == "RUN" and prev == "--resume":
            tok = ctx["run"]
        elif tok == "N" and prev.startswith("--"):
            tok = "2"
        out.append(tok)
    return out


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, redis_server):
    """One real run of the documented config (cartpole_dqn), stopped by a small budget (exit 2),
    in a fresh folder on the private Redis: the run the documented commands act on."""
    from common.connection import connect

    conn = connect(redis_server.url)
    conn.flushall()
    cwd = tmp_path_factory.mktemp("docs")
    res = run_rqrl("train", str(REPO / "deploy" / "configs" / "cartpole_dqn.py"), "--redis-url", redis_server.url,
                   "--collectors", "1", "--set", "env.stop_value=100000", "--set", "commander.max_train_iter=40",
                   "--set", "commander.eval_every_train_iter=20", "--set", "policy.learn.learner.hook.save_ckpt_after_iter=20",
                   "--set", "policy.learn.learner.hook.log_show_after_iter=20",
                   "--set", "policy.collect.collector.task_env_steps=200", cwd=cwd)
    assert res.returncode == 2, res.stdout + res.stderr[-3000:]
    run_dir = (cwd / "cartpole_dqn" / "latest").resolve()
    summary = json.loads((run_dir / "summary.json").read_text())
    ctx = {"run": run_dir.name, "ns": f"cartpole_dqn/{run_dir.name}", "url": redis_server.url,
           "buffer_id": summary["buffer_id"], "policy_id": summary["policy_id"]}
    return cwd, ctx


def _rqrl(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=240, env=worker_env(""))


def test_the_readme_key_table_names_the_fields_redis_holds(tiny_run, redis_server):
    """The key table's field lists are the fields a run writes (it said `policy_iter` where the
    buffer stream's field is `policy_version`). Runs before the walk below, whose `rqrl clean`
    deletes the run's keys."""
    from common import keys
    from common.connection import connect

    _, ctx = tiny_run
    conn = connect(redis_server.url)
    table = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| [^|]+ \| ([^|]+) \|$",
                                                            (REPO / "README.md").read_text(), re.M)}
    listed = re.search(r"\(([^)]*)\)", table["rqrl:{exp}:buffer:{buffer_id}:meta"]).group(1)
    names = [n.strip() for n in listed.split(",") if n.strip() != "..."]
    entry = conn.xrange(keys.buffer_meta(ctx["ns"], ctx["buffer_id"]), count=1)[0][1]
    assert set(names) <= {k.decode() for k in entry}, (names, sorted(entry))
    fields = re.findall(r"`([a-z_]+)(?::N)?`", table["rqrl:{exp}:policy:{policy_id}"])
    held = {k.decode().split(":")[0] for k in conn.hkeys(keys.policy(ctx["ns"], ctx["policy_id"]))}
    assert fields and set(fields) <= held, (fields, held)


def _options(doc_argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in doc_argv if a.startswith("--")]


def _only_options(rest: list[str]) -> bool:
    """A span like `rqrl train --name`, `rqrl eval --seed S` or `rq worker --burst`: options (each
    with at most one value), no positional argument: it names options, it is not a command line."""
    return all(a.startswith("-") or (i > 0 and rest[i - 1].startswith("-")) for i, a in enumerate(rest))


def test_every_documented_command_runs_as_documented(tiny_run):
    from click.exceptions import ClickException
    from rq.cli import main as rq_main

    from coordinator.__main__ import build_parser as coordinator_parser
    from coordinator.cli import build_parser

    cwd, ctx = tiny_run
    docs = documented()
    assert len(docs) > 60, "the docs' commands were not found: has the Markdown layout changed?"
    subparsers = build_parser()._subparsers._group_actions[0].choices
    atari = __import__("importlib.util").util.find_spec("ale_py") is not None
    problems: list[str] = []
    later: list[tuple[Doc, list[str]]] = []
    checked = {"dry-run": 0, "run": 0, "parsed": 0, "redis-cli": 0, "tensorboard": 0}

    def fail(doc: Doc, why: str) -> None:
        problems.append(f"{doc.where}: `{doc.text}`: {why}")

    def known(doc: Doc, opts: list[str], have: set[str], what: str) -> None:
        for opt in opts:
            if opt not in have:
                fail(doc, f"{opt} is not an option of {what}")
        checked["parsed"] += 1

    for doc in docs:
        argv = concrete(doc.text, ctx)
        # The fleet commands hand their arguments to python -m coordinator and rq worker: checked
        # as those are (the coordinator's parser, RQ's click command), never run here.
        if argv[:2] == ["rqrl", "coordinator"]:
            argv = ["python", "-m", "coordinator", *argv[2:]]
        elif argv[:2] == ["rqrl", "worker"] and len(argv) > 2:
            argv = ["rq", "worker", *argv[2:]]
        if argv[0] == "rqrl":
            sub = argv[1]
            if sub not in subparsers:
                fail(doc, f"no rqrl subcommand {sub!r}")
            elif not doc.block and (len(argv) == 2 or argv[1:] == ["config", "show"]):
                continue  # a mention of the command's name
            elif not doc.block and _only_options(argv[2:]):
                known(doc, _options(argv), set(subparsers[sub]._option_string_actions), f"rqrl {sub}")
            elif sub in ("train", "sweep"):
                if not atari and any("pong" in a or "breakout" in a for a in argv):
                    continue  # needs the atari extra
                res = _rqrl([*argv[1:], "--dry-run"], cwd)
                checked["dry-run"] += 1
                if res.returncode != 0 or "dry run:" not in res.stdout:
                    fail(doc, f"--dry-run exit {res.returncode}: {res.stderr.strip()[-500:]}")
            elif not doc.block:
                try:
                    build_parser().parse_args(argv[1:])
                    checked["parsed"] += 1
                except SystemExit:
                    fail(doc, "rqrl's parser refuses it")
            else:
                later.append((doc, argv))
        elif argv[:3] == ["python", "-m", "coordinator"]:
            parser = coordinator_parser()
            if _only_options(argv[3:]):
                known(doc, _options(argv), set(parser._option_string_actions), "python -m coordinator")
                continue
            try:
                parser.parse_args(argv[3:])
                checked["parsed"] += 1
            except SystemExit:
                fail(doc, "python -m coordinator's parser refuses it")
        elif argv[0] == "rq":
            command = rq_main.commands.get(argv[1]) if len(argv) > 1 else None
            if command is None:
                fail(doc, "no such rq command")
            elif _only_options(argv[2:]):
                known(doc, _options(argv), {o for p in command.params for o in p.opts}, f"rq {argv[1]}")
            else:
                try:
                    command.make_context(argv[1], argv[2:])
                    checked["parsed"] += 1
                except ClickException as e:
                    fail(doc, f"rq refuses it: {e}")
        elif argv[0] == "redis-cli":
            if not doc.block or shutil.which("redis-cli") is None:
                continue  # inline: a mention (`redis-cli ping`), not an example on the run
            res = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            checked["redis-cli"] += 1
            if res.returncode != 0 or "ERR" in res.stdout or not res.stdout.strip():
                fail(doc, f"redis-cli exit {res.returncode}: {res.stdout[-300:]} {res.stderr[-300:]}")
        elif argv[0] == "tensorboard":
            from tensorboard.backend.event_processing.io_wrapper import GetLogdirSubdirectories

            logdir = cwd / argv[argv.index("--logdir") + 1]
            found = list(GetLogdirSubdirectories(str(logdir)))
            checked["tensorboard"] += 1
            if len(found) != 1:
                fail(doc, f"TensorBoard finds {len(found)} runs in {logdir} for the 1 run: {found}")
        elif argv[:2] == ["python", "-m"] and argv[2].startswith("tests."):
            res = subprocess.run([sys.executable, "-m", argv[2], "--help"], cwd=REPO, capture_output=True,
                                 text=True, timeout=60, env=worker_env(""))
            if res.returncode != 0:
                fail(doc, f"{argv[2]} --help: exit {res.returncode}")
            known(doc, _options(argv), set(re.findall(r"--[a-z][a-z0-9-]*", res.stdout)), argv[2])
        else:
            fail(doc, "no check for this kind of command")
    # The examples that act on the run: `rqrl clean` last (it deletes the run's keys).
    for doc, argv in sorted(later, key=lambda item: item[1][1] == "clean"):
        if argv[1] in ("status", "clean") and "--redis-url" not in argv:
            argv = [*argv, "--redis-url", ctx["url"]]  # the docs' default Redis is the user's own
        if "--watch" in argv:
            p = subprocess.Popen([sys.executable, "-m", "coordinator.cli", *argv[1:]], cwd=cwd, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=worker_env(""))
            first = p.stdout.readline()
            p.send_signal(signal.SIGINT)
            code = p.wait(timeout=30)
            checked["run"] += 1
            if code != 0 or "QUEUE" not in first:
                fail(doc, f"--watch: exit {code}, first line {first!r}")
            continue
        res = _rqrl(argv[1:], cwd)
        checked["run"] += 1
        if res.returncode != 0:
            fail(doc, f"exit {res.returncode}: {res.stderr.strip()[-800:]}")
    assert not problems, "\n".join(problems)
    assert checked["dry-run"] >= 8 and checked["run"] >= 12 and checked["parsed"] >= 20, checked
    assert checked["redis-cli"] >= 6 and checked["tensorboard"] >= 2, checked
