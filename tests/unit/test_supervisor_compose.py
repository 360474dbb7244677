"""What the compose supervisor needs: its file_sd list naming each child at a host Prometheus
can reach, and each child logging in to Redis as its own role's user.

In compose the children bind 0.0.0.0 inside the supervisor's container, and Prometheus runs in
another one: the list must name them by the supervisor's service name (`targets_host`), not by
their bind address. Without it, each child is listed at its own role's bind address (`fedasync
up`, where Prometheus, if any, shares the host). Nothing is started: the children are only kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.settings import load_settings
from fedasync.services.supervisor.service import RunSupervisor
from fedasync.services.supervisor.specs import RunPorts, run_specs

PORTS = RunPorts(aggregator=18101, evaluator=18102)


def targets(tmp_path: Path, **supervisor: Any) -> list[dict[str, Any]]:
    """The list a supervisor writes for one run's two children (kept, never started)."""
    settings = load_settings(
        redis={"url": "redis://127.0.0.1:1/0"},  # never asked: no pass of the loop runs
        aggregator={"host": "0.0.0.0"},
        evaluator={"host": "127.0.0.2"},
        supervisor={"targets_file": str(tmp_path / "runs.json"), **supervisor},
    )
    runner = RunSupervisor(settings, aioredis.Redis(port=1), tmp_path / "logs")
    for spec, port in zip(
        run_specs(settings, "runb", None, PORTS), (PORTS.aggregator, PORTS.evaluator), strict=True
    ):
        runner.children.keep("runb", spec.name.rsplit(".", 1)[1], spec, port)
    runner._write_targets()
    found: list[dict[str, Any]] = json.loads((tmp_path / "runs.json").read_text())
    return sorted(found, key=lambda t: t["labels"]["role"])


def test_the_targets_name_the_children_by_the_targets_host(tmp_path: Path) -> None:
    assert targets(tmp_path, targets_host="supervisor") == [
        {"targets": ["supervisor:18101"], "labels": {"run": "runb", "role": "aggregator"}},
        {"targets": ["supervisor:18102"], "labels": {"run": "runb", "role": "evaluator"}},
    ]


def test_without_a_targets_host_each_child_is_at_its_bind_address(tmp_path: Path) -> None:
    assert targets(tmp_path) == [
        {"targets": ["0.0.0.0:18101"], "labels": {"run": "runb", "role": "aggregator"}},
        {"targets": ["127.0.0.2:18102"], "labels": {"run": "runb", "role": "evaluator"}},
    ]


def test_each_child_logs_in_as_its_roles_own_user_when_one_is_named() -> None:
    """The compose supervisor's own Redis user may only read: each run's aggregator and
    evaluator get the URL of their role's user."""
    urls = {
        "aggregator": "redis://aggregator:pw-aggregator-0123456789@redis:6379/0",
        "evaluator": "redis://evaluator:pw-evaluator-0123456789@redis:6379/0",
    }
    base = load_settings(
        redis={"url": "redis://supervisor:pw-supervisor-0123456789@redis:6379/0"},
        supervisor={f"{role}_redis_url": url for role, url in urls.items()},
    )
    specs = {s.name: s for s in run_specs(base, "runb", None, PORTS)}
    assert set(specs) == {"runb.aggregator", "runb.evaluator"}
    for role, url in urls.items():
        assert specs[f"runb.{role}"].env["FEDASYNC_REDIS__URL"] == url
    # unset: each child logs in as the supervisor does (`fedasync up`, one user for all)
    plain = load_settings(redis={"url": "redis://127.0.0.1:6379/0"})
    for spec in run_specs(plain, "runb", None, PORTS):
        assert spec.env["FEDASYNC_REDIS__URL"] == "redis://127.0.0.1:6379/0"
