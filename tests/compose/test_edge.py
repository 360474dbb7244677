"""The TLS edge (profile `edge`): devices reach ingest and the snapshot service over HTTPS only.

The stack comes up with `--profile edge` and a certificate made the documented way
(docker/edge/certs/README.md: self-signed, for localhost, 127.0.0.1 and `edge`) in a directory of
the test's own (`EDGE_CERTS`), two workers training as usual. Then, through the edge alone:

- the test's device, on the host, with a key from `docker compose run --rm fedasync devices add`
  and the certificate as its CA file: the newest model, a signed update, its receipt (applied);
- a worker container of the compose file, run with the snapshot and ingest URLs set to
  `https://edge`, its own key and `FEDASYNC_WORKER__CA_FILE`: three updates, then exit 0;
- a long-poll on `latest/meta` answered with a newer version; a versioned model twice, the second
  time from the edge's cache, the same bytes the snapshot service serves; the metrics refused.

A plain-HTTP request from outside the compose network, to either published port of the edge, is
redirected to HTTPS and answered nothing else; without the CA file the certificate is refused.
At the end `ledger verify` passes and the ledger holds the device's and the worker's updates.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fedasync import SyncDeviceClient
from fedasync.client.errors import Unavailable
from fedasync.client.retry import RetryPolicy
from fedasync.services.commands.chaos.compose.stack import WORKER, Stack, fresh_settings
from tests.compose.helpers import ROOT, Images, nginx_standin

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]

EDGE = "edge"
DEVICE = "phone-tls"
EDGE_WORKER = "edge-worker"
WORKER_RUNS = 3
#: deadlines, generous for a loaded machine
DECIDED_S = 180.0
LONG_POLL_S = 20


@dataclass(slots=True)
class Observed:
    """What the module's one run of the stack with its edge showed."""

    started: list[str] = field(default_factory=list)
    up_to_healthy_s: float = 0.0
    unhealthy: list[str] = field(default_factory=list)
    https: str = ""
    device_update: str = ""
    device_decision: dict[str, Any] = field(default_factory=dict)
    device_version: int = 0
    without_ca: str = ""
    long_poll: tuple[int, int] = (0, 0)
    #: a versioned model through the edge, twice: (X-Edge-Cache, bytes), and the service's bytes
    versioned: list[tuple[str, bytes]] = field(default_factory=list)
    direct: bytes = b""
    metrics_status: int = 0
    #: plain HTTP to the edge's TLS port and to its port 80: (status, Location)
    plain: dict[str, tuple[int, str]] = field(default_factory=dict)
    worker_exit: tuple[str, int] = ("", -1)
    worker_log: str = ""
    ledger: list[dict[str, Any]] = field(default_factory=list)
    verify_output: str = ""


def self_signed(where: Path) -> Path:
    """The documented command (docker/edge/certs/README.md), into `where`; the certificate."""
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost",
            "-addext", "subjectAltName=DNS:localhost,DNS:edge,IP:127.0.0.1",
            "-keyout", str(where / "edge.key"), "-out", str(where / "edge.crt"),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return where / "edge.crt"


def get(
    url: str, context: ssl.SSLContext, timeout_s: float = 60.0
) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, context=context, timeout=timeout_s) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), b""


def plain(port: int, path: str) -> tuple[int, str]:
    """A plain-HTTP GET, redirects not followed: (status, Location)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status, response.getheader("Location") or ""
    finally:
        connection.close()


def published_port(stack: Stack, service: str, port: int) -> int:
    return int(stack.url(service, port).rsplit(":", 1)[1])


def _ledger_until(stack: Stack, wanted: dict[str, int]) -> list[dict[str, Any]]:
    """`ledger export`, again until it holds `wanted[client]` records of each client."""
    deadline = time.monotonic() + DECIDED_S
    while True:
        ledger = [json.loads(line) for line in stack.tool("ledger", "export").splitlines()]
        counts = {c: sum(r["client_id"] == c for r in ledger) for c in wanted}
        if all(counts[c] >= n for c, n in wanted.items()) or time.monotonic() > deadline:
            return ledger
        time.sleep(1.0)


@pytest.fixture(scope="module")
def observed(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    out = tmp_path_factory.mktemp("compose-edge")
    settings = fresh_settings(
        COMPOSE_PROFILES=EDGE,
        EDGE_CERTS=str(out / "certs"),
        FEDASYNC_BUDGET__MAX_UPDATES="100000",
        FEDASYNC_BUDGET__MAX_SECONDS="100000",
    )
    stack = Stack(ROOT, "fedasync-edge-test", settings, say=print)
    why = nginx_standin(stack)
    if why is not None:
        pytest.skip(why)
    cert = self_signed(out / "certs")
    trusted = ssl.create_default_context(cafile=str(cert))
    seen = Observed()
    try:
        seen.up_to_healthy_s = stack.up(2)
        seen.started = stack.started
        seen.unhealthy = stack.unhealthy([s for s in stack.started if s != WORKER])
        tls_port = published_port(stack, EDGE, 443)
        seen.https = https = f"https://127.0.0.1:{tls_port}"

        # the test's device, on the host, through the edge only
        key = stack.tool("devices", "add", DEVICE).split()[0]
        with SyncDeviceClient(
            https, DEVICE, key=key, ingest_url=https, ca_file=str(cert)
        ) as device:
            model = device.latest()
            assert model is not None
            seen.device_version = model.version
            sent = device.publish(model.weights.copy(), model.version, 10)
            seen.device_update = sent.update_id
            receipt = device.receipt(sent.update_id, wait=DECIDED_S)
            assert receipt.decision is not None, "no decision within the deadline"
            seen.device_decision = receipt.decision.to_dict()
        once = RetryPolicy(attempts=0)
        with SyncDeviceClient(https, DEVICE, key=key, ingest_url=https, retry=once) as device:
            try:
                device.latest()
            except Unavailable as exc:
                seen.without_ca = str(exc)

        # a long-poll, a versioned model twice, the metrics
        code, _, body = get(
            f"{https}/v1/models/latest/meta?newer_than={seen.device_version}&wait={LONG_POLL_S}",
            trusted,
            timeout_s=LONG_POLL_S + 30,
        )
        seen.long_poll = (code, int(json.loads(body)["version"]) if code == 200 else 0)
        version = seen.device_version
        for _ in range(2):
            code, headers, body = get(f"{https}/v1/models/{version}", trusted)
            assert code == 200, code
            seen.versioned.append((headers.get("X-Edge-Cache", ""), body))
        snapshot = stack.url("snapshot", 8081)
        with urllib.request.urlopen(f"{snapshot}/v1/models/{version}", timeout=60) as response:
            seen.direct = response.read()
        seen.metrics_status = get(f"{https}/metrics", trusted)[0]

        # plain HTTP from outside the compose network, to both published ports of the edge
        seen.plain["tls port"] = plain(tls_port, "/v1/models/latest")
        seen.plain["port 80"] = plain(published_port(stack, EDGE, 80), "/v1/models/latest")

        # a worker of the compose file, through the edge, with its own key and the CA file
        stack.settings["FEDASYNC_WORKER__KEY"] = stack.tool("devices", "add", EDGE_WORKER).split()[
            0
        ]
        run = stack.compose(
            "run", "-d", "--no-deps", "--name", "fedasync-edge-test-worker-tls",
            "-v", f"{out / 'certs'}:/certs:ro",
            "-e", f"FEDASYNC_WORKER__CLIENT_ID={EDGE_WORKER}",
            "-e", "FEDASYNC_WORKER__KEY",
            "-e", f"FEDASYNC_WORKER__SNAPSHOT_URL=https://{EDGE}",
            "-e", f"FEDASYNC_WORKER__INGEST_URL=https://{EDGE}",
            "-e", "FEDASYNC_WORKER__CA_FILE=/certs/edge.crt",
            "-e", f"FEDASYNC_WORKER__MAX_RUNS={WORKER_RUNS}",
            WORKER,
        )  # fmt: skip
        container = run.stdout.strip().splitlines()[-1]
        deadline = time.monotonic() + DECIDED_S
        while time.monotonic() < deadline:
            process = stack.process(container)
            if not process.running:
                break
            time.sleep(0.5)
        state = stack.docker(
            "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container
        )
        status, exit_code = state.stdout.split()
        seen.worker_exit = (status, int(exit_code))
        logs = stack.docker("logs", "--tail", "30", container)
        seen.worker_log = logs.stdout + logs.stderr

        seen.ledger = _ledger_until(stack, {DEVICE: 1, EDGE_WORKER: WORKER_RUNS})
        # live: the stack's own workers train on, and the aggregator commits while verify
        # replays (it compares with the commit it began at: services/stores/committed.py)
        seen.verify_output = stack.tool("ledger", "verify")
        print(
            f"compose edge: up to healthy {seen.up_to_healthy_s:.0f} s; device update "
            f"{seen.device_update}: {seen.device_decision}; worker {seen.worker_exit}; "
            f"cache {[c for c, _ in seen.versioned]}; plain HTTP {seen.plain}\n"
            f"{seen.verify_output}"
        )
        yield seen
    finally:
        stack.docker("rm", "-f", "fedasync-edge-test-worker-tls", check=False)
        stack.down(logs_to=out / "compose.log")


def test_the_edge_comes_up_healthy_with_the_stack(observed: Observed) -> None:
    assert EDGE in observed.started
    assert observed.unhealthy == []


def test_a_devices_update_through_the_https_edge_is_applied(observed: Observed) -> None:
    decision = observed.device_decision
    assert decision["update_id"] == observed.device_update
    assert decision["client_id"] == DEVICE
    assert decision["outcome"] == "applied", decision
    (record,) = [r for r in observed.ledger if r["update_id"] == observed.device_update]
    assert record["outcome"] == "applied"


def test_without_the_ca_file_the_edges_certificate_is_refused(observed: Observed) -> None:
    assert "certificate verify failed" in observed.without_ca


def test_a_worker_publishes_through_the_edge_with_its_ca_file(observed: Observed) -> None:
    assert observed.worker_exit == ("exited", 0), observed.worker_log
    records = [r for r in observed.ledger if r["client_id"] == EDGE_WORKER]
    assert len(records) == WORKER_RUNS
    assert {r["outcome"] for r in records} <= {"applied", "dropped"}


def test_long_polls_go_through_the_edge(observed: Observed) -> None:
    code, version = observed.long_poll
    assert code == 200
    assert version > observed.device_version


def test_the_edge_serves_a_versioned_model_from_its_cache(observed: Observed) -> None:
    (first, body1), (second, body2) = observed.versioned
    assert (first, second) == ("MISS", "HIT")
    assert body1 == body2 == observed.direct != b""


def test_only_device_routes_are_exposed(observed: Observed) -> None:
    assert observed.metrics_status == 404


def test_plain_http_from_outside_is_redirected_to_https(observed: Observed) -> None:
    status, location = observed.plain["tls port"]
    assert status == 308
    assert location == f"{observed.https}/v1/models/latest"
    status, location = observed.plain["port 80"]
    assert status == 308
    assert location.startswith("https://127.0.0.1")


def test_ledger_verify_passes(observed: Observed) -> None:
    assert "ledger verify: OK" in observed.verify_output
