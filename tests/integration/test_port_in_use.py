"""A service whose port is taken says so in one line naming the setting (exit code 2).

The real entry points, as processes, against the module's private Redis, with the port they are
told to serve on held by this test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedasync.services.commands.redis_launch.server import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 another process (this one) listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def start(
    service: str, env: dict[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", f"fedasync.services.{service}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("service", ["snapshot", "aggregator", "control"])
def test_a_port_in_use_is_one_line_naming_its_setting(
    service: str, redis_server: RedisServer, taken_port: int, tmp_path: Path
) -> None:
    setting = f"FEDASYNC_{service.upper()}__PORT"
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "FEDASYNC_REDIS__URL": redis_server.url,
        "FEDASYNC_REDIS__KEY_PREFIX": f"t-port-in-use-{service}",
        "FEDASYNC_TASK__NAME": "linear",
        "FEDASYNC_CONTROL__TOKEN": "t" * 24,
        setting: str(taken_port),
    }
    result = start(service, env, tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"{service}: {setting}: cannot listen on 127.0.0.1:{taken_port}: "
        "the port is in use (another process listens on it)"
    ]


def test_a_host_that_is_no_address_here_names_the_host_setting(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "FEDASYNC_REDIS__URL": redis_server.url,
        "FEDASYNC_REDIS__KEY_PREFIX": "t-port-in-use-host",
        "FEDASYNC_INGEST__HOST": "192.0.2.1",  # TEST-NET-1: no address of this machine
        "FEDASYNC_INGEST__PORT": "0",
    }
    result = start("ingest", env, tmp_path)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("ingest: FEDASYNC_INGEST__HOST: cannot listen on 192.0.2.1:0: ")
