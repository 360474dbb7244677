"""The compose profiles `cluster` and `runs` end to end: a second run on a Redis Cluster.

What docs/operations.md ("Compose: many runs and a Redis Cluster") tells a user to do, on the
images the session built: `docker compose --profile cluster --profile runs up` with the cluster's
nodes exported, so six Redis nodes are made into one cluster by the one-shot
`redis-cluster-create` and every service talks to it, and the supervisor runs beside the default
run's `aggregator`. A second run created through the control service's published port (POST
/v1/runs) gets its aggregator and evaluator from the supervisor, and a worker of its own (`docker
compose run worker` with the run's prefix and task). Both runs commit versions; Prometheus
scrapes the supervisor and the second run's processes from the targets file the supervisor
writes.

Then the second run's aggregator, a process inside the supervisor's container, gets SIGKILL by
its pid on the engine's host (found through /proc's NSpid, from the pid /v1/aggregators shows):
the fault is seen (the process is gone, its exit code -9), the supervisor starts it again, the
run commits past the version it had, and neither the supervisor's container nor the default run
noticed.
"""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fedasync.services.commands.chaos.compose.stack import Stack, fresh_settings, http_json
from fedasync.services.runtime.settings import RedisSettings
from fedasync.services.stores.acl import password_variables
from tests.compose.helpers import ROOT, Images

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]

NODES = ",".join(f"redis-node-{i}:6379" for i in range(1, 7))
DEFAULT = RedisSettings().key_prefix
RUN = "second"
#: the second run's task: the compose file's, with a seed of its own (its worker gets the same)
TASK = {"name": "digits", "params": {}, "seed": 1, "num_devices": 10, "partition": "iid"}
#: budgets no run reaches while the test runs: training goes on until the stack is taken down
BUDGET = {"max_updates": 1_000_000, "max_seconds": 3600.0}
#: deadlines, generous for a loaded machine (none is a measure: each only ends a wait)
WAIT_S = 300.0
POLL_S = 0.5


@dataclass(slots=True)
class Observed:
    """What the module's one run of the two profiles showed."""

    started: list[str] = field(default_factory=list)
    up_to_healthy_s: float = 0.0
    maker_logs: str = ""
    created: tuple[int, Any] = (0, None)
    runs: dict[str, Any] = field(default_factory=dict)
    #: the second run's aggregator as /v1/aggregators showed it before and after the kill
    child_before: dict[str, Any] = field(default_factory=dict)
    child_after: dict[str, Any] = field(default_factory=dict)
    #: versions: each run's once both trained, the second's at the kill and after the restart
    default_before: int = 0
    second_before: int = 0
    second_at_kill: int = 0
    second_after: int = 0
    default_after: int = 0
    killed_host_pid: int = 0
    killed_gone: bool = False
    supervisor_restarts: tuple[int, int] = (0, 0)
    restarts_metric: float = 0.0
    #: Prometheus's active targets: (job, run label, role label) -> health
    targets: dict[tuple[str, str, str], str] = field(default_factory=dict)
    kill_to_commit_s: float = 0.0
    total_s: float = 0.0


def _until(what: str, check: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    """Poll `check` (the state of other processes, in other containers) until truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout_s:.0f} s: {what}")
        time.sleep(POLL_S)


def _version(control: str, token: str, run: str) -> int:
    """The run's committed version as the control service reports it: 0 its initial model, the
    number of updates applied since; -1 while it has none."""
    code, body = http_json(f"{control}/v1/runs/{run}", token)
    if code != 200 or not isinstance(body, dict) or body.get("version") is None:
        return -1
    return int(body["version"])


def _child(supervisor: str) -> dict[str, Any]:
    """The second run's aggregator as the supervisor's /v1/aggregators shows it ({}: none)."""
    code, body = http_json(f"{supervisor}/v1/aggregators")
    if code != 200:
        return {}
    child: dict[str, Any] = body["runs"].get(RUN, {}).get("children", {}).get("aggregator", {})
    return child


def _host_pid(stack: Stack, container: str, pid: int) -> int:
    """The pid on the engine's host of the process `pid` inside `container` (/proc's NSpid: the
    pid in each namespace, the container's last)."""
    top = stack.docker("top", container, "-eo", "pid").stdout.split()[1:]
    for host in (int(p) for p in top):
        try:
            status = Path(f"/proc/{host}/status").read_text()
        except OSError:
            continue
        nspids = next(line for line in status.splitlines() if line.startswith("NSpid:"))
        if int(nspids.split()[-1]) == pid:
            return host
    raise AssertionError(f"no process of {container} is its pid {pid}")


def _targets(prometheus: str) -> dict[tuple[str, str, str], str]:
    code, body = http_json(f"{prometheus}/api/v1/targets")
    if code != 200:
        return {}
    return {
        (t["labels"]["job"], t["labels"].get("run", ""), t["labels"].get("role", "")): t["health"]
        for t in body["data"]["activeTargets"]
    }


def _restarts(supervisor: str) -> float:
    """fedasync_supervisor_restarts_total of the second run's aggregator, from /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"{supervisor}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "fedasync_supervisor_restarts_total" and sample.labels == {
                "run": RUN,
                "role": "aggregator",
            }:
                return float(sample.value)
    return 0.0


@pytest.fixture(scope="module")
def observed(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    out = tmp_path_factory.mktemp("compose-runs")
    began = time.monotonic()
    cluster_users = password_variables(DEFAULT, all_runs=True, cluster=True)
    settings = fresh_settings(
        COMPOSE_PROFILES="cluster,runs",
        FEDASYNC_REDIS__CLUSTER=NODES,
        FEDASYNC_BUDGET__MAX_UPDATES=str(BUDGET["max_updates"]),
        FEDASYNC_BUDGET__MAX_SECONDS=str(BUDGET["max_seconds"]),
    )
    # the two users of these profiles only (the default stack's .env lacks them)
    settings |= {v: secrets.token_hex(24) for v in cluster_users if v not in settings}
    stack = Stack(ROOT, "fedasync-runs-test", settings, say=print)
    token = settings["FEDASYNC_CONTROL__TOKEN"]
    seen = Observed()
    try:
        seen.up_to_healthy_s = stack.up(workers=1)
        seen.started = stack.started
        seen.maker_logs = stack.compose("logs", "--no-color", "redis-cluster-create").stdout
        control, supervisor = stack.url("control", 8082), stack.url("supervisor", 8086)
        prometheus = stack.url("prometheus", 9090)

        seen.created = http_json(
            f"{control}/v1/runs",
            token,
            body={"id": RUN, "task": TASK, "policy": {"mode": "fedasync"}, "budget": BUDGET},
        )
        _until(f"{RUN}'s aggregator started", lambda: _child(supervisor).get("running"))
        _until(f"{RUN}'s initial model", lambda: _version(control, token, RUN) >= 0)
        # the second run's fleet: one worker with its prefix and task (docs/operations.md)
        run_env = {
            "FEDASYNC_REDIS__KEY_PREFIX": RUN,
            "FEDASYNC_AUTH__DEFAULT_RUN": DEFAULT,
            "FEDASYNC_TASK__SEED": str(TASK["seed"]),
        }
        flags = [a for k, v in run_env.items() for a in ("-e", f"{k}={v}")]
        stack.compose("run", "--detach", "--no-deps", *flags, "worker", timeout_s=300)

        _until(f"{RUN} commits updates", lambda: _version(control, token, RUN) >= 3)
        _until("the default run commits updates", lambda: _version(control, token, DEFAULT) >= 3)
        seen.second_before = _version(control, token, RUN)
        seen.default_before = _version(control, token, DEFAULT)
        code, listed = http_json(f"{control}/v1/runs", token)
        seen.runs = {r["id"]: r for r in listed["runs"]} if code == 200 else {}

        def scraped() -> dict[tuple[str, str, str], str]:
            found = _targets(prometheus)
            wanted = [
                ("supervisor", "", ""),
                ("runs", RUN, "aggregator"),
                ("runs", RUN, "evaluator"),
            ]
            return found if all(found.get(w) == "up" for w in wanted) else {}

        seen.targets = _until("Prometheus scraping the supervisor and the run", scraped)

        # the fault: SIGKILL to the second run's aggregator by its host pid
        (container,) = stack.containers("supervisor")
        seen.supervisor_restarts = (stack.process(container.name).restarts, 0)
        seen.child_before = _child(supervisor)
        host_pid = _host_pid(stack, container.name, int(seen.child_before["pid"]))
        seen.killed_host_pid = host_pid
        seen.second_at_kill = _version(control, token, RUN)
        killed_at = time.monotonic()
        os.kill(host_pid, signal.SIGKILL)

        def restarted() -> dict[str, Any]:
            child = _child(supervisor)
            moved_on = child.get("pid") != seen.child_before["pid"]
            return child if child.get("running") and moved_on else {}

        seen.child_after = _until(f"{RUN}'s aggregator restarted", restarted)
        seen.killed_gone = not Path(f"/proc/{host_pid}").exists()
        seen.second_after = _until(
            f"{RUN} commits after the restart",
            lambda: (v := _version(control, token, RUN)) > seen.second_at_kill + 2 and v,
        )
        seen.kill_to_commit_s = time.monotonic() - killed_at
        seen.default_after = _version(control, token, DEFAULT)
        seen.restarts_metric = _restarts(supervisor)
        seen.supervisor_restarts = (
            seen.supervisor_restarts[0],
            stack.process(container.name).restarts,
        )
        seen.total_s = time.monotonic() - began
        print(
            f"compose runs: up to healthy {seen.up_to_healthy_s:.0f} s, versions "
            f"{DEFAULT} {seen.default_before}->{seen.default_after}, {RUN} "
            f"{seen.second_before}, killed at {seen.second_at_kill}, {seen.second_after} "
            f"{seen.kill_to_commit_s:.0f} s after the kill; {seen.total_s:.0f} s in all"
        )
        yield seen
    finally:
        stack.down(logs_to=Path(out) / "compose.log")


def test_the_two_profiles_start_the_cluster_and_the_supervisor(observed: Observed) -> None:
    nodes = {f"redis-node-{i}" for i in range(1, 7)}
    assert {*nodes, "redis-cluster-create", "supervisor", "aggregator"} <= set(observed.started)
    assert "the cluster is made" in observed.maker_logs, observed.maker_logs


def test_a_run_created_through_control_gets_its_aggregator_from_the_supervisor(
    observed: Observed,
) -> None:
    code, body = observed.created
    assert code == 201, body
    assert body["id"] == RUN
    assert body["spec"]["task"]["seed"] == TASK["seed"]
    assert set(observed.runs) == {DEFAULT, RUN}
    assert observed.child_before["running"]
    assert observed.child_before["restarts"] == 0


def test_both_runs_commit_versions_on_the_cluster(observed: Observed) -> None:
    assert observed.second_before >= 3  # three updates of its own worker applied
    assert observed.default_before >= 3
    assert observed.runs[RUN]["status"] == observed.runs[DEFAULT]["status"] == "training"


def test_prometheus_scrapes_the_supervisor_and_each_runs_processes(observed: Observed) -> None:
    targets = observed.targets
    assert targets[("supervisor", "", "")] == "up"
    assert targets[("runs", RUN, "aggregator")] == "up"
    assert targets[("runs", RUN, "evaluator")] == "up"
    assert not [key for key in targets if key[0] == "runs" and key[1] == DEFAULT]  # skip_default


def test_a_killed_aggregator_is_restarted_by_the_supervisor_and_its_run_goes_on(
    observed: Observed,
) -> None:
    before, after = observed.child_before, observed.child_after
    assert observed.killed_gone, "the process killed by its host pid is gone"
    assert after["last_exit"] == -signal.SIGKILL  # the fault happened: SIGKILL ended it
    assert after["restarts"] == 1
    assert after["pid"] != before["pid"]
    assert observed.restarts_metric == 1.0
    assert observed.second_after > observed.second_at_kill + 2  # commits go on past the kill


def test_the_kill_touched_one_process_only(observed: Observed) -> None:
    """Not the supervisor's container (the engine never restarted it), not the default run."""
    assert observed.supervisor_restarts[1] == observed.supervisor_restarts[0]
    assert observed.default_after >= observed.default_before
