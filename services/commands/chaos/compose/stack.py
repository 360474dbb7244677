"""One Docker Compose project of the repository's docker-compose.yml, driven as a user drives it.

`fedasync chaos --compose` and the compose tests (tests/compose/) run the unmodified compose file
and Dockerfiles through the `docker` and `docker compose` commands a user types: build, up, ps,
port, restart, stop, run, logs, down. Only the kill is not a docker command: `docker kill` is a
manual stop to the engine, which then does not apply the restart policy, whereas a crash does;
so a kill here is SIGKILL to the container's main process by its pid on the engine's host (the
engine must run on this host, and this process must be allowed to signal it: root).

What compose interpolates (the seven Redis passwords, the control token, budgets, the workers'
journal) is made fresh for each stack and passed in the environment of each command. Neither the
caller's FEDASYNC_ and REDIS_PASSWORD_ variables nor the repository's `.env` take part
(`--env-file /dev/null`): a run depends only on what is passed here. Build settings (PIP_*,
PYTHON_IMAGE, TORCH_INDEX_URL, proxies) are taken from the caller's environment, as compose does.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedasync.services.runtime.settings import RedisSettings
from fedasync.services.stores.acl import password_variables

COMPOSE_FILE = "docker-compose.yml"
#: the one-off tools service (profile `tools`): the `fedasync` command as the admin Redis user
TOOLS = "fedasync"
WORKER = "worker"
GRAFANA = "grafana"
#: the services whose image the build makes: every other of ours shares the services image
BUILT = ("aggregator", WORKER)
#: where each worker of a chaos run journals its publishes, inside its own container
JOURNAL_PATH = "/tmp/fedasync-publish.journal"
#: variables of the caller's environment that never reach compose (the stack sets its own)
PRIVATE_PREFIXES = ("FEDASYNC_", "REDIS_PASSWORD_", "GRAFANA_ADMIN_PASSWORD")
POLL_S = 0.5


class ComposeError(RuntimeError):
    """A docker or docker compose command failed; the message has its output."""


def engine_problem(timeout_s: float = 60.0) -> str | None:
    """Why no stack can run here (no docker CLI, no engine answering, no compose v2), or None."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    checks = (
        (["docker", "info", "--format", "{{.ServerVersion}}"], "no Docker engine answers"),
        (["docker", "compose", "version", "--short"], "no Docker Compose v2 (`docker compose`)"),
    )
    for command, problem in checks:
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"{problem} (`{' '.join(command)}` took over {timeout_s:.0f} s)"
        if result.returncode != 0:
            detail = (result.stderr or result.stdout).strip().splitlines()
            where = os.environ.get("DOCKER_HOST", "the default socket")
            return f"{problem} at {where}: {detail[-1] if detail else 'no output'}"
    return None


def fresh_settings(**extra: str) -> dict[str, str]:
    """New Redis passwords for every user (as `fedasync acl --new-passwords` makes them) and a
    new control token, plus `extra` (budgets, the workers' journal, ...)."""
    prefix = RedisSettings().key_prefix
    values = {variable: secrets.token_hex(24) for variable in password_variables(prefix)}
    values["FEDASYNC_CONTROL__TOKEN"] = secrets.token_hex(24)
    return values | extra


@dataclass(frozen=True, slots=True)
class Container:
    """One container of the project, as `docker compose ps` lists it."""

    id: str
    name: str
    service: str
    state: str
    #: "healthy", "starting", "unhealthy", or "" for a service without a healthcheck
    health: str
    exit_code: int


@dataclass(frozen=True, slots=True)
class Process:
    """A container's main process and restart count, from `docker inspect`."""

    pid: int
    restarts: int
    running: bool
    health: str


@dataclass(slots=True)
class Stack:
    """The compose project `project` of the repository at `root`."""

    root: Path
    project: str
    #: what compose interpolates: passwords, token, budgets (`fresh_settings`)
    settings: dict[str, str]
    say: Callable[[str], None] = print
    #: the services `up` started (compose's own list, Grafana left out when its image is absent)
    started: list[str] = field(default_factory=list)
    #: why a service was left out, by name
    left_out: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------------- commands
    def env(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(PRIVATE_PREFIXES)}
        return keep | self.settings

    def compose(
        self, *args: str, timeout_s: float = 600.0, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`docker compose -p PROJECT ARGS`, output captured; a failure raises ComposeError."""
        command = [
            "docker",
            "compose",
            "--project-directory",
            str(self.root),
            "-f",
            str(self.root / COMPOSE_FILE),
            "--env-file",
            os.devnull,
            "-p",
            self.project,
            *args,
        ]
        return self._run(command, timeout_s, check, stdin)

    def docker(
        self, *args: str, timeout_s: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self._run(["docker", *args], timeout_s, check, None)

    def _run(
        self, command: list[str], timeout_s: float, check: bool, stdin: str | None
    ) -> subprocess.CompletedProcess[str]:
        try:
            result = subprocess.run(
                command,
                env=self.env(),
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:
            raise ComposeError(f"`{_shown(command)}` took over {timeout_s:.0f} s") from exc
        if check and result.returncode != 0:
            raise ComposeError(
                f"`{_shown(command)}` exited {result.returncode}:\n"
                + _tail("\n".join(t for t in (result.stdout, result.stderr) if t.strip()))
            )
        return result

    # ------------------------------------------------------------------------- life cycle
    def build(self, timeout_s: float = 3600.0) -> float:
        """Build the two images (the services image once, through one service); seconds taken."""
        started = time.monotonic()
        self.compose("build", *BUILT, timeout_s=timeout_s)
        return time.monotonic() - started

    def default_services(self) -> list[str]:
        """What `docker compose up` starts: every service outside a profile, Grafana left out
        (and said why) when its image is not on the engine, since nothing is pulled here."""
        config = json.loads(self.compose("config", "--format", "json").stdout)
        listed = self.compose("config", "--services").stdout.split()
        services = []
        for name in listed:
            image = config["services"][name].get("image", "")
            if name == GRAFANA and not self.has_image(image):
                self.left_out[name] = f"image {image} is not on this engine (nothing is pulled)"
                continue
            services.append(name)
        return services

    def has_image(self, image: str) -> bool:
        return self.docker("image", "inspect", image, check=False).returncode == 0

    def up(self, workers: int, timeout_s: float = 900.0) -> float:
        """Start the stack with `workers` workers and wait until every healthcheck passes;
        returns the seconds from `up` to healthy.

        A project of the same name left by a run that was cut short (its containers stopped, its
        volumes kept) is removed first: its Redis volume holds another run's ledger, whose
        decisions this run's journals never attempted."""
        self.started = self.default_services()
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "20", timeout_s=300)
        started = time.monotonic()
        self.compose(
            "up",
            "--detach",
            "--no-build",
            "--pull",
            "never",
            "--wait",
            "--wait-timeout",
            str(int(timeout_s)),
            "--scale",
            f"{WORKER}={workers}",
            *self.started,
            timeout_s=timeout_s + 60,
        )
        return time.monotonic() - started

    def down(self, logs_to: Path | None = None) -> None:
        """Stop and remove the containers, network and volumes (after saving the logs)."""
        if logs_to is not None:
            logs_to.parent.mkdir(parents=True, exist_ok=True)
            logs = self.compose("logs", "--no-color", "--timestamps", check=False, timeout_s=120)
            logs_to.write_text(logs.stdout + logs.stderr)
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "20", timeout_s=300)

    # ------------------------------------------------------------------------- state
    def containers(self, service: str | None = None) -> list[Container]:
        """The project's containers (stopped ones too), by name; of one service if given."""
        args = ["ps", "--all", "--format", "json"]
        out = self.compose(*args, *([service] if service else [])).stdout.strip()
        rows: list[dict[str, Any]] = []
        if out.startswith("["):
            rows = json.loads(out)
        elif out:
            rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        found = [
            Container(
                str(r["ID"]),
                str(r["Name"]),
                str(r["Service"]),
                str(r["State"]),
                str(r.get("Health") or ""),
                int(r.get("ExitCode") or 0),
            )
            for r in rows
        ]
        return sorted(found, key=lambda c: c.name)

    def process(self, container: str) -> Process:
        form = (
            "{{.State.Pid}} {{.RestartCount}} {{.State.Running}} "
            "{{if .State.Health}}{{.State.Health.Status}}{{end}}"
        )
        words = self.docker("inspect", "--format", form, container).stdout.split()
        return Process(int(words[0]), int(words[1]), words[2] == "true", " ".join(words[3:]))

    def unhealthy(self, services: Iterable[str]) -> list[str]:
        """Containers of `services` not running, or with a healthcheck that has not passed."""
        wanted = set(services)
        return [
            f"{c.name}: {c.state}{' ' + c.health if c.health else ''}"
            for c in self.containers()
            if c.service in wanted and (c.state != "running" or c.health not in ("", "healthy"))
        ]

    def wait_healthy(self, services: Iterable[str], timeout_s: float) -> list[str]:
        """Poll until every container of `services` runs and passes its healthcheck; returns
        what is still not (empty: all healthy)."""
        services = list(services)
        deadline = time.monotonic() + timeout_s
        while True:
            problems = self.unhealthy(services)
            if not problems or time.monotonic() > deadline:
                return problems
            time.sleep(POLL_S)

    def url(self, service: str, port: int) -> str:
        """http://host:port where `service`'s container port `port` is published."""
        published = self.compose("port", service, str(port)).stdout.strip().splitlines()[0]
        host, _, number = published.rpartition(":")
        host = "127.0.0.1" if host in ("0.0.0.0", "") else host.strip("[]")
        return f"http://{host}:{number}"

    # ------------------------------------------------------------------------- faults
    def crash(self, container: str) -> Process:
        """SIGKILL to the container's main process by its host pid: a crash, which the restart
        policy answers (unlike `docker kill`). Returns the process as it was."""
        before = self.process(container)
        if not before.running or before.pid <= 0:
            raise ComposeError(f"{container} is not running: nothing to kill")
        os.kill(before.pid, signal.SIGKILL)
        return before

    def wait_restarted(
        self, container: str, before: Process, timeout_s: float, healthy: bool
    ) -> Process | None:
        """Poll until the engine has restarted `container` (its restart count went up) and it
        runs again, and passes its healthcheck if `healthy`; None past the deadline."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = self.process(container)
            if (
                now.restarts > before.restarts
                and now.running
                and (not healthy or now.health == "healthy")
            ):
                return now
            time.sleep(POLL_S)
        return None

    # ------------------------------------------------------------------------- tools
    def tool(self, *args: str, entrypoint: str | None = None, timeout_s: float = 600.0) -> str:
        """`docker compose run --rm -T fedasync ARGS` (the CLI as the admin Redis user); its
        standard output."""
        extra = ["--entrypoint", entrypoint] if entrypoint else []
        return self.compose("run", "--rm", "-T", *extra, TOOLS, *args, timeout_s=timeout_s).stdout

    def copy_out(self, container: str, path: str, to: Path) -> bool:
        """`docker cp` a file out of a container (running or stopped); False if it has none."""
        to.parent.mkdir(parents=True, exist_ok=True)
        return self.docker("cp", f"{container}:{path}", str(to), check=False).returncode == 0


# ----------------------------------------------------------------------------- HTTP
def http_json(
    url: str, token: str | None = None, *, body: Any = None, timeout_s: float = 30.0
) -> tuple[int, Any]:
    """GET a JSON document, or POST `body` as one: (status, answer); (0, None) when nothing
    answered."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError, ValueError):
        return 0, None


def _shown(command: Sequence[str]) -> str:
    """A command line as shown in errors (no secrets are ever in the arguments)."""
    return " ".join(command)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def settings_lines(settings: Mapping[str, str]) -> str:
    """The settings as `.env` lines, e.g. to run compose by hand against a kept stack."""
    return "".join(f"{k}={v}\n" for k, v in sorted(settings.items()))
