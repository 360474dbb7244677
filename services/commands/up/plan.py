"""Which processes `fedasync up` starts, on which ports, with which settings.

Every child gets the complete validated settings as environment variables (`settings_env`), and
only what differs between children on top: its port, its device index. Ports are picked free on
127.0.0.1 (nothing listens beyond this machine).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from fedasync.services.commands.redis_launch.server import free_port
from fedasync.services.runtime.settings import Settings, settings_env
from fedasync.services.runtime.supervisor import ServiceSpec
from fedasync.services.worker.device import default_client_id

HOST = "127.0.0.1"
#: the ends of a run that are its budgets running out, as asked (exit 0): updates, time, the
#: privacy budget (the core closes training before a step that would spend past it), and an
#: operator's stop (policy.stopped)
BUDGETS = frozenset({"max_updates", "max_seconds", "privacy_budget", "stopped"})
#: started in this order, each once the previous is ready; stopped in the reverse order
SERVICES = ("aggregator", "snapshot", "control", "evaluator", "ingest")


@dataclass(frozen=True, slots=True)
class Ports:
    aggregator: int
    snapshot: int
    control: int
    evaluator: int
    ingest: int

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port(), free_port(), free_port())

    def url(self, service: str) -> str:
        return f"http://{HOST}:{getattr(self, service)}"


def configure(
    settings: Settings, redis_url: str | None, key_prefix: str, ports: Ports, *, secure: bool
) -> Settings:
    """The run's settings: this Redis, these ports, a control token (a fresh one if unset).

    `secure`: every device signs with a key of its own and publishes through the ingest service,
    and the aggregator refuses anything unsigned.
    """
    snapshot = ports.url("snapshot")

    def section(name: str, **changes: object) -> object:
        return getattr(settings, name).model_copy(update=changes)

    return settings.model_copy(
        update={
            "redis": section("redis", url=redis_url, key_prefix=key_prefix),
            "aggregator": section("aggregator", host=HOST, port=ports.aggregator),
            "snapshot": section("snapshot", host=HOST, port=ports.snapshot),
            "control": section(
                "control",
                host=HOST,
                port=ports.control,
                token=settings.control.token or secrets.token_urlsafe(24),
            ),
            "evaluator": section(
                "evaluator", host=HOST, port=ports.evaluator, snapshot_url=snapshot
            ),
            "ingest": section("ingest", host=HOST, port=ports.ingest),
            "auth": section("auth", required=secure),
            # the key and the ingest URL are each worker's own (worker_specs)
            "worker": section(
                "worker", snapshot_url=snapshot, client_id=None, key=None, ingest_url=None
            ),
        }
    )


def services(settings: Settings) -> tuple[str, ...]:
    """The services this run starts, in start order: ingest only when devices publish through it."""
    return tuple(name for name in SERVICES if name != "ingest" or settings.auth.required)


def service_specs(settings: Settings, ports: Ports) -> list[ServiceSpec]:
    env = settings_env(settings)
    return [
        ServiceSpec(name, f"fedasync.services.{name}", env, ready_url=ports.url(name) + "/readyz")
        for name in services(settings)
    ]


def worker_specs(
    settings: Settings, ports: Ports, device_keys: Mapping[str, str]
) -> list[ServiceSpec]:
    """One worker per device; with `device_keys` (client id → key) each signs with its own key
    and publishes through the ingest service."""
    env = settings_env(settings)
    specs = []
    for index in range(settings.task.num_devices):
        mine = env | {
            "FEDASYNC_WORKER__DEVICE_INDEX": str(index),
            "FEDASYNC_WORKER__CLIENT_ID": default_client_id(index),
        }
        if default_client_id(index) in device_keys:
            mine["FEDASYNC_WORKER__KEY"] = device_keys[default_client_id(index)]
            mine["FEDASYNC_WORKER__INGEST_URL"] = ports.url("ingest")
        specs.append(ServiceSpec(f"worker-{index}", "fedasync.services.worker", mine))
    return specs
