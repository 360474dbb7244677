"""docker-compose.yml end to end: up, every healthcheck, training to the budget, ledger verify.

What a user does after `docker compose up` (docs/operations.md, "Deploy with Docker Compose"),
run once for the module on the images the session built: the stack comes up with a small budget
and a pool of two workers (every service but Grafana where no Grafana image exists), every
healthcheck passes, the version rises as the snapshot service's published port shows it
(long-polls), the control service's published port reports the status with the bearer token,
training stops at the budget and the workers exit 0, and `docker compose run --rm fedasync ledger
verify`, the admin Redis user from inside the compose network, replays the ledger to the
committed model bit for bit.

While it trains, the operator's paths (docs/operations.md): Prometheus reports every service's
target up; a degrade switch flipped through the control service's published port puts a new
policy version on the next decisions; a device key issued with `docker compose run --rm fedasync
devices add` lets that device's signed update through the ingest service's published port, and
its receipt says what was decided.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedasync import SyncDeviceClient
from fedasync.services.commands.chaos.compose.stack import (
    WORKER,
    Container,
    Stack,
    fresh_settings,
    http_json,
)
from tests.compose.helpers import ROOT, Images

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]

BUDGET = 120
WORKERS = 2
DEVICE = "phone-17"
SWITCH = "raise-gamma"
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
    #: Prometheus's scrape targets: job -> health, once every one was up (or at the deadline)
    targets: dict[str, str] = field(default_factory=dict)
    #: the control service's answer to the switch, and the policy version it made
    switch_answer: dict[str, Any] = field(default_factory=dict)
    #: the device's key as `devices add` printed it, its update and the receipt's decision
    device_key: str = ""
    device_update: str = ""
    device_decision: dict[str, Any] = field(default_factory=dict)
    #: every ledger record, as `docker compose run --rm fedasync ledger export` writes them
    ledger: list[dict[str, Any]] = field(default_factory=list)


def _status(control: str, token: str) -> dict[str, Any]:
    """The control service's /v1/status, polled until it answers (it does within seconds)."""
    deadline = time.monotonic() + STATUS_S
    while time.monotonic() < deadline:
        code, body = http_json(f"{control}/v1/status", token)
        if code == 200 and isinstance(body, dict):
            return body
        time.sleep(0.5)
    raise AssertionError(f"{control}/v1/status did not answer within {STATUS_S:.0f} s")


def _targets(prometheus: str) -> dict[str, str]:
    """Prometheus's active targets, job -> health, polled until each is up (scrapes are 5 s
    apart, and a target is `unknown` until its first)."""
    deadline = time.monotonic() + STATUS_S
    health: dict[str, str] = {}
    while time.monotonic() < deadline:
        code, body = http_json(f"{prometheus}/api/v1/targets")
        if code == 200:
            active = body["data"]["activeTargets"]
            health = {target["labels"]["job"]: target["health"] for target in active}
            if health and all(h == "up" for h in health.values()):
                break
        time.sleep(0.5)
    return health


def _operate(stack: Stack, seen: Observed, token: str) -> None:
    """The operator's paths, while training runs."""
    seen.targets = _targets(stack.url("prometheus", 9090))
    code, answer = http_json(
        f"{stack.url('control', 8082)}/v1/switches/{SWITCH}",
        token,
        body={"on": True, "reason": "compose test: update rate spike"},
    )
    assert code == 200, (code, answer)
    seen.switch_answer = answer
    # an HMAC key, as this test has always checked (the default is Ed25519 since issue 27; the
    # edge test, tests/compose/test_edge.py, takes the default)
    seen.device_key = stack.tool("devices", "add", "--kind", "hmac", DEVICE).split()[0]
    with SyncDeviceClient(
        stack.url("snapshot", 8081),
        DEVICE,
        key=seen.device_key,
        ingest_url=stack.url("ingest", 8084),
    ) as device:
        model = device.latest()
        assert model is not None
        published = device.publish(model.weights.copy(), model.version, 10)
        seen.device_update = published.update_id
        receipt = device.receipt(published.update_id, wait=STATUS_S)
        assert receipt.decision is not None, "no decision within the deadline"
        seen.device_decision = receipt.decision.to_dict()


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
            code, meta = http_json(
                f"{snapshot}/v1/models/latest/meta?newer_than={version}&wait={LONG_POLL_S}",
                timeout_s=LONG_POLL_S + 30,
            )
            if code == 200 and int(meta["version"]) > version:
                version = int(meta["version"])
                seen.versions.append(version)
                if not seen.status_while_training:
                    seen.status_while_training = _status(control, token)
                    _operate(stack, seen, token)
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
        seen.ledger = [json.loads(line) for line in stack.tool("ledger", "export").splitlines()]
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


def test_prometheus_scrapes_every_service(observed: Observed) -> None:
    """/api/v1/targets on Prometheus's published port: one job per fedasync service, all up
    (the jobs of the profile `runs`, found by DNS and file, have no target without it)."""
    config = yaml.safe_load((ROOT / "docker" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"] for job in config["scrape_configs"] if "static_configs" in job}
    assert {"aggregator", "snapshot", "control", "evaluator", "ingest"} <= jobs
    assert observed.targets == dict.fromkeys(jobs, "up")


def test_a_degrade_switch_through_the_control_port_changes_the_next_decisions(
    observed: Observed,
) -> None:
    """Decided before the flip: the first policy version; after it, every decision names the
    new one, the device's update (published after the flip) among them."""
    answer = observed.switch_answer
    assert answer["switch"] == SWITCH
    assert answer["on"] is True
    new = answer["policy"]["version"]
    versions = [record["policy_version"] for record in observed.ledger]
    flipped = versions.index(new)
    assert flipped >= 1  # training had decided updates before the flip
    assert set(versions[:flipped]) == {0}
    assert set(versions[flipped:]) == {new}
    (device,) = [r for r in observed.ledger if r["update_id"] == observed.device_update]
    assert device["policy_version"] == new


def test_a_device_key_from_compose_run_lets_a_signed_update_through_ingest(
    observed: Observed,
) -> None:
    assert len(observed.device_key) == 64
    int(observed.device_key, 16)  # 64 hex characters, as the device client takes it
    decision = observed.device_decision
    assert decision["update_id"] == observed.device_update
    assert decision["client_id"] == DEVICE
    assert decision["outcome"] == "applied", decision
    (record,) = [r for r in observed.ledger if r["update_id"] == observed.device_update]
    assert record["outcome"] == "applied"
    assert record["client_id"] == DEVICE
