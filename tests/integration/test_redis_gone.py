"""An aggregator that loses Redis for longer than its retries says so in one line, exit code 1.

The real entry point as a process against a private redis-server this test stops: its /readyz
turns 503 while it retries (tests/integration/test_metrics.py), then it exits for a supervisor
to restart it, with one log line, not a traceback of the retry machinery.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from fedasync.services.commands.redis_launch.server import RedisServer, free_port
from fedasync.services.runtime.supervisor import ServiceSpec, Supervisor

pytestmark = pytest.mark.integration


def test_the_aggregator_exits_1_with_one_line_once_redis_stays_away(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    server.start()
    port = free_port()
    env = {
        "FEDASYNC_REDIS__URL": server.url,
        "FEDASYNC_REDIS__RECONNECT_ATTEMPTS": "2",
        "FEDASYNC_TASK__NAME": "linear",
        "FEDASYNC_AGGREGATOR__PORT": str(port),
        "HOME": str(tmp_path),
        "PATH": os.environ.get("PATH", ""),
    }
    spec = ServiceSpec(
        "aggregator", "fedasync.services.aggregator", env, f"http://127.0.0.1:{port}/readyz"
    )
    with Supervisor(tmp_path / "logs") as supervisor:
        try:
            child = supervisor.start(spec)
            supervisor.wait_ready("aggregator", timeout=120)
            server.stop()
            code = child.process.wait(timeout=120)
        finally:
            server.stop()
            supervisor.kill("aggregator", signal.SIGKILL)
    log = child.log_path.read_text()
    assert code == 1, log
    assert "Traceback" not in log, log
    [line] = [row for row in log.splitlines() if "Redis unreachable" in row]
    assert "after 2 reconnection attempts" in line
    assert "exiting with code 1" in line
