"""Static checks of the compose deployment: docker-compose.yml, docker/ and what they refer to.

No Docker engine runs where the tests run, so nothing is started. Instead every name the
deployment relies on is checked against the repository and the code: the module each service
runs, each FEDASYNC_ setting, each file built from or mounted, each port and URL between
services, each Prometheus target and each metric a Grafana panel queries. A typo in any of them
would otherwise surface only on someone's `docker compose up`.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedasync.services.aggregator.metrics import AggregatorMetrics
from fedasync.services.commands.cli import build_parser
from fedasync.services.commands.redis_launch.sentinel import (
    SHIPPED_MIN_REPLICAS_MAX_LAG_S,
    sentinel_conf,
)
from fedasync.services.control.metrics import ControlMetrics
from fedasync.services.ingest.metrics import IngestMetrics
from fedasync.services.runtime.settings import RedisSettings, Settings, setting_names
from fedasync.services.snapshot.metrics import SnapshotMetrics
from fedasync.services.stores.acl import (
    CLUSTER_ADMIN_USER,
    DEFAULT_USER_LINE,
    HEALTH_USER,
    acl_file,
    all_users,
    password_variables,
    sentinel_acl,
)

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_TEXT)
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
PYPROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PYPROJECT["project"]["optional-dependencies"]
PROMETHEUS_FILE = ROOT / "docker" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "docker" / "grafana"
ACL_TEMPLATE = ROOT / "docker" / "redis" / "users.acl"
#: the cluster nodes' users (`fedasync acl --all-runs --cluster`: every run's keys)
CLUSTER_ACL_TEMPLATE = ROOT / "docker" / "redis" / "users-cluster.acl"
REDIS_ENTRYPOINT = ROOT / "docker" / "redis" / "entrypoint.sh"
#: what the compose Redis reads; the entrypoint renders the template into it
ACL_TARGET = "/usr/local/etc/redis/users.acl"

# Series Prometheus makes itself for every target.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


# ---------------------------------------------------------------------------------- helpers
def argv(service: dict[str, Any]) -> list[str]:
    """Entrypoint and command as one argument list (our images have no ENTRYPOINT)."""
    out: list[str] = []
    for key in ("entrypoint", "command"):
        value = service.get(key, [])
        out += shlex.split(value) if isinstance(value, str) else [str(v) for v in value]
    return out


def module_of(service: dict[str, Any]) -> str | None:
    """The module a service runs with `python -m`, directly or as the last step of `sh -c`."""
    args = argv(service)
    if args[:2] == ["python", "-m"]:
        return args[2]
    if args[:2] == ["sh", "-c"]:
        match = re.search(r"\bexec python -m ([\w.]+)", args[2])
        return match.group(1) if match else None
    return None


def ours(name: str) -> bool:
    return "build" in SERVICES[name]


def section_of(name: str) -> str | None:
    """The settings section of the service's module (fedasync.services.snapshot → snapshot)."""
    module = module_of(SERVICES[name])
    if module is None or not module.startswith("fedasync.services."):
        return None
    section = module.split(".")[2]
    return section if section in Settings.model_fields else None


def environment(name: str) -> dict[str, str]:
    env = SERVICES[name].get("environment", {})
    assert isinstance(env, dict), f"{name}: write environment as a mapping"
    return {str(k): str(v) for k, v in env.items()}


def configured_port(name: str) -> int | None:
    """The port the service's own settings make it listen on; None if it serves no HTTP."""
    section = section_of(name)
    if section is None:
        return None
    model = Settings.model_fields[section].annotation
    assert isinstance(model, type)
    fields = model.model_fields
    if "port" not in fields:
        return None
    value = environment(name).get(f"FEDASYNC_{section.upper()}__PORT", fields["port"].default)
    return int(value)


def http_services() -> list[str]:
    return [name for name in SERVICES if configured_port(name) is not None]


def published(name: str) -> list[tuple[str, int, int]]:
    """(host ip, host port, container port) of each published port."""
    out = []
    for spec in SERVICES[name].get("ports", []):
        if isinstance(spec, dict):
            out.append((spec.get("host_ip", ""), int(spec["published"]), int(spec["target"])))
            continue
        *host, container = defaults(str(spec)).split(":")
        ip = host[0] if len(host) == 2 else ""
        out.append((ip, int(host[-1]), int(container.split("/")[0])))
    return out


def defaults(spec: str) -> str:
    """`${EDGE_BIND:-127.0.0.1}` → `127.0.0.1`: what compose makes of a variable with a default
    when the shell does not set it."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", spec)


def bind_mounts(name: str) -> dict[str, Path]:
    """Container path → repository path of each bind mount from the repository."""
    out = {}
    for spec in SERVICES[name].get("volumes", []):
        source, target = defaults(str(spec)).split(":")[:2]
        if source.startswith("."):
            out[target] = (ROOT / source).resolve()
    return out


def module_exists(module: str) -> bool:
    """Importable, from this repository: `services` is a namespace package, so an editable
    install of another checkout can make a module importable that this tree does not have."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None:
        return False
    places = [spec.origin] if spec.origin else list(spec.submodule_search_locations or [])
    return any(Path(place).resolve().is_relative_to(ROOT) for place in places if place)


def dockerfile_of(name: str) -> Path:
    build = SERVICES[name]["build"]
    return ROOT / str(build["context"]) / str(build["dockerfile"])


def dockerfile_lines(path: Path) -> list[str]:
    """Instructions with continuation lines joined."""
    return [line.strip() for line in path.read_text().replace("\\\n", " ").splitlines()]


def run_flags_and_script(line: str) -> tuple[list[str], str]:
    """A RUN instruction's flags (`--mount=...`) and its shell script."""
    words = line[4:].split()
    flags = []
    while words and words[0].startswith("--"):
        flags.append(words.pop(0))
    return flags, " ".join(words)


def pip_installs(path: Path) -> list[list[str]]:
    """The arguments of each unconditional `pip install` in the Dockerfile's RUN instructions
    (not those inside `if ...; fi`)."""
    out = []
    for line in dockerfile_lines(path):
        if line.startswith("RUN "):
            _, script = run_flags_and_script(line)
            for step in script.split("&&"):
                words = shlex.split(step)
                if words[:2] == ["pip", "install"]:
                    out.append(words[2:])
    return out


def dockerfile_args(path: Path) -> dict[str, str | None]:
    """Each ARG of a Dockerfile and its default (None: no default)."""
    found: dict[str, str | None] = {}
    for line in dockerfile_lines(path):
        if line.startswith("ARG "):
            name, eq, default = line[4:].partition("=")
            found[name] = default.strip('"') if eq else None
    return found


def project_extras(path: Path) -> list[str]:
    """Extras of each install of the project itself (`.` or `.[a,b]`)."""
    extras = []
    for args in pip_installs(path):
        for arg in args:
            match = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", arg)
            if match:
                extras.append("")  # the project itself
                extras += match.group(1).split(",") if match.group(1) else []
    return extras


def worker_script() -> str:
    """The worker's `sh -c` script as the container's shell sees it (compose turns $$ into $)."""
    args = argv(SERVICES["worker"])
    assert args[:2] == ["sh", "-c"]
    return args[2].replace("$$", "$")


# --------------------------------------------------------------------------- metric names
def exported_samples(name: str, kind: str) -> set[str]:
    """The sample names Prometheus sees for one metric family of prometheus_client."""
    if kind == "counter":
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "histogram":
        return {name + s for s in ("_bucket", "_count", "_sum", "_created")}
    if kind == "summary":
        return {name, f"{name}_count", f"{name}_sum", f"{name}_created"}
    return {name}


def registry_families(registry: Any) -> dict[str, str]:
    return {family.name: family.type for family in registry.collect()}


def defined_families(path: Path) -> dict[str, str]:
    """Metric families a module defines: prometheus_client constructors with a literal name."""
    tree = ast.parse(path.read_text())
    kinds = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary"}
    imported = {
        alias.asname or alias.name: kinds[alias.name]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "prometheus_client"
        for alias in node.names
        if alias.name in kinds
    }
    out = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else None
        first = node.args[0]
        if called in imported and isinstance(first, ast.Constant) and isinstance(first.value, str):
            out[first.value] = imported[called]
    return out


def exported_metric_names() -> set[str]:
    families: dict[str, str] = {}
    for path in sorted((ROOT / "services").rglob("*.py")):
        families.update(defined_families(path))
    names = set(PROMETHEUS_SERIES)
    for name, kind in families.items():
        names |= exported_samples(name, kind)
    return names


_PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
_PROMQL_KEYWORDS |= {"and", "or", "unless", "offset", "inf", "nan"}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: identifiers that are not functions, labels, keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings (label values)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\$\w+", "", text)  # Grafana variables
    text = re.sub(
        r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text
    )  # grouping labels
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):
        rest = text[match.end() :].lstrip()
        if not rest.startswith("(") and match.group() not in _PROMQL_KEYWORDS:
            names.add(match.group())
    return names


def dashboard_panels() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted((GRAFANA / "dashboards").glob("*.json")):
        stack = list(json.loads(path.read_text())["panels"])
        while stack:
            panel = stack.pop()
            stack += panel.get("panels", [])
            if panel["type"] != "row":
                out.append((path, panel))
    return out


# -------------------------------------------------------------------------- services, settings
@pytest.mark.parametrize("name", [n for n in SERVICES if ours(n)])
def test_service_runs_a_real_module_or_cli_command(name: str) -> None:
    args = argv(SERVICES[name])
    if args[:1] == ["fedasync"]:
        build_parser().parse_args(args[1:])  # exits (SystemExit) on an unknown command
        return
    module = module_of(SERVICES[name])
    assert module is not None, f"{name}: runs neither `python -m <module>` nor `fedasync ...`"
    assert module_exists(module), module
    assert module_exists(f"{module}.__main__"), f"{module} has no __main__"


def test_every_fedasync_name_in_the_compose_file_is_a_setting() -> None:
    # Container variables, variables taken from the shell (${...}) and those the worker's script
    # sets: a FEDASYNC_ name that is no setting makes every fedasync process refuse to start.
    named = set(re.findall(r"FEDASYNC_[A-Z0-9_]*[A-Z0-9]", COMPOSE_TEXT))
    for name in SERVICES:
        named |= {v for v in environment(name) if v.startswith("FEDASYNC_")}
    assert "FEDASYNC_CONTROL__TOKEN" in named
    assert named <= setting_names(), sorted(named - setting_names())


def acl_users(template: Path = ACL_TEMPLATE) -> dict[str, str]:
    """User → its password token, as an ACL template in the repository declares them."""
    out = {}
    for line in template.read_text().splitlines():
        words = line.split()
        assert words[:1] == ["user"], line
        if words[1] == "default":  # off: nobody logs in as it (services/stores/acl.py)
            assert words[2] == "off", line
            continue
        assert words[2] == "on", line
        out[words[1]] = words[3]
    return out


def redis_user_urls(name: str) -> list[tuple[str, str, str]]:
    """(variable, user, password variable) of each Redis URL a service is given."""
    out = []
    for variable, url in environment(name).items():
        if not url.startswith("redis://"):
            continue
        match = re.fullmatch(r"redis://(\w+):\$\{(REDIS_PASSWORD_\w+)(?::-)?\}@redis:6379/0", url)
        assert match is not None, f"{name}: {variable}={url}"
        out.append((variable, match.group(1), match.group(2)))
    return out


def test_every_fedasync_service_talks_to_the_compose_redis_as_a_user_of_the_acl_file() -> None:
    """Each user of the ACL file its Redis loads: the one `redis`'s (users.acl), or, under the
    profile `runs` (which runs on the cluster), the cluster nodes' (users-cluster.acl)."""
    seen = set()
    for name in SERVICES:
        if not ours(name):
            continue
        runs = "runs" in SERVICES[name].get("profiles", [])
        declared = acl_users(CLUSTER_ACL_TEMPLATE if runs else ACL_TEMPLATE)
        server_env = environment("redis-node-1" if runs else "redis")
        urls = redis_user_urls(name)
        assert "FEDASYNC_REDIS__URL" in [variable for variable, _, _ in urls], name
        for _, user, variable in urls:
            assert user in declared, f"{name}: no user {user} in its ACL file"
            assert user != "default", name
            assert declared[user] == "${" + variable + "}", f"{name}: {variable} is not {user}'s"
            # the Redis container gets the same variable to render the ACL file
            assert server_env[variable].startswith("${" + variable + ":"), variable
            seen.add(user)
        assert SERVICES[name]["depends_on"]["redis"]["condition"] == "service_healthy", name
    expected = {"aggregator", "snapshot", "control", "evaluator", "ingest", "worker", "admin"}
    assert seen == expected | {"supervisor"}
    assert "FEDASYNC_REDIS__URL" not in COMPOSE["x-fedasync-env"]  # no user by default


def test_the_default_stack_needs_only_the_passwords_fedasync_acl_makes() -> None:
    """Compose interpolates every service, in a profile or not: a variable it requires (`:?`)
    must be one `fedasync acl --new-passwords` prints (or the control token), so the
    documented .env starts the default stack; the two users of the profiles `runs` and
    `cluster` alone are not required there (their entrypoint and login refuse them missing)."""
    required = set(re.findall(r"\$\{(\w+):\?", COMPOSE_TEXT))
    made = set(password_variables(RedisSettings().key_prefix))
    assert required == made | {"FEDASYNC_CONTROL__TOKEN"}, sorted(required ^ made)
    extra = set(password_variables(RedisSettings().key_prefix, all_runs=True, cluster=True))
    assert extra - made == {"REDIS_PASSWORD_SUPERVISOR", "REDIS_PASSWORD_CLUSTER_ADMIN"}
    for variable in sorted(extra - made):
        assert "${" + variable + ":?" not in COMPOSE_TEXT
        assert environment("redis-node-1")[variable] == "${" + variable + ":-}"


def test_the_acl_file_in_the_repository_is_what_the_generator_makes() -> None:
    # the compose services keep the default key prefix, which the file was generated for
    assert all("FEDASYNC_REDIS__KEY_PREFIX" not in environment(n) for n in SERVICES)
    expected = acl_file(RedisSettings().key_prefix)
    assert ACL_TEMPLATE.read_text() == expected, "run: fedasync acl > docker/redis/users.acl"
    assert ACL_TEMPLATE.read_text().splitlines()[0] == DEFAULT_USER_LINE


def test_redis_renders_the_acl_template_and_loads_the_result() -> None:
    redis = SERVICES["redis"]
    assert argv(redis)[:2] == ["sh", "/usr/local/etc/redis/entrypoint.sh"]
    command = redis["command"]
    assert command[0] == "redis-server"
    assert command[command.index("--aclfile") + 1] == ACL_TARGET
    mounts = bind_mounts("redis")
    assert mounts[ACL_TARGET + ".template"] == ACL_TEMPLATE
    assert mounts["/usr/local/etc/redis/entrypoint.sh"] == REDIS_ENTRYPOINT
    # the healthcheck logs in as the health user (no password needed: it may PING and nothing
    # else); nobody may log in as the default user
    assert redis["healthcheck"]["test"] == [
        "CMD",
        "redis-cli",
        "--user",
        HEALTH_USER,
        "--pass",
        "-",
        "--no-auth-warning",
        "ping",
    ]


def render_acl(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the Redis entrypoint with a stand-in for the image's own entrypoint."""
    stub = tmp_path / "docker-entrypoint.sh"
    stub.write_text('#!/bin/sh\necho "started: $*"\n')
    stub.chmod(0o755)
    base = {
        "PATH": f"{tmp_path}:/usr/bin:/bin",
        "ACL_TEMPLATE": str(ACL_TEMPLATE),
        "ACL_FILE": str(tmp_path / "users.acl"),
    }
    return subprocess.run(
        ["sh", str(REDIS_ENTRYPOINT), "redis-server", "--aclfile", str(tmp_path / "users.acl")],
        env=base | env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_redis_entrypoint_fills_in_each_password_from_the_environment(tmp_path: Path) -> None:
    passwords = {
        u.name: f"{u.name}-Pw.~_{i:02d}-0123456789" for i, u in enumerate(all_users("fedasync"))
    }
    env = {u.password_variable: passwords[u.name] for u in all_users("fedasync")}
    result = render_acl(tmp_path, env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"started: redis-server --aclfile {tmp_path / 'users.acl'}\n"
    assert (tmp_path / "users.acl").read_text() == acl_file("fedasync", passwords)
    assert (tmp_path / "users.acl").stat().st_mode & 0o077 == 0  # passwords: owner only


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        (None, "REDIS_PASSWORD_WORKER is not set"),
        ("", "REDIS_PASSWORD_WORKER is not set"),
        ("short-pw", "REDIS_PASSWORD_WORKER: 16 characters or more"),
        ("with space 0123456789", "REDIS_PASSWORD_WORKER: use only"),
        ("p@ss:word/0123456789", "REDIS_PASSWORD_WORKER: use only"),  # would break the URL
    ],
)
def test_redis_entrypoint_refuses_to_start_without_a_usable_password(
    tmp_path: Path, value: str | None, complaint: str
) -> None:
    env = {u.password_variable: f"{u.name}-password-0123456789" for u in all_users("fedasync")}
    if value is None:
        del env["REDIS_PASSWORD_WORKER"]
    else:
        env["REDIS_PASSWORD_WORKER"] = value
    result = render_acl(tmp_path, env)
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr
    assert "started" not in result.stdout  # Redis is never started
    assert not (tmp_path / "users.acl").exists()
    assert not (tmp_path / "users.acl.tmp").exists()


def test_control_token_comes_from_the_shell_and_is_required() -> None:
    token = environment("control")["FEDASYNC_CONTROL__TOKEN"]
    assert token.startswith("${FEDASYNC_CONTROL__TOKEN:?"), token  # no token: compose refuses


def test_http_services_bind_all_interfaces_and_publish_their_configured_port() -> None:
    assert set(http_services()) == {
        "aggregator",
        "snapshot",
        "control",
        "evaluator",
        "ingest",
        "supervisor",
    }
    for name in http_services():
        section = section_of(name)
        assert section is not None
        assert environment(name)[f"FEDASYNC_{section.upper()}__HOST"] == "0.0.0.0", name
        port = configured_port(name)
        assert [(ip, host, target) for ip, host, target in published(name)] == [
            ("127.0.0.1", port, port)
        ], name


def test_host_ports_do_not_collide_and_scaled_services_publish_none() -> None:
    seen: dict[int, str] = {}
    for name in SERVICES:
        for _, host, _ in published(name):
            assert host not in seen, f"{name} and {seen[host]} both publish {host}"
            seen[host] = name
        if SERVICES[name].get("deploy", {}).get("replicas", 1) > 1:
            assert not published(name), f"{name} is scaled: a fixed host port would collide"
            assert "container_name" not in SERVICES[name], f"{name} is scaled: names collide"
    assert len(seen) >= 6


def test_urls_between_services_name_real_services_and_ports() -> None:
    checked = 0
    for name in SERVICES:
        for variable, value in environment(name).items():
            match = re.fullmatch(r"(\w+)://(?:[^@/]+@)?([\w.-]+):(\d+)(/.*)?", value)
            if not match or not variable.startswith("FEDASYNC_"):
                continue
            scheme, host, port = match.group(1), match.group(2), int(match.group(3))
            assert host in SERVICES, f"{name}: {variable} names no service"
            expected = 6379 if scheme == "redis" else configured_port(host)
            assert port == expected, f"{name}: {variable}"
            checked += 1
    assert environment("worker")["FEDASYNC_WORKER__SNAPSHOT_URL"] == "http://snapshot:8081"
    assert checked >= 8


def test_redis_is_durable_and_never_evicts() -> None:
    redis = SERVICES["redis"]
    command = " ".join(redis["command"])
    assert redis["image"] == "redis:7.2-alpine"
    assert "--appendonly yes" in command
    assert "--appendfsync always" in command
    assert re.search(r"--maxmemory \d+[kmg]b", command)
    assert "--maxmemory-policy noeviction" in command
    assert "redis-data:/data" in redis["volumes"]


# ---------------------------------------------------------------------- health and start order
def test_long_running_services_have_healthchecks_on_their_readiness_endpoints() -> None:
    for name, service in SERVICES.items():
        if service.get("profiles"):  # one-off tools
            continue
        if module_of(service) == "fedasync.services.worker":
            assert "healthcheck" not in service  # a worker serves no endpoint
            continue
        test = service["healthcheck"]["test"]
        assert test[0] == "CMD", name
        if name in http_services():
            assert f"http://127.0.0.1:{configured_port(name)}/readyz" in " ".join(test), name


def test_depends_on_waits_only_for_services_that_report_health() -> None:
    for name, service in SERVICES.items():
        for target, condition in service.get("depends_on", {}).items():
            assert target in SERVICES, f"{name} depends on unknown {target}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[target], f"{name} waits on {target}"
    for name in ("worker", "evaluator"):  # both start from a served model
        assert SERVICES[name]["depends_on"]["snapshot"]["condition"] == "service_healthy"


# --------------------------------------------------------------------------------- the workers
def test_worker_is_a_scalable_pool_on_the_worker_image() -> None:
    worker = SERVICES["worker"]
    assert module_of(worker) == "fedasync.services.worker"
    assert worker["deploy"]["replicas"] >= 1
    assert worker["build"]["dockerfile"] == "docker/worker.Dockerfile"
    assert worker["restart"] == "on-failure"  # done training: exit 0, stay stopped
    assert environment("worker")["FEDASYNC_WORKER__DEVICE_INDEX"] == "0"


def test_worker_script_leaves_nothing_for_compose_to_interpolate() -> None:
    raw = argv(SERVICES["worker"])[2]
    assert "$" not in raw.replace("$$", ""), raw  # a single $ would be filled in by compose


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_worker_script_gives_each_replica_its_own_client_id(tmp_path: Path) -> None:
    # A stand-in `python` first on PATH prints what the worker would be started with.
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\necho "$FEDASYNC_WORKER__CLIENT_ID $*"\n')
    stub.chmod(0o755)
    env = {
        "PATH": f"{tmp_path}:/usr/bin:/bin",
        "HOSTNAME": "3f2a9c1b7d2e",
        "FEDASYNC_WORKER__DEVICE_INDEX": "0",
    }

    def started(**extra: str) -> str:
        result = subprocess.run(
            ["sh", "-c", worker_script()],
            env=env | extra,
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()

    assert started() == "device-0-3f2a9c1b7d2e -m fedasync.services.worker"
    assert started(HOSTNAME="a0b1c2") == "device-0-a0b1c2 -m fedasync.services.worker"
    assert started(FEDASYNC_WORKER__CLIENT_ID="phone-17") == "phone-17 -m fedasync.services.worker"


# ------------------------------------------------------------------------- images and files
def test_files_services_build_from_and_mount_exist() -> None:
    declared = set(COMPOSE.get("volumes", {}))
    for name, service in SERVICES.items():
        if "build" in service:
            assert (ROOT / service["build"]["context"]).is_dir(), name
            assert dockerfile_of(name).is_file(), name
        for spec in service.get("volumes", []):
            source = defaults(str(spec)).split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name}: {source}"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"


def test_images_are_pinned() -> None:
    version = PYPROJECT["project"]["version"]
    for name, service in SERVICES.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image}"
        if ours(name):
            assert tag == version, f"{name}: our images carry the project version"


def test_dockerfiles_pin_cpu_torch_and_never_run_as_root() -> None:
    (pin,) = [dep for dep in EXTRAS["worker"] if dep.startswith("torch")]
    torch_installs = 0
    for path in (ROOT / "docker").glob("*Dockerfile"):
        text = path.read_text()
        assert "\nUSER " in text, path.name
        for args in pip_installs(path):
            for arg in args:
                if arg.startswith("torch"):
                    assert arg == pin == "torch==2.13.0", (path.name, arg)
                    assert args[args.index("--index-url") + 1] == "$TORCH_INDEX_URL"
                    default = dockerfile_args(path)["TORCH_INDEX_URL"]
                    assert default == "https://download.pytorch.org/whl/cpu", path.name
                    torch_installs += 1
    assert torch_installs == 1  # the worker image (the services image's, if SERVICES_TORCH:
    # test_a_task_of_ones_own_can_be_built_into_both_images)


def test_dockerfiles_copy_every_package() -> None:
    """The one package and every folder it links to (fedasync/shared -> ../shared, ...)."""
    assert PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"] == ["fedasync*"]
    linked = [p.name for p in (ROOT / "fedasync").iterdir() if p.is_symlink()]
    assert sorted(linked) == ["learning", "services", "shared", "sim"]
    for path in (ROOT / "docker").glob("*Dockerfile"):
        text = path.read_text()
        for name in ["fedasync", *linked]:
            assert f"COPY {name} ./{name}" in text, (path.name, name)


def test_dockerfiles_copy_only_files_the_build_context_sends() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not any(p.startswith("!") for p in patterns)  # keep the rule simple to check
    for path in (ROOT / "docker").glob("*Dockerfile"):
        for line in dockerfile_lines(path):
            if not line.startswith("COPY "):
                continue
            *sources, _ = [w for w in line.split()[1:] if not w.startswith("--")]
            for source in sources:
                assert (ROOT / source).exists(), (path.name, source)
                ignored = [p for p in patterns if fnmatch.fnmatch(source, p.strip("/"))]
                assert not ignored, (path.name, source, ignored)


def test_images_install_the_project_with_the_extras_their_services_need() -> None:
    for name in SERVICES:
        if not ours(name):
            continue
        path = dockerfile_of(name)
        extras = project_extras(path)
        assert "" in extras, f"{path.name} does not install the project from pyproject.toml"
        deps = [dep for extra in extras if extra for dep in EXTRAS[extra]]
        module = module_of(SERVICES[name])
        if module == "fedasync.services.worker":
            assert "worker" in extras
            installs = dockerfile_lines(path)
            torch = next(i for i, line in enumerate(installs) if "pip install torch==" in line)
            project = next(i for i, line in enumerate(installs) if '".[worker]"' in line)
            assert torch < project  # the CPU wheel first: then nothing pulls another torch
        else:
            assert not any("torch" in dep for dep in deps), f"{path.name}: the slim image"
            assert not any("torch" in arg for a in pip_installs(path) for arg in a)
        if module in (
            "fedasync.services.evaluator",
            "fedasync.services.worker",
        ):  # digits data: scikit-learn
            assert any(dep.startswith("scikit-learn") for dep in deps), name


# -------------------------------------------------------------------------------- Prometheus
def test_prometheus_reads_the_repository_config() -> None:
    prometheus = SERVICES["prometheus"]
    config = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    target = config.removeprefix("--config.file=")
    assert bind_mounts("prometheus")[target] == PROMETHEUS_FILE


def test_prometheus_scrapes_every_http_service_at_its_configured_port() -> None:
    """By name: a static target for each service outside a profile; the supervisor (profile
    `runs`) through DNS, so that without the profile there is no target rather than one down."""
    config = yaml.safe_load(PROMETHEUS_FILE.read_text())
    scraped = set()
    for job in config["scrape_configs"]:
        assert job.get("metrics_path", "/metrics") == "/metrics"
        named = [t.split(":") for s in job.get("static_configs", []) for t in s["targets"]]
        named += [[n, d["port"]] for d in job.get("dns_sd_configs", []) for n in d["names"]]
        for host, port in named:
            assert host in SERVICES, f"{job['job_name']}: {host} is no compose service"
            assert int(port) == configured_port(host), (host, port)
            assert job["job_name"] == host
            assert ("profiles" in SERVICES[host]) == ("dns_sd_configs" in job), host
            scraped.add(host)
    assert scraped == set(http_services())


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_config_passes_promtool() -> None:
    result = subprocess.run(
        ["promtool", "check", "config", str(PROMETHEUS_FILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ----------------------------------------------------------------------------------- Grafana
def test_grafana_reads_its_provisioning_and_dashboards_from_the_repository() -> None:
    mounts = bind_mounts("grafana")
    assert mounts["/etc/grafana/provisioning"] == GRAFANA / "provisioning"
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/fedasync.yml").read_text())
    for provider in providers["providers"]:
        source = mounts[provider["options"]["path"]]
        assert list(source.glob("*.json")), provider["name"]
    home = environment("grafana")["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    folder, _, file = home.rpartition("/")
    assert (mounts[folder] / file).is_file()
    assert environment("grafana")["GF_SECURITY_ADMIN_PASSWORD"].startswith(
        "${GRAFANA_ADMIN_PASSWORD"
    )


def test_grafana_datasource_is_the_compose_prometheus() -> None:
    config = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = config["datasources"]
    match = re.fullmatch(r"http://([\w-]+):(\d+)", source["url"])
    assert match is not None
    assert match.group(1) == "prometheus"
    assert int(match.group(2)) in [t for _, _, t in published("prometheus")]
    uids = {source["uid"]}
    for path, panel in dashboard_panels():
        for item in (panel, *panel["targets"]):
            assert item["datasource"]["uid"] in uids, (path.name, panel["title"])


def test_metric_definitions_parse_as_the_registries_export_them() -> None:
    # The panel check below reads metric names from the source; the three registries that can be
    # built without Redis show the parser reads them exactly.
    built: dict[str, str] = {}
    for metrics in (AggregatorMetrics(), SnapshotMetrics(), ControlMetrics(), IngestMetrics()):
        built |= registry_families(metrics.registry)
    parsed: dict[str, str] = {}
    files = (
        "aggregator/metrics.py",
        "snapshot/metrics.py",
        "control/metrics.py",
        "ingest/metrics.py",
    )
    for file in files:
        parsed |= defined_families(ROOT / "services" / file)
    assert parsed == built
    assert len(built) >= 20


def test_promql_metric_names_finds_selectors_only() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, job) (rate(a_bucket{job=~"x|y"}[$__rate_interval])))'
        " / on (job) group_left sum(b_total offset 5m) + 1e3 * up"
    )
    assert promql_metric_names(expr) == {"a_bucket", "b_total", "up"}


def test_grafana_panels_query_only_metrics_the_services_export() -> None:
    exported = exported_metric_names()
    queried = set()
    for path, panel in dashboard_panels():
        assert panel["targets"], (path.name, panel["title"])
        for target in panel["targets"]:
            names = promql_metric_names(target["expr"])
            assert names, (panel["title"], target["expr"])
            assert names <= exported, (panel["title"], sorted(names - exported))
            queried |= names
    assert len(queried) >= 20


def test_grafana_dashboard_shows_what_operators_watch() -> None:
    queried = {
        name
        for _, panel in dashboard_panels()
        for target in panel["targets"]
        for name in promql_metric_names(target["expr"])
    }
    for needed in (
        "fedasync_aggregator_staleness_bucket",  # τ histogram
        "fedasync_aggregator_alpha_bucket",  # α histogram
        "fedasync_aggregator_decisions_total",  # update rate, decisions by outcome
        "fedasync_aggregator_lag",
        "fedasync_aggregator_pending",
        "fedasync_aggregator_model_version",
        "fedasync_evaluator_accuracy",
        "fedasync_snapshot_requests_total",
        "fedasync_ingest_accepted_total",
        "fedasync_ingest_refusals_total",
    ):
        assert needed in queried, needed
    kinds = {panel["type"] for _, panel in dashboard_panels()}
    assert "heatmap" in kinds  # the τ and α distributions, not only their quantiles


def test_a_task_of_ones_own_can_be_built_into_both_images() -> None:
    """docs/your-model.md: TASK_PACKAGES goes to pip in both images; the task name defaults to
    digits; SERVICES_TORCH adds torch to the services image only."""
    assert COMPOSE["x-fedasync-env"]["FEDASYNC_TASK__NAME"] == "${FEDASYNC_TASK__NAME:-digits}"
    services_args = COMPOSE["x-services-image"]["build"]["args"]
    assert services_args == BUILD_SETTINGS | {
        "TASK_PACKAGES": "${TASK_PACKAGES:-}",
        "SERVICES_TORCH": "${SERVICES_TORCH:-false}",
    }
    assert SERVICES["worker"]["build"]["args"] == BUILD_SETTINGS | {
        "TASK_PACKAGES": "${TASK_PACKAGES:-}"
    }
    for path in (ROOT / "docker").glob("*Dockerfile"):
        text = path.read_text()
        assert 'ARG TASK_PACKAGES=""' in text, path.name
        assert 'if [ -n "$TASK_PACKAGES" ]; then pip install $TASK_PACKAGES; fi' in text, path.name
    services = (ROOT / "docker" / "Dockerfile").read_text()
    assert 'pip install torch==2.13.0 --index-url "$TORCH_INDEX_URL"' in services


# ------------------------------------------------------------- Redis under Sentinel (`ha`)
REPLICAS = ("redis-replica", "redis-replica-2")
HA = {*REPLICAS, "sentinel-1", "sentinel-2", "sentinel-3"}
SENTINELS = sorted(name for name in HA if name.startswith("sentinel-"))
SENTINEL_TEMPLATE = ROOT / "docker" / "redis" / "sentinel.conf"
SENTINEL_USERS = ROOT / "docker" / "redis" / "sentinel-users.acl"
SENTINEL_ENTRYPOINT = ROOT / "docker" / "redis" / "sentinel-entrypoint.sh"
#: what the compose Sentinels watch: `redis` first, two of three agreeing, 5 s of silence
COMPOSE_SENTINEL = {
    "master_name": "fedasync",
    "host": "redis",
    "port": 6379,
    "quorum": 2,
    "down_after_ms": 5000,
    "failover_timeout_ms": 60000,
}


def test_the_ha_profile_adds_a_replica_and_three_sentinels_that_nothing_else_needs() -> None:
    assert {name for name, s in SERVICES.items() if "ha" in s.get("profiles", [])} == HA
    for name, service in SERVICES.items():
        if name not in HA:
            assert not set(service.get("depends_on", {})) & HA, name
    for name in HA:
        assert SERVICES[name]["image"] == SERVICES["redis"]["image"], name
        assert "healthcheck" in SERVICES[name], name
        assert not published(name), f"{name}: nothing of Redis faces the host"


@pytest.mark.parametrize("name", REPLICAS)
def test_each_replica_is_the_primary_s_server_following_it(name: str) -> None:
    """Two replicas: with min-replicas-to-write 1, the loss of one does not stop writes."""
    primary, replica = argv(SERVICES["redis"]), argv(SERVICES[name])
    assert replica[: len(primary)] == primary  # ACL file, AOF, limits, replication user
    assert replica[len(primary) :] == [
        "--replicaof",
        "redis",
        "6379",
        "--replica-announce-ip",
        name,
    ]
    command = " ".join(SERVICES["redis"]["command"])
    # either may be the primary: each logs in to the other as `replica`
    assert "--masteruser replica --masterauth ${REDIS_PASSWORD_REPLICA}" in command
    assert environment(name) == environment("redis")
    assert bind_mounts(name) == bind_mounts("redis")
    assert f"{name}-data:/data" in SERVICES[name]["volumes"]


def test_durable_mode_is_on_by_default_once_the_sentinels_are_set() -> None:
    """The services' durable mode is left to its default (on with Sentinels) unless set, and
    the servers' min-replicas-to-write follows it: the services' value, else 1 with the
    Sentinels, else none (the entrypoint reads an empty value as 0)."""
    assert environment("aggregator")["FEDASYNC_REDIS__DURABLE_REPLICAS"] == (
        "${FEDASYNC_REDIS__DURABLE_REPLICAS:-}"
    )
    assert environment("redis")["REDIS_MIN_REPLICAS_TO_WRITE"] == (
        "${FEDASYNC_REDIS__DURABLE_REPLICAS:-${FEDASYNC_REDIS__SENTINELS:+1}}"
    )


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
@pytest.mark.parametrize(
    ("value", "added"),
    [
        ("", ""),
        ("0", ""),
        ("1", " --min-replicas-to-write 1 --min-replicas-max-lag 4"),
        ("2", " --min-replicas-to-write 2 --min-replicas-max-lag 4"),
    ],
)
def test_redis_entrypoint_adds_min_replicas_to_write_with_a_lag_below_down_after(
    tmp_path: Path, value: str, added: str
) -> None:
    env = {u.password_variable: f"{u.name}-password-0123456789" for u in all_users("fedasync")}
    result = render_acl(tmp_path, env | {"REDIS_MIN_REPLICAS_TO_WRITE": value})
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"started: redis-server --aclfile {tmp_path / 'users.acl'}{added}\n"
    assert SHIPPED_MIN_REPLICAS_MAX_LAG_S == 4 < COMPOSE_SENTINEL["down_after_ms"] / 1000


def test_every_password_the_acl_file_names_reaches_the_redis_containers() -> None:
    named = set(re.findall(r"\$\{(REDIS_PASSWORD_\w+)\}", ACL_TEMPLATE.read_text()))
    assert {"REDIS_PASSWORD_REPLICA", "REDIS_PASSWORD_SENTINEL"} <= named
    for name in ("redis", *REPLICAS):
        env = environment(name)
        for variable in named:
            assert env[variable].startswith("${" + variable + ":?"), (name, variable)


def test_the_sentinel_templates_are_what_the_generators_make() -> None:
    placeholder = "${REDIS_PASSWORD_SENTINEL}"
    expected = sentinel_conf(**COMPOSE_SENTINEL, sentinel_password=placeholder, hostnames=True)
    assert SENTINEL_TEMPLATE.read_text() == expected
    assert SENTINEL_USERS.read_text() == sentinel_acl(), "run: fedasync acl --sentinel"
    assert COMPOSE_SENTINEL["quorum"] * 2 > len(SENTINELS)  # a majority of the Sentinels


def test_each_sentinel_keeps_its_own_state_and_renders_the_templates() -> None:
    volumes = set()
    for name in SENTINELS:
        service = SERVICES[name]
        assert argv(service) == ["sh", "/usr/local/etc/redis/sentinel-entrypoint.sh"], name
        mounts = bind_mounts(name)
        assert mounts["/usr/local/etc/redis/sentinel.conf.template"] == SENTINEL_TEMPLATE
        assert mounts["/usr/local/etc/redis/sentinel-users.acl.template"] == SENTINEL_USERS
        assert mounts["/usr/local/etc/redis/sentinel-entrypoint.sh"] == SENTINEL_ENTRYPOINT
        assert mounts["/usr/local/etc/redis/entrypoint.sh"] == REDIS_ENTRYPOINT
        [data] = [v for v in service["volumes"] if str(v).endswith(":/data")]
        volumes.add(data)
        env = environment(name)
        for variable in ("REDIS_PASSWORD_SENTINEL", "REDIS_PASSWORD_DISCOVERY"):
            assert env[variable].startswith("${" + variable + ":?"), (name, variable)
        assert "26379" in service["healthcheck"]["test"], name
    assert len(volumes) == len(SENTINELS)  # no two share what they learned


def test_the_services_ask_the_sentinels_only_when_the_shell_names_them() -> None:
    shared = {str(k): str(v) for k, v in COMPOSE["x-fedasync-env"].items()}
    assert shared["FEDASYNC_REDIS__SENTINELS"] == "${FEDASYNC_REDIS__SENTINELS:-}"
    assert shared["FEDASYNC_REDIS__SENTINEL_USERNAME"] == "discovery"
    assert shared["FEDASYNC_REDIS__SENTINEL_PASSWORD"] == "${REDIS_PASSWORD_DISCOVERY:-}"
    # unset in the shell: the default, on with the Sentinels (test_durable_mode_is_on_by_default)
    assert shared["FEDASYNC_REDIS__DURABLE_REPLICAS"] == "${FEDASYNC_REDIS__DURABLE_REPLICAS:-}"
    # the value the file's header tells to export names the three Sentinels
    [documented] = re.findall(r"FEDASYNC_REDIS__SENTINELS=(\S+)", COMPOSE_TEXT)
    settings = RedisSettings(sentinels=documented)
    assert sorted(host for host, _ in settings.sentinel_list) == SENTINELS
    assert {port for _, port in settings.sentinel_list} == {26379}
    assert RedisSettings(sentinels="").sentinels is None  # unset in the shell: no Sentinel
    assert RedisSettings(sentinels=documented, durable_replicas="").durability.replicas == 1


def run_sentinel_entrypoint(
    tmp_path: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """The Sentinel's entrypoint with the templates where the compose file mounts them (here,
    a folder) and a stand-in for the image's own entrypoint."""
    templates = tmp_path / "templates"
    templates.mkdir(exist_ok=True)
    for source, name in (
        (REDIS_ENTRYPOINT, "entrypoint.sh"),
        (SENTINEL_TEMPLATE, "sentinel.conf.template"),
        (SENTINEL_USERS, "sentinel-users.acl.template"),
    ):
        (templates / name).write_text(source.read_text())
    stub = tmp_path / "docker-entrypoint.sh"
    stub.write_text('#!/bin/sh\nif [ "$1" = true ]; then exit 0; fi\necho "started: $*"\n')
    stub.chmod(0o755)
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    base = {
        "PATH": f"{tmp_path}:/usr/bin:/bin",
        "SENTINEL_DIR": str(data),
        "SENTINEL_TEMPLATES": str(templates),
    }
    return subprocess.run(
        ["sh", str(SENTINEL_ENTRYPOINT)],
        env=base | env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_the_sentinel_entrypoint_writes_its_file_once_and_keeps_what_sentinel_learned(
    tmp_path: Path,
) -> None:
    passwords = {"sentinel": "sentinel-Pw.~_0-0123456789", "discovery": "discovery-Pw-0123456"}
    env = {"REDIS_PASSWORD_" + k.upper(): v for k, v in passwords.items()}
    result = run_sentinel_entrypoint(tmp_path, env)
    assert result.returncode == 0, result.stderr
    conf = tmp_path / "data" / "sentinel.conf"
    assert result.stdout == f"started: redis-server {conf} --sentinel\n"
    expected = sentinel_conf(
        **COMPOSE_SENTINEL, sentinel_password=passwords["sentinel"], hostnames=True
    ) + sentinel_acl(passwords)
    assert conf.read_text() == expected
    assert conf.stat().st_mode & 0o077 == 0  # passwords: owner only
    # Sentinel rewrites the file with what it learns; a restart starts from that, not anew
    conf.write_text("# rewritten by Sentinel\n")
    assert run_sentinel_entrypoint(tmp_path, env).returncode == 0
    assert conf.read_text() == "# rewritten by Sentinel\n"


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_the_sentinel_entrypoint_refuses_to_start_without_a_usable_password(
    tmp_path: Path,
) -> None:
    result = run_sentinel_entrypoint(tmp_path, {"REDIS_PASSWORD_SENTINEL": "sentinel-pw-0123456"})
    assert result.returncode != 0
    assert "REDIS_PASSWORD_DISCOVERY is not set" in result.stderr
    assert "started" not in result.stdout
    assert list((tmp_path / "data").iterdir()) == []  # nothing half-written


# ------------------------------------------------------- builds without Docker Hub or PyPI
#: the build arguments compose takes from the shell (no value in the file: unset stays unset)
BUILD_SETTINGS = dict.fromkeys(
    ["PYTHON_IMAGE", "PIP_INDEX_URL", "PIP_NO_INDEX", "PIP_FIND_LINKS", "TORCH_INDEX_URL"]
)
WHEELS = ROOT / "docker" / "wheels"


def test_the_base_image_is_named_by_a_build_argument() -> None:
    for path in (ROOT / "docker").glob("*Dockerfile"):
        lines = [line for line in dockerfile_lines(path) if line and not line.startswith("#")]
        assert lines[0] == "ARG PYTHON_IMAGE=python:3.11-slim", path.name
        assert lines[1] == "FROM ${PYTHON_IMAGE}", path.name
        assert sum(line.startswith("FROM ") for line in lines) == 1, path.name


def test_pip_settings_are_build_arguments_that_stay_out_of_the_image() -> None:
    """pip reads PIP_INDEX_URL, PIP_NO_INDEX and PIP_FIND_LINKS from the build's environment;
    without a default, an argument not given is not set at all (the base image's own stays)."""
    for path in (ROOT / "docker").glob("*Dockerfile"):
        args = dockerfile_args(path)
        for name in ("PIP_INDEX_URL", "PIP_NO_INDEX", "PIP_FIND_LINKS"):
            assert args[name] is None, (path.name, name)
        env = [line for line in dockerfile_lines(path) if line.startswith("ENV ")]
        assert not any(name in line for line in env for name in BUILD_SETTINGS), path.name


def test_every_pip_install_sees_the_wheelhouse() -> None:
    mount = "--mount=type=bind,source=docker/wheels,target=/wheels"
    for path in (ROOT / "docker").glob("*Dockerfile"):
        for line in dockerfile_lines(path):
            if line.startswith("RUN ") and "pip install" in line:
                flags, _ = run_flags_and_script(line)
                assert flags == [mount], (path.name, line)
    assert (WHEELS / "README.md").is_file()  # the mount's source exists in a fresh clone
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not any(fnmatch.fnmatch("docker/wheels", p.strip("/")) for p in ignored)
    assert not any(fnmatch.fnmatch("docker", p.strip("/")) for p in ignored)


def test_compose_passes_the_build_settings_from_the_shell_only_when_set() -> None:
    for name in ("aggregator", "worker"):
        args = SERVICES[name]["build"]["args"]
        assert {k: args[k] for k in BUILD_SETTINGS} == BUILD_SETTINGS, name


def test_the_wheelhouse_script_covers_what_the_images_install() -> None:
    """docker/wheelhouse.sh takes, through docker/requirements.py as the Dockerfiles do, the
    build requirements, the dependencies and every extra an image installs, and torch's CPU
    wheel; each Dockerfile installs its extras' requirements before it copies the code."""
    script = (ROOT / "docker" / "wheelhouse.sh").read_text()
    call = re.search(
        r'docker/requirements\.py" --pyproject "\$root/pyproject.toml" --build (.*)', script
    )
    assert call is not None
    covered = set(call.group(1).split())
    for path in (ROOT / "docker").glob("*Dockerfile"):
        extras = set(project_extras(path)) - {""}
        assert extras <= covered, path.name
        (listed,) = re.findall(r"python requirements\.py ([\w ]+) >", path.read_text())
        assert set(listed.split()) == extras, path.name
    assert "+cpu-" in script  # a CUDA build of torch stops it
    assert (ROOT / "docker" / "wheelhouse.sh").stat().st_mode & 0o111
    gitignore = (ROOT / ".gitignore").read_text().splitlines()
    assert "docker/wheels/*" in gitignore
    assert "!docker/wheels/README.md" in gitignore


# --------------------------------------------------------------- the TLS edge (profile `edge`)
EDGE_CONF = ROOT / "docker" / "edge" / "nginx.conf"
EDGE_CERTS = ROOT / "docker" / "edge" / "certs"


def edge_directives() -> str:
    """docker/edge/nginx.conf without its comments: what nginx reads."""
    return "\n".join(line.split("#")[0] for line in EDGE_CONF.read_text().splitlines())


def test_the_edge_is_a_profile_on_loopback_unless_told_otherwise() -> None:
    """Opt-in (its certificate must exist first); `EDGE_BIND` unset, it binds 127.0.0.1 like
    every other published port, and it is the only service that serves TLS."""
    edge = SERVICES["edge"]
    assert edge["profiles"] == ["edge"]
    assert edge["image"] == "nginx:1.27-alpine"
    assert published("edge") == [("127.0.0.1", 8443, 443), ("127.0.0.1", 8080, 80)]
    for spec in edge["ports"]:
        assert str(spec).startswith("${EDGE_BIND:-127.0.0.1}:"), spec
    assert "${EDGE_CERTS:-./docker/edge/certs}:/etc/nginx/certs:ro" in edge["volumes"]
    mounts = bind_mounts("edge")
    assert mounts["/etc/nginx/nginx.conf"] == EDGE_CONF
    assert mounts["/etc/nginx/certs"] == EDGE_CERTS
    assert set(edge["depends_on"]) == {"ingest", "snapshot"}
    assert "8079/healthz" in " ".join(edge["healthcheck"]["test"])
    assert "listen 127.0.0.1:8079;" in edge_directives()


def test_the_edge_proxies_the_device_routes_to_the_real_services_and_nothing_else() -> None:
    from fedasync.shared.ingest_protocol import PATH
    from fedasync.shared.snapshot_protocol import LATEST_PATH as LATEST

    text = edge_directives()
    upstreams = dict(re.findall(r"set \$(\w+) http://([\w.-]+:\d+);", text))
    assert upstreams == {
        "ingest": f"ingest:{configured_port('ingest')}",
        "snapshot": f"snapshot:{configured_port('snapshot')}",
    }
    locations = re.findall(r"location ([=~^]*\s*\S+) \{", text)
    assert sorted(locations) == sorted(
        [
            "= /healthz",  # the healthcheck's, on loopback only
            f"= {PATH}",
            f"^~ {PATH}/",  # receipts
            f"= {LATEST}",
            f"= {LATEST}/meta",
            "~ ^/v1/models/[0-9]+/meta$",
            "~ ^/v1/models/[0-9]+$",
            "/",
        ]
    )
    assert re.search(r"location / \{\s*return 404;", text)  # no metrics, health, control
    assert "proxy_cache models;" in text  # versioned models only: the one cached location
    assert text.count("proxy_cache models;") == 1


def test_the_edge_outlasts_a_long_poll_and_takes_the_largest_update() -> None:
    text = edge_directives()
    read = re.search(r"proxy_read_timeout (\d+)s;", text)
    assert read is not None
    assert int(read.group(1)) > Settings().snapshot.long_poll_max_s
    body = re.search(r"client_max_body_size (\d+)m;", text)
    assert body is not None
    # the largest body ingest reads unless FEDASYNC_INGEST__MAX_BODY_BYTES says otherwise
    assert int(body.group(1)) * 1024 * 1024 >= Settings().wire.max_message_bytes


def test_the_edge_redirects_plain_http_and_reads_the_documented_certificate() -> None:
    text = edge_directives()
    assert "listen 443 ssl default_server;" in text
    assert re.search(r"listen 80 default_server;\s*server_name _;\s*return 308 https://", text)
    assert "error_page 497 =308 https://" in text  # plain HTTP sent to the TLS port
    assert "ssl_certificate /etc/nginx/certs/edge.crt;" in text
    assert "ssl_certificate_key /etc/nginx/certs/edge.key;" in text
    readme = (EDGE_CERTS / "README.md").read_text()
    assert "-keyout docker/edge/certs/edge.key -out docker/edge/certs/edge.crt" in readme
    assert "DNS:edge" in readme  # the name workers inside the compose network use
    gitignore = (ROOT / ".gitignore").read_text().splitlines()
    assert "docker/edge/certs/*" in gitignore
    assert "!docker/edge/certs/README.md" in gitignore
    assert "docker/edge/certs" in (ROOT / ".dockerignore").read_text().splitlines()


# --------------------------------------------- many runs on a Redis Cluster (`cluster`, `runs`)
NODES = [f"redis-node-{i}" for i in range(1, 7)]
CLUSTER = {*NODES, "redis-cluster-create"}
CLUSTER_CREATE = ROOT / "docker" / "redis" / "cluster-create.sh"
#: where the supervisor writes its targets, and where Prometheus reads them
TARGETS_VOLUME = "supervisor-targets"


def named_volumes(name: str) -> dict[str, str]:
    """Named volume → container path (and `:ro` if read-only) of a service's volume mounts."""
    out = {}
    for spec in SERVICES[name].get("volumes", []):
        source, _, rest = str(spec).partition(":")
        if not source.startswith((".", "$", "/")):
            out[source] = rest
    return out


def node_flags(name: str) -> dict[str, str]:
    """A node's `--flag value` pairs after `redis-server`."""
    command = [str(a) for a in SERVICES[name]["command"]]
    assert command[0] == "redis-server", name
    pairs = command[1:]
    assert len(pairs) % 2 == 0, name
    assert all(f.startswith("--") for f in pairs[::2]), name
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def test_the_cluster_profile_adds_six_nodes_and_their_maker_that_nothing_else_needs() -> None:
    assert {name for name, s in SERVICES.items() if "cluster" in s.get("profiles", [])} == CLUSTER
    for name in CLUSTER:
        assert SERVICES[name]["image"] == SERVICES["redis"]["image"], name
        assert not published(name), f"{name}: nothing of Redis faces the host"
    for name in NODES:
        assert "healthcheck" in SERVICES[name], name
        assert SERVICES[name]["healthcheck"]["test"] == SERVICES["redis"]["healthcheck"]["test"]
        assert SERVICES[name]["restart"] == SERVICES["redis"]["restart"], name


@pytest.mark.parametrize("name", NODES)
def test_each_node_is_the_compose_redis_in_cluster_mode_announcing_its_name(name: str) -> None:
    flags, redis = node_flags(name), node_flags("redis")
    # the one Redis's durability, limits and replication user (ACL file: the cluster's own)
    for flag in ("--appendonly", "--appendfsync", "--maxmemory-policy", "--masteruser"):
        assert flags[flag] == redis[flag], (name, flag)
    assert flags["--masterauth"] == "${REDIS_PASSWORD_REPLICA}"
    assert flags["--aclfile"] == ACL_TARGET
    assert flags["--cluster-enabled"] == "yes"
    assert flags["--cluster-config-file"] == "nodes.conf"  # in /data, its own volume
    assert flags["--cluster-announce-hostname"] == name
    assert flags["--cluster-preferred-endpoint-type"] == "hostname"
    assert flags["--cluster-require-full-coverage"] == "no"
    # every node alike but for its name
    first = node_flags(NODES[0]) | {"--cluster-announce-hostname": name}
    assert flags == first
    assert argv(SERVICES[name])[:2] == ["sh", "/usr/local/etc/redis/entrypoint.sh"]
    mounts = bind_mounts(name)
    assert mounts[ACL_TARGET + ".template"] == CLUSTER_ACL_TEMPLATE
    assert mounts["/usr/local/etc/redis/entrypoint.sh"] == REDIS_ENTRYPOINT
    assert named_volumes(name) == {f"{name}-data": "/data"}


def test_every_password_the_cluster_acl_file_names_reaches_every_node() -> None:
    named = set(re.findall(r"\$\{(REDIS_PASSWORD_\w+)\}", CLUSTER_ACL_TEMPLATE.read_text()))
    assert {"REDIS_PASSWORD_SUPERVISOR", "REDIS_PASSWORD_CLUSTER_ADMIN"} <= named
    for name in NODES:
        env = environment(name)
        for variable in named:
            assert env[variable].startswith("${" + variable + ":"), (name, variable)
    assert acl_users(CLUSTER_ACL_TEMPLATE)[CLUSTER_ADMIN_USER] == "${REDIS_PASSWORD_CLUSTER_ADMIN}"


def test_the_cluster_is_made_once_by_a_one_shot_as_cluster_admin() -> None:
    maker = SERVICES["redis-cluster-create"]
    assert argv(maker) == ["sh", "/usr/local/etc/redis/cluster-create.sh"]
    assert bind_mounts("redis-cluster-create") == {
        "/usr/local/etc/redis/cluster-create.sh": CLUSTER_CREATE
    }
    env = environment("redis-cluster-create")
    assert env["CLUSTER_NODES"].split() == [f"{n}:6379" for n in NODES]
    assert env["REDIS_PASSWORD_CLUSTER_ADMIN"] == "${REDIS_PASSWORD_CLUSTER_ADMIN:-}"
    assert "CLUSTER_ADMIN_USER" not in env  # the script's default, the ACL file's user
    assert f"user=${{CLUSTER_ADMIN_USER:-{CLUSTER_ADMIN_USER}}}" in CLUSTER_CREATE.read_text()
    assert {n: c["condition"] for n, c in maker["depends_on"].items()} == dict.fromkeys(
        NODES, "service_healthy"
    )
    assert maker["restart"] == "no"  # a one-shot: its exit is what the services wait for
    assert "healthcheck" not in maker


def test_every_fedasync_service_waits_for_the_cluster_only_under_its_profile() -> None:
    for name in SERVICES:
        if not ours(name):
            continue
        made = SERVICES[name]["depends_on"]["redis-cluster-create"]
        assert made == {"condition": "service_completed_successfully", "required": False}, name


def test_the_services_use_the_cluster_only_when_the_shell_names_its_nodes() -> None:
    shared = {str(k): str(v) for k, v in COMPOSE["x-fedasync-env"].items()}
    assert shared["FEDASYNC_REDIS__CLUSTER"] == "${FEDASYNC_REDIS__CLUSTER:-}"
    assert RedisSettings(cluster="").cluster is None  # unset in the shell: the one Redis
    # the value the file's header tells to export names the six nodes
    [documented] = re.findall(r"FEDASYNC_REDIS__CLUSTER=(\S+)", COMPOSE_TEXT)
    settings = RedisSettings(cluster=documented, url="redis://aggregator:pw@redis:6379/0")
    assert documented.split(",") == [f"{n}:6379" for n in NODES]
    assert settings.durability.replicas == 1  # durable mode on with the cluster by default
    assert "docker compose --profile cluster --profile runs up -d" in COMPOSE_TEXT


def test_the_runs_profile_is_the_supervisor_leaving_the_default_run_to_the_aggregator() -> None:
    assert {name for name, s in SERVICES.items() if "runs" in s.get("profiles", [])} == {
        "supervisor"
    }
    supervisor, env = SERVICES["supervisor"], environment("supervisor")
    assert module_of(supervisor) == "fedasync.services.supervisor"
    assert env["FEDASYNC_SUPERVISOR__SKIP_DEFAULT"] == "true"  # the `aggregator` has it
    assert "profiles" not in SERVICES["aggregator"]
    for key in ("restart", "stop_grace_period"):
        assert supervisor[key] == SERVICES["aggregator"][key], key
    # each run's processes bind every interface, for Prometheus in its own container, and the
    # evaluators follow the snapshot service
    assert env["FEDASYNC_AGGREGATOR__HOST"] == env["FEDASYNC_EVALUATOR__HOST"] == "0.0.0.0"
    assert (
        env["FEDASYNC_EVALUATOR__SNAPSHOT_URL"]
        == environment("evaluator")["FEDASYNC_EVALUATOR__SNAPSHOT_URL"]
    )
    assert supervisor["depends_on"]["snapshot"]["condition"] == "service_healthy"
    # it logs in as `supervisor`, which only reads; its children as their roles' users
    users = {variable: user for variable, user, _ in redis_user_urls("supervisor")}
    assert users == {
        "FEDASYNC_REDIS__URL": "supervisor",
        "FEDASYNC_SUPERVISOR__AGGREGATOR_REDIS_URL": "aggregator",
        "FEDASYNC_SUPERVISOR__EVALUATOR_REDIS_URL": "evaluator",
    }
    log_dir = Path(env["FEDASYNC_SUPERVISOR__LOG_DIR"])
    assert log_dir.is_relative_to("/home/fedasync")  # the image's user's, writable


def test_prometheus_reads_the_targets_the_supervisor_writes() -> None:
    """One named volume: the supervisor writes its file_sd list into it, naming its children by
    its service name; Prometheus reads it, read-only, where its `runs` job looks."""
    env = environment("supervisor")
    targets = Path(env["FEDASYNC_SUPERVISOR__TARGETS_FILE"])
    assert named_volumes("supervisor")[TARGETS_VOLUME] == str(targets.parent)
    assert env["FEDASYNC_SUPERVISOR__TARGETS_HOST"] == "supervisor"
    assert TARGETS_VOLUME in COMPOSE["volumes"]
    seen_at = named_volumes("prometheus")[TARGETS_VOLUME]
    assert seen_at.endswith(":ro")
    config = yaml.safe_load(PROMETHEUS_FILE.read_text())
    (runs,) = [job for job in config["scrape_configs"] if job["job_name"] == "runs"]
    (listed,) = [f for sd in runs["file_sd_configs"] for f in sd["files"]]
    assert fnmatch.fnmatch(f"{seen_at.removesuffix(':ro')}/{targets.name}", listed)
    assert runs["honor_labels"] is True  # the children's own `run` label, not exported_run
    # the image makes the folder the volume is mounted on, owned by its user (a fresh named
    # volume takes that owner), so that the supervisor, not root, may write there
    assert f"install -d -o fedasync -g fedasync {targets.parent}" in " ".join(
        dockerfile_lines(dockerfile_of("supervisor"))
    )


def test_the_operations_guide_shows_the_command_of_the_two_profiles() -> None:
    guide = (ROOT / "docs" / "operations.md").read_text()
    heading = "### Compose: many runs and a Redis Cluster\n"
    assert heading in guide
    text = guide.split(heading, 1)[1].split("\n## ", 1)[0]
    [documented] = re.findall(r"FEDASYNC_REDIS__CLUSTER=(\S+)", text)
    assert documented == re.findall(r"FEDASYNC_REDIS__CLUSTER=(\S+)", COMPOSE_TEXT)[0]
    assert "docker compose --profile cluster --profile runs up -d" in text


# The one-shot's script, run with stand-ins for redis-cli and getent: a cluster is made only of
# nodes that are all empty, a made one is left as it is, and a half-made one is refused.
FAKE_REDIS_CLI = r"""#!/bin/sh
# stand-in redis-cli: logs its arguments; CLUSTER INFO from $STATE/<host> ("known slots state")
echo "$* auth=$REDISCLI_AUTH" >>"$STATE/calls"
host=""
while [ $# -gt 0 ]; do
    case $1 in
        -h) host=$2; shift 2 ;;
        -p | --user) shift 2 ;;
        --cluster) for f in "$STATE"/redis-node-*; do echo "6 16384 ok" >"$f"; done; exit 0 ;;
        cluster) [ -f "$STATE/$host" ] || exit 1
                 read -r known slots state <"$STATE/$host"
                 printf 'cluster_state:%s\r\n' "$state"
                 printf 'cluster_slots_assigned:%s\r\ncluster_known_nodes:%s\r\n' "$slots" "$known"
                 exit 0 ;;
        *) shift ;;
    esac
done
"""
FAKE_GETENT = r"""#!/bin/sh
# stand-in getent: redis-node-N is 10.0.0.N
echo "10.0.0.${2##*-} $2"
"""


def run_cluster_create(
    tmp_path: Path, states: dict[str, str], **env: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir, state = tmp_path / "bin", tmp_path / "state"
    bin_dir.mkdir(exist_ok=True)
    state.mkdir(exist_ok=True)
    for name, text in (("redis-cli", FAKE_REDIS_CLI), ("getent", FAKE_GETENT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for node, value in states.items():
        (state / node).write_text(value + "\n")
    base = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "STATE": str(state),
        "CLUSTER_NODES": environment("redis-cluster-create")["CLUSTER_NODES"],
        "CLUSTER_SETTLE_S": "2",
        "REDIS_PASSWORD_CLUSTER_ADMIN": "admin-Pw-0123456789",
    }
    result = subprocess.run(
        ["sh", str(CLUSTER_CREATE)], env=base | env, capture_output=True, text=True, check=False
    )
    calls = (state / "calls").read_text().splitlines() if (state / "calls").exists() else []
    return result, calls


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_the_cluster_maker_makes_a_cluster_of_empty_nodes_by_their_addresses(
    tmp_path: Path,
) -> None:
    result, calls = run_cluster_create(tmp_path, dict.fromkeys(NODES, "1 0 fail"))
    assert result.returncode == 0, result.stderr
    (create,) = [c for c in calls if "--cluster create" in c]
    addresses = " ".join(f"10.0.0.{i}:6379" for i in range(1, 7))
    assert create == (
        f"--user {CLUSTER_ADMIN_USER} --no-auth-warning --cluster create {addresses} "
        "--cluster-replicas 1 --cluster-yes auth=admin-Pw-0123456789"
    )
    assert all(f"--user {CLUSTER_ADMIN_USER}" in c for c in calls)
    assert "the cluster is made" in result.stdout


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_the_cluster_maker_leaves_a_made_cluster_as_it_is(tmp_path: Path) -> None:
    result, calls = run_cluster_create(tmp_path, dict.fromkeys(NODES, "6 16384 ok"))
    assert result.returncode == 0, result.stderr
    assert not [c for c in calls if "--cluster" in c.split()]
    assert "the cluster exists" in result.stdout


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
@pytest.mark.parametrize(
    ("states", "env", "complaint"),
    [
        # one node lost its volume: adding it back is an operator's decision
        (
            {**dict.fromkeys(NODES, "6 16384 ok"), "redis-node-4": "1 0 fail"},
            {},
            "nodes outside it: redis-node-4:6379",
        ),
        ({n: "1 0 fail" for n in NODES if n != "redis-node-6"}, {}, "redis-node-6:6379 does not"),
        (dict.fromkeys(NODES, "1 0 fail"), {"REDIS_PASSWORD_CLUSTER_ADMIN": ""}, "is not set"),
        (dict.fromkeys(NODES, "6 16384 fail"), {}, "cluster_state is fail after 2 s"),
    ],
)
def test_the_cluster_maker_refuses_what_it_cannot_make_sense_of(
    tmp_path: Path, states: dict[str, str], env: dict[str, str], complaint: str
) -> None:
    result, calls = run_cluster_create(tmp_path, states, **env)
    assert result.returncode != 0
    assert complaint in result.stderr, result.stderr
    assert not [c for c in calls if "--cluster" in c.split()]  # nothing made
