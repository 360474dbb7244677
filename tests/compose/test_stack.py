"""docker-compose.yml end to end: up, every healthcheck, training to the budget, ledger verify.

What a user does after `docker compose up` (docs/operations.md, "Deploy with Docker Compose"),
run once for the module on the images the session built: the stack comes up with a small budget
and a pool of two workers (every service but Grafana where no Grafana image exists), every
healthcheck passes, the version rises as the snapshot service's published port shows it
(long-polls), the control service's published port reports the status with the bearer token,
training stops at the budget and the workers exit 0, and `docker compose run --rm fedasync ledger
verify`, the admin Redis user from inside the compose network, replays the ledger to the
committed model bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fedasync.services.commands.chaos.compose.stack import (
    WORKER,
    Container,
    Stack,
    fresh_settings,
    get_json,
)
from tests.compose.helpers import ROOT, Images

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]

BUDGET = 120
WORKERS = 2
#: deadlines, generous for a loaded machine: reaching the budget, one long-poll, the status
TRAIN_S = 900.0
LONG_POLL_S = 20
STATUS_S = 120.0


@dataclass(slots=True)
class Observed:
    """What the module's one run of the stack showed."""

    started: list[str] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    up_to_healthy_s: float = 0.0
    unhealthy_after_up: list[str] = field(default_factory=list)
    #: each version a long-poll of the snapshot service answered, in order
    versions: list[int] = field(default_factory=list)
    status_while_training: dict[str, Any] = field(default_factory=dict)
    status_at_end: dict[str, Any] = field(default_factory=dict)
    training_s: float = 0.0
    workers_at_end: list[Container] = field(default_factory=list)
    unhealthy_at_end: list[str] = field(default_factory=list)
    verify_exit: int = -1
    verify_output: str = ""


def _status(control: str, token: str) -> dict[str, Any]:
    """The control service's /v1/status, polled until it answers (it does within seconds)."""
    deadline = time.monotonic() + STATUS_S
    while time.monotonic() < deadline:
        code, body = get_json(f"{control}/v1/status", token)
        if code == 200 and isinstance(body, dict):
            return body
        time.sleep(0.5)
    raise AssertionError(f"{control}/v1/status did not answer within {STATUS_S:.0f} s")


@pytest.fixture(scope="module")
def observed(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    out = tmp_path_factory.mktemp("compose-stack")
    settings = fresh_settings(FEDASYNC_BUDGET__MAX_UPDATES=str(BUDGET))
    stack = Stack(ROOT, "fedasync-e2e", settings, say=print)
    token = settings["FEDASYNC_CONTROL__TOKEN"]
    seen = Observed()
    try:
        seen.up_to_healthy_s = stack.up(WORKERS)
        seen.started, seen.left_out = stack.started, stack.left_out
        others = [s for s in stack.started if s != WORKER]
        seen.unhealthy_after_up = stack.unhealthy(others)
        snapshot, control = stack.url("snapshot", 8081), stack.url("control", 8082)

        began = time.monotonic()
        version = 0
        while version < BUDGET and time.monotonic() < began + TRAIN_S:
            code, meta = get_json(
                f"{snapshot}/v1/models/latest/meta?newer_than={version}&wait={LONG_POLL_S}",
                timeout_s=LONG_POLL_S + 30,
            )
            if code == 200 and int(meta["version"]) > version:
                version = int(meta["version"])
                seen.versions.append(version)
                if not seen.status_while_training:
                    seen.status_while_training = _status(control, token)
        seen.training_s = time.monotonic() - began
        deadline = time.monotonic() + STATUS_S
        while time.monotonic() < deadline:  # the workers see training done and stop
            seen.workers_at_end = stack.containers(WORKER)
            if all(c.state == "exited" for c in seen.workers_at_end):
                break
            time.sleep(0.5)
        seen.status_at_end = _status(control, token)
        seen.unhealthy_at_end = stack.unhealthy(others)
        verify = stack.compose("run", "--rm", "-T", "fedasync", "ledger", "verify", check=False)
        seen.verify_exit, seen.verify_output = verify.returncode, verify.stdout + verify.stderr
        print(
            f"compose stack: up to healthy {seen.up_to_healthy_s:.0f} s, {BUDGET} updates in "
            f"{seen.training_s:.0f} s, accuracy "
            f"{(seen.status_at_end.get('evaluation') or {}).get('accuracy')}\n{verify.stdout}"
        )
        yield seen
    finally:
        stack.down(logs_to=Path(out) / "compose.log")


def test_every_service_but_the_workers_passes_its_healthcheck(observed: Observed) -> None:
    expected = {"redis", "aggregator", "snapshot", "control", "evaluator", "ingest", "prometheus"}
    assert expected <= set(observed.started)
    assert WORKER in observed.started
    assert set(observed.left_out) <= {"grafana"}  # only where its image is absent
    assert observed.unhealthy_after_up == []
    assert observed.unhealthy_at_end == []


def test_the_version_rises_through_the_snapshot_services_published_port(
    observed: Observed,
) -> None:
    versions = observed.versions
    assert len(versions) >= 2
    assert versions == sorted(set(versions))  # every answer newer than the one asked past
    assert versions[-1] == BUDGET


def test_the_control_service_reports_the_status_on_its_published_port(
    observed: Observed,
) -> None:
    during = observed.status_while_training
    assert during["version"] >= 1
    assert during["decisions"] >= 1
    assert during["training_done"] is None
    assert during["dead_letters"] == 0
    end = observed.status_at_end
    assert end["version"] == BUDGET
    assert end["budget_left_updates"] == 0
    assert end["training_done"]["reason"] == "max_updates"
    assert end["evaluation"] is not None
    assert end["evaluation"]["version"] >= 1


def test_training_stops_at_the_budget_and_the_workers_exit_cleanly(observed: Observed) -> None:
    assert len(observed.workers_at_end) == WORKERS
    for worker in observed.workers_at_end:
        assert (worker.state, worker.exit_code) == ("exited", 0), worker


def test_ledger_verify_as_the_admin_user_reproduces_the_model(observed: Observed) -> None:
    assert observed.verify_exit == 0, observed.verify_output
    assert "ledger verify: OK" in observed.verify_output
    assert f"committed model version {BUDGET}: reproduced bit for bit" in observed.verify_output
