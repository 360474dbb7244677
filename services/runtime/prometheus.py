"""The one way a service answers a Prometheus scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

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


#: the label every sample of a run's figures carries (docs/operations.md, "Runs in metrics")
RUN_LABEL = "run"


class RunLabelled(Collector):
    """Another collector's figures with `run=<id>` added to every sample (among its
    labels): a process that serves one run (the aggregator, the evaluator) labels its whole
    registry so, and one that serves many (the snapshot service) each run's own registry, so a
    dashboard can split every figure `by (run)` without mixing two runs' versions."""

    def __init__(self, collector: Collector, run: str) -> None:
        self._collector = collector
        self.run = run

    def collect(self) -> Iterator[Metric]:
        for family in self._collector.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labelled.add_sample(
                    sample.name,
                    {RUN_LABEL: self.run, **sample.labels},
                    sample.value,
                    sample.timestamp,
                    sample.exemplar,
                )
            yield labelled


def merged(collectors: Iterable[Collector]) -> Iterator[Metric]:
    """The families of several collectors, one per name (samples in the order collected, the
    first collector's help): Prometheus refuses a page that names a family twice, which several
    runs' registries of the same metrics would otherwise give."""
    families: dict[str, Metric] = {}
    for collector in collectors:
        for family in collector.collect():
            kept = families.get(family.name)
            if kept is None:
                kept = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            kept.samples.extend(family.samples)
    yield from families.values()


class Merged(Collector):
    """A collector of `merged` over the collectors `source` names at each collection (a set of
    runs that grows while the service runs)."""

    def __init__(self, source: Callable[[], Iterable[Collector]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        return merged(self._source())


def run_registry(registry: CollectorRegistry, run: str | None) -> CollectorRegistry:
    """What a one-run process's /metrics answers: `registry` with every sample labelled
    `run=<run>` (RunLabelled), or `registry` itself for run None. The labelled registry is a
    new one holding the old as a collector, so figures are still counted (and read by tests)
    in `registry`, without the label."""
    if run is None:
        return registry
    exposed = CollectorRegistry(auto_describe=False)
    exposed.register(RunLabelled(registry, run))
    return exposed
