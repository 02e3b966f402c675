"""Static checks of the deployment recipes under deploy/ (docker, k8s, systemd, redis).

No Docker engine, Kubernetes cluster or systemd instance is needed: files are parsed and
cross-checked (queues, worker class, config overrides, secrets, volumes). Where the tools exist
the real validators run too: ``docker compose config`` (or v1 ``docker-compose config``),
``kubernetes-validate --strict`` and ``systemd-analyze verify``; otherwise those tests skip.
The Redis ACL and redis.conf are exercised against real servers in
tests/integration/test_redis_acl.py.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from common.config import apply_overrides, load_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCKER = DEPLOY / "docker"
K8S = DEPLOY / "k8s"
SYSTEMD = DEPLOY / "systemd"
REDIS_DIR = DEPLOY / "redis"
DOC = REPO / "docs" / "deploy.md"

# Collectors keep envs between tasks in-process; the learner runs in a forked work-horse.
WORKER_CLASS = {"collector": "workers.worker.CollectorWorker", "learner": "workers.worker.PreloadWorker"}
CONFIG = REPO / "deploy" / "configs" / "cartpole_dqn.py"
CORE_SERVICES = {"redis", "coordinator", "collector", "learner"}


# ------------------------------------------------------------------------------------ helpers


def _env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blanks skipped), as compose and systemd read them."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    return out


_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])((?:[^{}]|\{[^{}]*\})*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def compose_interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution: $$, ${V}, ${V:-d}, ${V-d}, ${V:?err}, ${V?err}, $V.

    Raises:
        KeyError: a required variable (``:?``) is unset or empty.
    """

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3) or ""
        val = env.get(name)
        if op in (":-", "-"):
            return val if (val if op == ":-" else val is not None) else arg
        if op in (":?", "?"):
            if val is None or (op == ":?" and val == ""):
                raise KeyError(f"{name}: {arg}")
            return val
        return val or ""

    return _VAR.sub(sub, text)


def compose(*files: str, env: dict[str, str] | None = None) -> dict:
    """The compose model after interpolation with ``env`` (default: .env.example), files merged
    the way compose merges overrides for the keys used here (services: deep merge)."""
    env = dict(_env_file(DOCKER / ".env.example") if env is None else env)
    merged: dict = {}
    for name in files or ("docker-compose.yml",):
        doc = yaml.safe_load(compose_interpolate((DOCKER / name).read_text(), env))
        merged = _deep_merge(merged, doc)
    return merged


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _k8s_docs() -> dict[str, list[dict]]:
    return {p.name: [d for d in yaml.safe_load_all(p.read_text()) if d] for p in sorted(K8S.glob("*.yaml"))}


def _k8s_objects() -> dict[tuple[str, str], dict]:
    out = {}
    for name, docs in _k8s_docs().items():
        if name == "kustomization.yaml":
            continue
        for d in docs:
            out[(d["kind"], d["metadata"]["name"])] = d
    return out


def _unit(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False, delimiters=("=",), comment_prefixes=("#", ";"))
    cp.optionxform = str  # keys are case-sensitive in systemd
    cp.read_string(path.read_text(), source=str(path))
    return cp


def _check_coordinator_argv(argv: list[str]):
    """``argv`` (after ``python -m coordinator``) parses and its config + overrides are valid;
    returns the compiled config."""
    from coordinator.__main__ import main  # noqa: F401  (the module exists)

    assert argv, "no config argument"
    config, rest = argv[0], argv[1:]
    overrides, i = [], 0
    while i < len(rest):
        if rest[i] == "--set":
            overrides.append(rest[i + 1])
            i += 2
        elif rest[i].startswith("--set="):
            overrides.append(rest[i][len("--set="):])
            i += 1
        elif rest[i] in ("--seed", "--out-dir", "--redis-url"):
            i += 2
        elif rest[i] == "--fresh":
            i += 1
        else:
            raise AssertionError(f"unexpected coordinator argument {rest[i]!r} in {argv}")
    assert not any(a.startswith("--redis-url") for a in argv), "pass the URL through RQRL_REDIS_URL, not argv"
    cfg = apply_overrides(load_config(config), overrides) if overrides else load_config(config)
    assert cfg.exp_name
    return cfg


def _check_follows_workers(cfg, collector_workers: int) -> None:
    """The one task-space rule (README, docs/deploy.md, docs/architecture.md): collector tasks
    follow the live collector workers, one kept free for evals. A recipe sets no cap (workers added
    later would idle) and starts at least two collector workers (one trains, one evaluates)."""
    assert cfg.commander.collector_task_space is None, "a fixed collector_task_space idles workers added later"
    assert cfg.commander.eval_task_space == 1
    assert collector_workers >= 2, "one collector worker trains, one is kept free for evals"


def _image_config_path(path: str) -> str:
    """Map a config path inside the image / host install to the repo's copy."""
    for prefix in ("/opt/rqrl/src/", "/opt/rqrl/"):
        if path.startswith(prefix):
            return str(REPO / path[len(prefix):])
    return path


# ------------------------------------------------------------------------------------ all YAML


def test_every_yaml_file_parses():
    files = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml"))
    assert len(files) >= 12, files
    for p in files:
        docs = [d for d in yaml.safe_load_all(p.read_text()) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), p


# ------------------------------------------------------------------------------------ docker


def test_compose_services():
    c = compose()
    services = c["services"]
    assert CORE_SERVICES <= set(services)
    for name, s in services.items():
        assert "container_name" not in s, f"{name}: container_name prevents --scale"
    # redis: AOF config, named volume at /data, healthcheck with redis-cli ping, password required.
    r = services["redis"]
    assert r["image"].startswith("redis:")
    assert "--requirepass" in r["command"]
    conf_mount = next(v for v in r["volumes"] if v.endswith(":/usr/local/etc/redis/redis.conf:ro"))
    assert (DOCKER / conf_mount.split(":")[0]).resolve() == REDIS_DIR / "redis.conf"
    assert "/usr/local/etc/redis/redis.conf" in r["command"]
    data = [v for v in r["volumes"] if v.split(":")[1] == "/data"]
    assert data and data[0].split(":")[0] in c["volumes"], "redis /data must be a named volume"
    hc = " ".join(r["healthcheck"]["test"])
    assert "redis-cli" in hc and "ping" in hc
    # coordinator: waits for a healthy redis, no restart of a finished run, output volume.
    co = services["coordinator"]
    assert co["depends_on"]["redis"]["condition"] == "service_healthy"
    assert co["restart"] == "no"
    assert co["stop_grace_period"] == "30s", "the coordinator needs ~10 s to stop a run on SIGTERM"
    assert any(v.endswith(":/runs") for v in co["volumes"])
    # workers: the right queues and the preload worker class.
    for name, queue in (("collector", "collector"), ("learner", "learner")):
        s = services[name]
        assert s["command"] == ["rq", "worker", queue, "-w", WORKER_CLASS[queue]], s["command"]
        assert s["environment"]["RQ_REDIS_URL"].startswith("redis://")
        assert s["depends_on"]["redis"]["condition"] == "service_healthy"
    assert any(v.endswith(":/runs") for v in services["learner"]["volumes"])
    assert int(services["collector"]["deploy"]["replicas"]) == int(_env_file(DOCKER / ".env.example")["RQRL_COLLECTORS"])
    # The images are built from the repo root with the Dockerfile here.
    for name in ("coordinator", "collector", "learner"):
        b = services[name]["build"]
        assert (DOCKER / b["context"]).resolve() == REPO
        assert (REPO / b["dockerfile"]).resolve() == DOCKER / "Dockerfile"


def _sentinel_settings(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def test_shipped_sentinel_conf():
    """deploy/redis/sentinel.conf: quorum 2 of three, the two placeholders the recipes replace,
    a down-after well inside rqrl's ~15 s of retries. tests/integration/test_sentinel.py runs it."""
    lines = _sentinel_settings((REDIS_DIR / "sentinel.conf").read_text())
    assert "sentinel monitor mymaster REDIS_PRIMARY_HOST 6379 2" in lines
    assert "sentinel auth-pass mymaster CHANGE_ME_REDIS_PASSWORD" in lines
    down = next(int(ln.split()[-1]) for ln in lines if ln.startswith("sentinel down-after-milliseconds mymaster"))
    assert 1000 <= down <= 10_000


def test_compose_sentinel_override():
    from common.connection import RQConnection, parse_sentinel_url

    c = compose("docker-compose.yml", "docker-compose.sentinel.yml")
    services = c["services"]
    assert {"redis-replica", "sentinel1", "sentinel2", "sentinel3"} <= set(services)
    replica = services["redis-replica"]
    i = replica["command"].index("--replicaof")
    assert replica["command"][i + 1:i + 3] == ["redis", "6379"]
    for node in (services["redis"], replica):  # either may become a replica of the other
        assert "--masterauth" in node["command"] and "--requirepass" in node["command"]
    assert any(v.split(":")[0] in c["volumes"] and v.split(":")[1] == "/data" for v in replica["volumes"])
    for name in ("sentinel1", "sentinel2", "sentinel3"):
        s = services[name]
        mount = next(v for v in s["volumes"] if v.endswith(":ro"))
        assert (DOCKER / mount.split(":")[0]).resolve() == REDIS_DIR / "sentinel.conf"
        script = s["command"][2]
        assert "--sentinel" in script and "s/REDIS_PRIMARY_HOST/redis/" in script and "CHANGE_ME_REDIS_PASSWORD" in script
        assert s["depends_on"]["redis"]["condition"] == "service_healthy"
    for name in ("coordinator", "collector", "learner"):
        env = services[name]["environment"]
        for var in ("RQRL_REDIS_URL", "RQ_REDIS_URL"):
            sentinels, service, kwargs, _ = parse_sentinel_url(env[var])
            assert sentinels == [(f"sentinel{i}", 26379) for i in (1, 2, 3)] and service == "mymaster"
            assert kwargs["password"] == _env_file(DOCKER / ".env.example")["REDIS_PASSWORD"]
        module, _, cls = env["RQ_CONNECTION_CLASS"].rpartition(".")
        assert getattr(__import__(module, fromlist=[cls]), cls) is RQConnection
        assert services[name]["depends_on"]["sentinel1"]["condition"] == "service_healthy"


K8S_SENTINEL = K8S / "sentinel"


def _smp(base: dict, patch: dict) -> dict:
    """Kubernetes' strategic merge for what the patches here use: maps merge, lists of named
    items (containers, env) merge by name, other lists are replaced."""
    out = dict(base)
    for k, v in patch.items():
        old = out.get(k)
        if isinstance(v, dict) and isinstance(old, dict):
            out[k] = _smp(old, v)
        elif isinstance(v, list) and isinstance(old, list) and v and all(isinstance(x, dict) and "name" in x for x in v):
            merged = {x["name"]: x for x in old}
            for x in v:
                merged[x["name"]] = _smp(merged.get(x["name"], {}), x)
            out[k] = list(merged.values())
        else:
            out[k] = v
    return out


def _overlay_objects(folder: Path) -> dict[tuple[str, str], dict]:
    """The objects of the kustomize overlay in ``folder`` over deploy/k8s: its resources added, its
    patches applied (each must patch an object of the base, and every file is listed once)."""
    docs = {p.name: yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))}
    kust = docs.pop("kustomization.yaml")
    assert kust["namespace"] == "rqrl" and kust["resources"][0] == "../"
    assert sorted(kust["resources"][1:] + [p["path"] for p in kust["patches"]]) == sorted(docs)
    base = _k8s_objects()
    objs = dict(base)
    for p in kust["patches"]:
        patch = docs[p["path"]]
        key = (patch["kind"], patch["metadata"]["name"])
        assert key in base, f"{p['path']} patches nothing in deploy/k8s"
        objs[key] = _smp(base[key], patch)
    for name in kust["resources"][1:]:
        objs[(docs[name]["kind"], docs[name]["metadata"]["name"])] = docs[name]
    return objs


def test_k8s_sentinel_overlay():
    objs = _overlay_objects(K8S_SENTINEL)
    redis_sts, sentinel = objs[("StatefulSet", "redis")], objs[("StatefulSet", "sentinel")]
    assert redis_sts["spec"]["replicas"] == 2 and sentinel["spec"]["replicas"] == 3
    for sts, svc in ((redis_sts, "redis-nodes"), (sentinel, "sentinel")):
        service = objs[("Service", svc)]
        assert sts["spec"]["serviceName"] == svc and service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    script = _container(redis_sts, "redis")["args"][0]
    assert "--masterauth" in script and "--replicaof $primary 6379" in script and "redis-nodes" in script
    cm = objs[("ConfigMap", "sentinel-config")]
    assert cm["data"]["sentinel.conf"] == (REDIS_DIR / "sentinel.conf").read_text(), "keep in sync"
    sent = _container(sentinel, "sentinel")
    assert "--sentinel" in sent["args"][0] and "s/REDIS_PRIMARY_HOST/redis-0.redis-nodes" in sent["args"][0]
    assert sent["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "rqrl-redis", "key": "redis-password"}
    for dep, name in (("rqrl-collector", "collector"), ("rqrl-learner", "learner")):
        env = {e["name"]: e for e in _container(objs[("Deployment", dep)], name)["env"]}
        assert env["RQ_CONNECTION_CLASS"]["value"] == "common.connection.RQConnection" and "RQ_REDIS_URL" in env
    # The URL form the kustomization's comment gives parses to the three sentinels.
    from common.connection import parse_sentinel_url

    url = re.search(r'redis-url="(redis\+sentinel://[^"]+)"', (K8S_SENTINEL / "kustomization.yaml").read_text()).group(1)
    sentinels, service, _, _ = parse_sentinel_url(url.replace("$PW", "pw"))
    assert sentinels == [(f"sentinel-{i}.sentinel", 26379) for i in range(3)] and service == "mymaster"
    kv = pytest.importorskip("kubernetes_validate")
    for key in [("StatefulSet", "redis"), ("StatefulSet", "sentinel"), ("Service", "redis-nodes"),
                ("Service", "sentinel"), ("ConfigMap", "sentinel-config"), ("Deployment", "rqrl-collector"),
                ("Deployment", "rqrl-learner")]:
        kv.validate(objs[key], "1.30.0", strict=True)


def test_compose_shards_override():
    """docker-compose.shards.yml: two step-data Redis servers without persistence, and their URLs
    (parsed as rqrl parses them) on the coordinator and both workers, which wait for them."""
    from common.data_shards import parse_urls

    c = compose("docker-compose.yml", "docker-compose.shards.yml")
    services = c["services"]
    for shard in ("redis-data0", "redis-data1"):
        cmd = services[shard]["command"]
        assert "--requirepass" in cmd and cmd[cmd.index("--maxmemory-policy") + 1] == "noeviction"
        assert cmd[cmd.index("--save") + 1] == "" and cmd[cmd.index("--appendonly") + 1] == "no"
        assert "ping" in " ".join(services[shard]["healthcheck"]["test"])
    password = _env_file(DOCKER / ".env.example")["REDIS_PASSWORD"]
    for name in ("coordinator", "collector", "learner"):
        env = services[name]["environment"]
        urls = parse_urls(env["RQRL_DATA_REDIS_URL"])
        assert urls == [f"redis://:{password}@redis-data{i}:6379/0" for i in range(2)]
        assert env["RQRL_REDIS_URL"].endswith("@redis:6379/0"), "the control Redis stays the base's"
        for dep in ("redis", "redis-data0", "redis-data1"):
            assert services[name]["depends_on"][dep]["condition"] == "service_healthy"


K8S_SHARDS = K8S / "shards"


def test_k8s_shards_overlay():
    from common.data_shards import parse_urls

    objs = _overlay_objects(K8S_SHARDS)
    sts, svc = objs[("StatefulSet", "redis-data")], objs[("Service", "redis-data")]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "redis-data"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    args = _container(sts, "redis")["args"]
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction" and args[args.index("--save") + 1] == ""
    for kind, name, cont in (("Job", "rqrl-coordinator", "coordinator"), ("Deployment", "rqrl-collector", "collector"),
                             ("Deployment", "rqrl-learner", "learner")):
        env = {e["name"]: e for e in _container(objs[(kind, name)], cont)["env"]}
        assert env["RQRL_DATA_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "rqrl-redis", "key": "data-redis-url"}
        assert "RQRL_REDIS_URL" in env, "the base's control Redis URL is kept"
    # The URL list the kustomization's comment gives names each pod of the StatefulSet once.
    text = (K8S_SHARDS / "kustomization.yaml").read_text()
    urls = parse_urls(re.search(r'data-redis-url="([^"]+)"', text).group(1).replace("$PW", "pw"))
    assert urls == [f"redis://:pw@redis-data-{i}.redis-data:6379/0" for i in range(2)]
    kv = pytest.importorskip("kubernetes_validate")
    for key in [("StatefulSet", "redis-data"), ("Service", "redis-data"), ("Job", "rqrl-coordinator"),
                ("Deployment", "rqrl-collector"), ("Deployment", "rqrl-learner")]:
        kv.validate(objs[key], "1.30.0", strict=True)


def test_compose_dashboard_is_optional_and_installs_six():
    d = compose()["services"]["rq-dashboard"]
    assert d["profiles"] == ["dashboard"]
    assert d["command"][0] == "rq-dashboard"
    dockerfile = (DOCKER / d["build"]["context"] / d["build"]["dockerfile"]).read_text()
    install = next(line for line in dockerfile.splitlines() if line.startswith("RUN pip install"))
    assert "rq-dashboard" in install and re.search(r"\bsix\b", install), "rq-dashboard needs six beside it"
    assert re.search(r"^USER (?!root)", dockerfile, re.M)
    assert d["environment"]["RQ_DASHBOARD_REDIS_URL"].startswith("redis://")
    assert all(p.startswith("127.0.0.1:") for p in d["ports"]), "publish the dashboard on loopback only"


def test_compose_learner_gpu_reservation():
    base = compose()["services"]["learner"]
    assert "deploy" not in base or "resources" not in base.get("deploy", {}), "the default learner must run without a GPU"
    gpu = compose("docker-compose.yml", "docker-compose.gpu.yml")
    learner = gpu["services"]["learner"]
    devices = learner["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d.get("driver") == "nvidia" for d in devices)
    assert "cu" in learner["build"]["args"]["TORCH_INDEX_URL"]  # a CUDA torch build
    assert learner["command"] == ["rq", "worker", "learner", "-w", WORKER_CLASS["learner"]]
    assert gpu["services"]["coordinator"]["environment"]["RQRL_CUDA"] == "True"


def test_compose_requires_the_password():
    env = _env_file(DOCKER / ".env.example")
    env.pop("REDIS_PASSWORD")
    with pytest.raises(KeyError, match="REDIS_PASSWORD"):
        compose(env=env)
    c = compose(env=dict(env, REDIS_PASSWORD="pw123"))
    assert c["services"]["collector"]["environment"]["RQ_REDIS_URL"] == "redis://:pw123@redis:6379/0"
    assert c["services"]["coordinator"]["environment"]["RQRL_REDIS_URL"] == "redis://:pw123@redis:6379/0"


@pytest.mark.parametrize("files", [("docker-compose.yml",), ("docker-compose.yml", "docker-compose.gpu.yml")],
                         ids=["cpu", "gpu"])
def test_compose_coordinator_command_runs_a_valid_config(files, tmp_path):
    """Run the coordinator's `sh -c` command with a stand-in `python` that records its argv."""
    co = compose(*files)["services"]["coordinator"]
    assert co["command"][:2] == ["sh", "-c"]
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "python").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (fake / "python").chmod(0o755)
    env = {k: str(v) for k, v in co["environment"].items()}
    env["RQRL_CONFIG"] = _image_config_path(env["RQRL_CONFIG"])
    env["RQRL_COORDINATOR_ARGS"] = "--seed 3 --set commander.max_wall_seconds=0"
    env["PATH"] = f"{fake}{os.pathsep}{os.environ['PATH']}"
    out = subprocess.run(["sh", "-c", co["command"][2]], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    argv = json.loads(out.stdout)
    assert argv[:2] == ["-m", "coordinator"]
    cuda = "True" if "docker-compose.gpu.yml" in files else "False"
    assert f"policy.cuda={cuda}" in argv
    assert argv[-4:] == ["--seed", "3", "--set", "commander.max_wall_seconds=0"]
    cfg = _check_coordinator_argv(argv[2:])
    _check_follows_workers(cfg, int(_env_file(DOCKER / ".env.example")["RQRL_COLLECTORS"]))


def _compose_cli() -> list[str] | None:
    if shutil.which("docker"):
        try:
            if subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30).returncode == 0:
                return ["docker", "compose"]
        except (OSError, subprocess.TimeoutExpired):
            pass
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.mark.parametrize("files", [("docker-compose.yml",), ("docker-compose.yml", "docker-compose.gpu.yml")],
                         ids=["cpu", "gpu"])
def test_docker_compose_config(files, tmp_path):
    """`docker compose config` (or v1 `docker-compose config`) accepts the files."""
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    args = [*cli, "--project-directory", str(DOCKER), "--env-file", str(DOCKER / ".env.example")]
    for f in files:
        args += ["-f", str(DOCKER / f)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "RQRL_", "COMPOSE_", "TORCH_"))}
    res = subprocess.run([*args, "--profile", "dashboard", "config"], capture_output=True, text=True, timeout=120,
                         env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    model = yaml.safe_load(res.stdout)
    assert CORE_SERVICES | {"rq-dashboard"} <= set(model["services"])
    # Without a password compose refuses to start anything.
    empty = tmp_path / "empty.env"
    empty.write_text("")
    bare = [a if a != str(DOCKER / ".env.example") else str(empty) for a in args]
    res = subprocess.run([*bare, "config"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode != 0 and "REDIS_PASSWORD" in res.stderr


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = (DOCKER / "Dockerfile").read_text()
    lines, buf = [], ""
    for raw in text.splitlines():
        if not buf and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if buf and raw.lstrip().startswith("#"):
            continue
        buf += raw.rstrip()[:-1] + " " if raw.rstrip().endswith("\\") else raw
        if not raw.rstrip().endswith("\\"):
            lines.append(buf)
            buf = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line.strip() else "") for line in lines]


def test_dockerfile():
    ins = _dockerfile_instructions()
    assert ins[0] == ("FROM", "python:3.11-slim")
    runs = [i for i, (op, arg) in enumerate(ins) if op == "RUN"]
    torch_run = next(i for i in runs if "pip install" in ins[i][1] and "torch==" in ins[i][1])
    # The package itself, with the optional extras of --build-arg EXTRAS (none by default).
    pkg_run = next(i for i in runs if re.search(r'pip install (--\S+ )*"?\.(\$\{EXTRAS:\+\[\$EXTRAS\]\})?"?(\s|$)',
                                                ins[i][1]))
    assert torch_run < pkg_run, "torch must be installed before the package (pyproject's range then keeps it)"
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for op, a in ins if op == "ARG" and "=" in a}
    assert args["TORCH_VERSION"] == "2.13.0"
    assert args["TORCH_INDEX_URL"].endswith("/cpu")
    assert args["EXTRAS"] == ""
    # Non-root user for everything after the installs, working in the /runs volume.
    users = [(i, a.strip()) for i, (op, a) in enumerate(ins) if op == "USER"]
    assert users and users[-1][0] > pkg_run and users[-1][1] not in ("root", "0")
    assert ("WORKDIR", "/runs") in ins and any(op == "VOLUME" and "/runs" in a for op, a in ins)
    # Every COPY source exists, and every package pyproject installs is copied.
    copied = []
    for op, a in ins:
        if op == "COPY":
            parts = [p for p in a.split() if not p.startswith("--")]
            copied += parts[:-1]
    for src in copied:
        assert (REPO / src).exists(), f"COPY {src}: not in the repo"
    import tomllib

    py = tomllib.loads((REPO / "pyproject.toml").read_text())
    for pattern in py["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pattern.rstrip("*") in copied, f"package {pattern} is not copied into the image"
    assert py["project"]["readme"] in copied
    # No secret or URL baked in.
    for op, a in ins:
        if op in ("ENV", "ARG"):
            assert "redis://" not in a and "PASSWORD" not in a.upper(), a
    cmd = next(a for op, a in ins if op == "CMD")
    assert WORKER_CLASS["collector"] in cmd


def test_dockerignore_keeps_what_the_dockerfile_copies():
    rules = [r.strip() for r in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
             if r.strip() and not r.startswith("#")]
    assert rules[0] == "**"
    kept = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    assert {"pyproject.toml", "README.md", "common", "coordinator", "workers", "deploy/configs"} <= kept


def test_env_file_is_ignored_and_example_has_placeholders():
    assert ".env" in (DOCKER / ".gitignore").read_text().split()
    env = _env_file(DOCKER / ".env.example")
    assert env["REDIS_PASSWORD"].startswith("CHANGE_ME")


# ------------------------------------------------------------------------------------ kubernetes


def test_k8s_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = kust["resources"]
    on_disk = sorted(p.name for p in K8S.glob("*.yaml") if p.name not in ("kustomization.yaml", "secret.example.yaml"))
    assert sorted(listed) == on_disk
    assert "secret.example.yaml" not in listed, "the placeholder Secret must not be applied by -k"
    assert kust["namespace"] == "rqrl"
    for name, docs in _k8s_docs().items():
        if name != "kustomization.yaml":
            assert len(docs) == 1, f"{name}: one resource per file"
            assert docs[0]["metadata"].get("namespace", "rqrl") == "rqrl"


def test_k8s_kinds():
    kinds = sorted(kind for kind, _ in _k8s_objects())
    assert kinds == sorted(["Namespace", "Secret", "ConfigMap", "ConfigMap", "Service", "StatefulSet",
                            "PersistentVolumeClaim", "Job", "Deployment", "Deployment"])


def _container(obj: dict, name: str | None = None) -> dict:
    cs = obj["spec"]["template"]["spec"]["containers"]
    return cs[0] if name is None else next(c for c in cs if c["name"] == name)


def test_k8s_workers():
    objs = _k8s_objects()
    collector, learner = objs[("Deployment", "rqrl-collector")], objs[("Deployment", "rqrl-learner")]
    assert collector["spec"]["replicas"] >= 1
    for dep, queue in ((collector, "collector"), (learner, "learner")):
        c = _container(dep)
        assert c["command"] == ["rq", "worker", queue, "-w", WORKER_CLASS[queue]]
        env = {e["name"]: e for e in c["env"]}
        assert env["RQ_REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "redis-url"
        assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    gpu = _container(learner)["resources"]["limits"]["nvidia.com/gpu"]
    assert int(gpu) == 1
    assert _container(learner)["image"] == "rqrl:gpu" and _container(collector)["image"] == "rqrl:cpu"
    assert learner["spec"]["replicas"] == 1 and learner["spec"]["strategy"]["type"] == "Recreate"


def test_k8s_coordinator_job():
    objs = _k8s_objects()
    job = objs[("Job", "rqrl-coordinator")]
    spec = job["spec"]["template"]["spec"]
    assert spec["restartPolicy"] == "Never"
    rule = job["spec"]["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [2, 130], \
        "a give-up (2) or a SIGTERM stop (130) ended the run: a retry would start a new one"
    c = _container(job, "coordinator")
    assert c["command"][:3] == ["python", "-m", "coordinator"]
    env = {e["name"]: e for e in c["env"]}
    assert env["RQRL_REDIS_URL"]["valueFrom"]["secretKeyRef"]["key"] == "redis-url"
    # The config comes from the ConfigMap, which is deploy/configs/cartpole_dqn.py verbatim.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    cfg_path = Path(c["command"][3])
    cm_vol = next(n for n, p in mounts.items() if cfg_path.parent == Path(p))
    cm = objs[("ConfigMap", vols[cm_vol]["configMap"]["name"])]
    assert cm["data"][cfg_path.name] == CONFIG.read_text()
    assert mounts["runs"] == c["workingDir"] == "/runs"
    assert ("PersistentVolumeClaim", vols["runs"]["persistentVolumeClaim"]["claimName"]) in objs
    # Overrides are valid, the task space follows the collector Deployment, cuda matches the GPU learner.
    argv = [str(CONFIG)] + c["command"][4:]
    cfg = _check_coordinator_argv(argv)
    _check_follows_workers(cfg, objs[("Deployment", "rqrl-collector")]["spec"]["replicas"])
    assert "policy.cuda=True" in argv


def test_k8s_redis():
    objs = _k8s_objects()
    sts = objs[("StatefulSet", "redis")]
    c = _container(sts, "redis")
    assert c["args"][:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"]
    assert "--requirepass" in c["args"] and "$(REDIS_PASSWORD)" in c["args"]
    cm = objs[("ConfigMap", "redis-config")]
    assert cm["data"]["redis.conf"] == (REDIS_DIR / "redis.conf").read_text(), "keep in sync with deploy/redis/redis.conf"
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/usr/local/etc/redis"] == "config"
    vct = sts["spec"]["volumeClaimTemplates"][0]
    assert mounts["/data"] == vct["metadata"]["name"] and vct["spec"]["resources"]["requests"]["storage"]
    svc = objs[("Service", "redis")]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["port"] == 6379
    assert sts["spec"]["serviceName"] == "redis"


def test_k8s_references_resolve():
    """Every Secret key, ConfigMap and PVC a pod refers to is defined (the Secret by the example)."""
    objs = _k8s_objects()
    secret = objs[("Secret", "rqrl-redis")]
    assert secret["stringData"]["redis-password"].startswith("CHANGE_ME")
    assert "CHANGE_ME" in secret["stringData"]["redis-url"]
    for (kind, name), obj in objs.items():
        if kind not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = obj["spec"]["template"]["spec"]
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "rqrl-redis" and ref["key"] in secret["stringData"], (name, ref)
        for v in spec.get("volumes", []):
            if "configMap" in v:
                assert ("ConfigMap", v["configMap"]["name"]) in objs, (name, v)
            if "persistentVolumeClaim" in v:
                assert ("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]) in objs, (name, v)


def test_k8s_manifests_validate_against_the_schema():
    kv = pytest.importorskip("kubernetes_validate")
    for (kind, name), obj in _k8s_objects().items():
        kv.validate(obj, "1.30.0", strict=True)


# ------------------------------------------------------------------------------------ systemd

UNITS = {
    "rqrl-coordinator.service": None,
    "rqrl-collector@.service": "collector",
    "rqrl-learner.service": "learner",
}


@pytest.mark.parametrize("name", sorted(UNITS))
def test_systemd_unit(name):
    u = _unit(SYSTEMD / name)
    assert {"Unit", "Service", "Install"} <= set(u.sections())
    svc = u["Service"]
    assert svc["EnvironmentFile"] == "/etc/rqrl/rqrl.env"
    assert svc["User"] == "rqrl" and svc["Group"] == "rqrl"
    assert svc["WorkingDirectory"].startswith("/")
    assert u["Install"]["WantedBy"] == "multi-user.target"
    argv = shlex.split(svc["ExecStart"])
    assert argv[0].startswith("/opt/rqrl/venv/bin/")
    queue = UNITS[name]
    if queue is None:
        assert argv[1:3] == ["-m", "coordinator"]
        assert svc["Restart"] == "on-failure" and svc["RestartPreventExitStatus"].split() == ["2", "130"]
    else:
        assert argv[1:] == ["worker", queue, "-w", WORKER_CLASS[queue]]
        assert svc["Restart"] == "on-failure"
    assert "redis://" not in svc["ExecStart"], "the Redis URL comes from the EnvironmentFile"


def test_systemd_collector_is_a_template():
    u = _unit(SYSTEMD / "rqrl-collector@.service")
    assert "%i" in u["Unit"]["Description"]


def _systemd_expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """systemd's ExecStart expansion: ``${V}`` is one word, a lone ``$V`` splits at whitespace."""
    out = []
    for a in argv:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", a)
        if m:
            out += env.get(m.group(1), "").split()
        else:
            out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), a))
    return out


def test_systemd_env_example_drives_a_valid_coordinator():
    env = _env_file(SYSTEMD / "rqrl.env.example")
    assert {"RQRL_REDIS_URL", "RQ_REDIS_URL", "RQRL_CONFIG", "RQRL_COORDINATOR_ARGS"} <= set(env)
    assert env["RQRL_REDIS_URL"] == env["RQ_REDIS_URL"]
    svc = _unit(SYSTEMD / "rqrl-coordinator.service")["Service"]
    argv = _systemd_expand(shlex.split(svc["ExecStart"]), env)
    assert argv[1:3] == ["-m", "coordinator"]
    cfg = _check_coordinator_argv([_image_config_path(argv[3])] + argv[4:])
    # The unit's header starts four collector instances (rqrl-collector@{1..4}).
    header = (SYSTEMD / "rqrl-collector@.service").read_text()
    instances = re.search(r"rqrl-collector@\{1\.\.(\d+)\}", header)
    assert instances, "rqrl-collector@.service should show how many instances to start"
    _check_follows_workers(cfg, int(instances.group(1)))


def test_no_recipe_fixes_the_collector_task_space():
    """Collector workers scale without touching the coordinator: no file under deploy/ sets a cap."""
    for path in DEPLOY.rglob("*"):
        if path.is_file() and path.suffix not in (".pyc",):
            text = path.read_text(errors="replace")
            assert not re.search(r"collector_task_space\s*=\s*\d", text), f"{path} fixes the collector task space"


def test_systemd_analyze_verify(tmp_path):
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze is not installed")
    bindir = Path(sys.executable).parent
    if not (bindir / "rq").exists() or not (bindir / "python").exists():
        pytest.skip("no rq / python beside the interpreter")
    files = []
    for name in UNITS:
        text = (SYSTEMD / name).read_text().replace("/opt/rqrl/venv/bin/", f"{bindir}/")
        target = tmp_path / name.replace("@.", "@1.")
        target.write_text(text)
        files.append(str(target))
    res = subprocess.run([exe, "verify", *files], capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    problems = [line for line in out.splitlines() if str(tmp_path) in line or "rqrl-" in line]
    assert not problems, out


# ------------------------------------------------------------------------------------ redis


def test_redis_conf_settings():
    conf = {}
    for line in (REDIS_DIR / "redis.conf").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            conf[key] = value.strip()
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "everysec"
    assert conf["maxmemory-policy"] == "noeviction"
    assert conf["protected-mode"] == "yes"
    assert "bind" in conf
    assert conf["requirepass"].startswith("CHANGE_ME")


def _acl_users() -> dict[str, list[str]]:
    users = {}
    for line in (REDIS_DIR / "users.acl.example").read_text().splitlines():
        if line.strip():
            parts = line.split()
            assert parts[0] == "user", "ACL files allow no comments: every line starts with 'user'"
            users[parts[1]] = parts[2:]
    return users


def test_acl_example_is_least_privilege():
    users = _acl_users()
    assert set(users) == {"default", "admin", "rqrl"}
    assert "off" in users["default"] and "on" not in users["default"]
    rules = users["rqrl"]
    assert "on" in rules
    assert sorted(r for r in rules if r.startswith("~")) == ["~rq:*", "~rqrl:*"]
    assert sorted(r for r in rules if r.startswith("&")) == ["&rq:*", "&rqrl:*"]
    assert "resetkeys" in rules and "resetchannels" in rules
    assert rules.index("-@all") < min(i for i, r in enumerate(rules) if r.startswith("+"))
    granted = {r[1:] for r in rules if r.startswith("+")}
    assert not any(g.startswith("@") for g in granted), "grant commands one by one, not categories"
    dangerous = {"flushall", "flushdb", "keys", "config", "acl", "client", "debug", "shutdown", "monitor",
                 "eval", "script", "script|flush", "client|list", "client|kill", "migrate", "replicaof", "save",
                 "bgsave", "bgrewriteaof", "swapdb", "module", "cluster", "failover", "slaveof", "sync", "psync"}
    assert not granted & dangerous, granted & dangerous
    for needed in ("blmove", "lmove", "blpop", "xreadgroup", "xack", "xautoclaim", "evalsha", "publish", "subscribe",
                   "multi", "exec", "watch", "info", "client|setname"):
        assert needed in granted, needed
    passwords = [r for u in users.values() for r in u if r.startswith(">")]
    assert passwords and all(p.startswith(">CHANGE_ME") for p in passwords)


def test_docs_show_the_shipped_acl_rule():
    rqrl_line = next(line for line in (REDIS_DIR / "users.acl.example").read_text().splitlines()
                     if line.startswith("user rqrl "))
    assert rqrl_line in DOC.read_text(), "docs/deploy.md must quote the rqrl ACL line verbatim"


# ------------------------------------------------------------------------------------ secrets

_PLACEHOLDER = re.compile(r"^(CHANGE_ME\w*|\$\{?\(?[A-Za-z_]\w*.*|PASSWORD|\*\*\*|\.\.\.)$")

# Where a password would stand, per line: redis://user:PASS@, requirepass PASS, --requirepass PASS
# (also as the next YAML list item), *PASSWORD=PASS / *PASSWORD: PASS, and ACL rules ">PASS".
_SECRET_PATTERNS = [
    re.compile(r"rediss?://[^:/@\s\"']*:([^@\s\"']+)@"),
    re.compile(r"^\s*#?\s*requirepass\s+(\S+)"),
    re.compile(r"--requirepass(?:\s*$|[\s\"',]+)([^\s\"',\]]*)"),
    re.compile(r"^\s*#?\s*-?\s*[A-Z_]*PASSWORD[A-Z_]*\s*[=:]\s*(\S+)"),
]
_ACL_PASSWORD = re.compile(r"(?:^|\s)>(\S+)")


def _real_looking(value: str) -> bool:
    value = value.strip("\"'")
    if not value or _PLACEHOLDER.match(value):
        return False
    return len(value) >= 8 or any(ch.isdigit() for ch in value)


def _deploy_text_files() -> list[Path]:
    """Committed text files: a local deploy/docker/.env (git-ignored, holds the real password) is skipped."""
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
             and p.name != ".env"]
    return files + [DOC]


def test_no_real_looking_password_is_committed():
    """Every password in deploy/ and docs/deploy.md is a placeholder or a variable reference."""
    bad = []
    for p in _deploy_text_files():
        lines = p.read_text().splitlines()
        for i, line in enumerate(lines):
            values = []
            for pat in _SECRET_PATTERNS:
                for m in pat.finditer(line):
                    value = m.group(1)
                    if not value and i + 1 < len(lines):  # "--requirepass" then "- VALUE" on the next line
                        value = lines[i + 1].strip().lstrip("-").strip()
                    values.append(value)
            if re.match(r"^\s*user\s", line):
                values += [m.group(1) for m in _ACL_PASSWORD.finditer(line)]
            bad += [f"{p.relative_to(REPO)}:{i + 1}: {v!r}" for v in values if _real_looking(v)]
    assert not bad, "real-looking passwords:\n" + "\n".join(bad)


def test_secret_scan_catches_a_real_password():
    assert _real_looking("s3cr3t-Pa55w0rd") and _real_looking("hunter22")
    assert not _real_looking("CHANGE_ME_REDIS_PASSWORD") and not _real_looking("${REDIS_PASSWORD:?set")
    assert not _real_looking("$(REDIS_PASSWORD)") and not _real_looking("$PW") and not _real_looking("PASSWORD")
    m = _SECRET_PATTERNS[0].search("url: redis://:hunter22@redis:6379/0")
    assert m and m.group(1) == "hunter22"


# ------------------------------------------------------------------------------------ the healthchecks


@pytest.mark.redis_server
def test_redis_healthchecks_against_a_real_server():
    """The compose healthcheck and the k8s probe/init commands, run against a password-protected server."""
    from common.embedded_redis import EmbeddedRedis, find_redis_server

    if find_redis_server() is None or shutil.which("redis-cli") is None:
        pytest.skip("needs redis-server and redis-cli")
    objs = _k8s_objects()
    commands = [compose()["services"]["redis"]["healthcheck"]["test"][1]]
    commands.append(_container(objs[("StatefulSet", "redis")])["readinessProbe"]["exec"]["command"][2])
    commands.append(objs[("Job", "rqrl-coordinator")]["spec"]["template"]["spec"]["initContainers"][0]["command"][2])
    with EmbeddedRedis(extra_args=["--requirepass", "hc-secret"]) as server:
        for cmd in commands:
            local = cmd.replace("redis-cli -h redis", "redis-cli").replace("redis-cli", f"redis-cli -h 127.0.0.1 -p {server.port}")
            if "until" in local:
                local = local.replace("sleep 2", "exit 7")  # fail fast instead of waiting forever
            ok = subprocess.run(["sh", "-c", local], env=dict(os.environ, REDIS_PASSWORD="hc-secret"),
                                capture_output=True, text=True, timeout=30)
            assert ok.returncode == 0, (cmd, ok.stdout, ok.stderr)
            wrong = subprocess.run(["sh", "-c", local], env=dict(os.environ, REDIS_PASSWORD="wrong"),
                                   capture_output=True, text=True, timeout=30)
            assert wrong.returncode != 0, cmd
