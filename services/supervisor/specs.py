"""What the supervisor (and `fedasync up`) starts for one run: its aggregator and its evaluator,
each with the run's complete settings as environment variables and a port of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedasync.services.runtime.run_settings import settings_for_run
from fedasync.services.runtime.settings import Settings, settings_env
from fedasync.services.runtime.supervisor import ServiceSpec
from fedasync.shared.runs import RunSpec

#: the processes each run gets, in start order
ROLES = ("aggregator", "evaluator")


@dataclass(frozen=True, slots=True)
class RunPorts:
    """The HTTP ports (/livez, /readyz, /metrics) of one run's processes."""

    aggregator: int
    evaluator: int


def child_name(run: str, role: str) -> str:
    """The child's name (its log file is `<name>.log`): `<run>.aggregator`."""
    return f"{run}.{role}"


def run_specs(
    base: Settings, run: str, spec: RunSpec | None, ports: RunPorts, *, evaluator: bool = True
) -> list[ServiceSpec]:
    """The children of `run` (created as `spec`; None: the default run, as `base` describes
    it): its aggregator, and its evaluator if `evaluator`.

    Each listens on 127.0.0.1-or-the-base-host at its own port, and is ready once its /readyz
    answers 200 (the supervisor does not wait for it: one slow start holds up no other run).
    Each logs in to Redis as its role's own user when the supervisor settings name one
    (`aggregator_redis_url`, `evaluator_redis_url`: the supervisor's own user may only read)."""
    out = []
    for role in ROLES if evaluator else ROLES[:1]:
        own: dict[str, dict[str, Any]] = {
            "aggregator": {"port": ports.aggregator},
            "evaluator": {"port": ports.evaluator},
        }
        url = getattr(base.supervisor, f"{role}_redis_url")
        if url is not None:
            own["redis"] = {"url": url}
        settings = settings_for_run(base, spec, **own)
        host = settings.aggregator.host if role == "aggregator" else settings.evaluator.host
        port = ports.aggregator if role == "aggregator" else ports.evaluator
        out.append(_spec(run, role, host, port, settings_env(settings)))
    return out


def _spec(run: str, role: str, host: str, port: int, env: dict[str, str]) -> ServiceSpec:
    return ServiceSpec(
        child_name(run, role),
        f"fedasync.services.{role}",
        env,
        ready_url=f"http://{host}:{port}/readyz",
    )
