"""The one way a service answers a Prometheus scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

#: the registry a service's /metrics answers from; the HTTP runner adds its connection figures to it
REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)


class FoldingRegistry(CollectorRegistry):
    """A registry that runs its `folds` before each collection: a hot path may count in plain
    ints (no lock, no call per answer) and add them to its metrics only when they are read.

    The folds run in the thread that collects; a service's /metrics handler runs on the event
    loop, as do the answers it counts, so a fold never races an increment."""

    def __init__(self) -> None:
        super().__init__()
        self.folds: list[Callable[[], None]] = []

    def collect(self) -> Iterable[Metric]:
        for fold in self.folds:
            fold()
        return super().collect()


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The registry in Prometheus text format, with its content type."""
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
    )
