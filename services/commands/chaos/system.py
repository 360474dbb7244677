"""The system under test: a private Redis and fedasync's services as real child processes.

Every setting a child gets is written here, from a clean environment (no `FEDASYNC_` variable of
the caller leaks in), so a run depends only on the profile and the seed. Socket timeouts are
short (1 s) so that a Redis pause of a few seconds really makes the workers' and the aggregator's
commands time out and go through their retry paths; budgets are out of reach so training never
closes during a run. The aggregator talks to Redis through a proxy (chaos/proxy.py) that can stall
any one of its commands.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType

from fedasync.services.commands.chaos.proxy import ProxyThread
from fedasync.services.commands.chaos.schedule import Profile
from fedasync.services.runtime.redis_server import RedisServer, free_port
from fedasync.services.runtime.settings import AggregatorSettings
from fedasync.services.runtime.supervisor import ServiceSpec, Supervisor
from fedasync.services.stores.keys import Keys

KEY_PREFIX = "chaos"
AGGREGATOR = "aggregator"
SNAPSHOT = "snapshot"
#: socket timeout of every service's Redis client, seconds: below every injected pause
SOCKET_TIMEOUT_S = "1.0"
#: the aggregator's settings that differ from the defaults; its claims run on the defaults, so
#: the run checks the bound a deployment gets (`AggregatorSettings.decision_bound_s`)
AGGREGATOR_SETTINGS = AggregatorSettings(batch_ms=20, block_ms=200)


def worker_name(index: int) -> str:
    return f"worker-{index}"


class System:
    """Redis, the aggregator, the snapshot service and the workers of one chaos run."""

    def __init__(self, out: Path, profile: Profile) -> None:
        self.out = out
        self.profile = profile
        self.keys = Keys(KEY_PREFIX)
        self.redis = RedisServer(out / "redis")
        self.proxy = ProxyThread("127.0.0.1", self.redis.port)
        self.aggregator_port = free_port()
        self.snapshot_port = free_port()
        self.journal_dir = out / "journal"
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(out / "logs", env=self._common_env())
        self.workers = [worker_name(i) for i in range(profile.workers)]

    @property
    def snapshot_url(self) -> str:
        return f"http://127.0.0.1:{self.snapshot_port}"

    def journals(self) -> list[Path]:
        return sorted(self.journal_dir.glob("*.journal"))

    # ---------------------------------------------------------------------------- the children
    def _common_env(self) -> dict[str, str]:
        return {
            "FEDASYNC_REDIS__URL": self.redis.url,
            "FEDASYNC_REDIS__KEY_PREFIX": KEY_PREFIX,
            "FEDASYNC_REDIS__SOCKET_TIMEOUT_S": SOCKET_TIMEOUT_S,
            "FEDASYNC_REDIS__CONNECT_TIMEOUT_S": SOCKET_TIMEOUT_S,
            "FEDASYNC_TASK__NAME": "linear",
            "FEDASYNC_TASK__NUM_DEVICES": str(self.profile.workers),
            "FEDASYNC_BUDGET__MAX_UPDATES": "100000000",
            "FEDASYNC_BUDGET__MAX_SECONDS": "100000000",
            "FEDASYNC_AGGREGATOR__KEEP_PAYLOADS": "true",  # `ledger verify` replays them
            # every service validates that the socket timeout exceeds the aggregator's block
            "FEDASYNC_AGGREGATOR__BLOCK_MS": str(AGGREGATOR_SETTINGS.block_ms),
        }

    def aggregator_spec(self) -> ServiceSpec:
        port = self.aggregator_port
        return ServiceSpec(
            AGGREGATOR,
            "fedasync.services.aggregator",
            {
                "FEDASYNC_REDIS__URL": self.proxy.proxy.url,
                "FEDASYNC_AGGREGATOR__PORT": str(port),
                "FEDASYNC_AGGREGATOR__BATCH_MS": str(AGGREGATOR_SETTINGS.batch_ms),
            },
            ready_url=f"http://127.0.0.1:{port}/readyz",
        )

    def snapshot_spec(self) -> ServiceSpec:
        return ServiceSpec(
            SNAPSHOT,
            "fedasync.services.snapshot",
            {"FEDASYNC_SNAPSHOT__PORT": str(self.snapshot_port)},
            ready_url=f"{self.snapshot_url}/readyz",
        )

    def worker_spec(self, index: int) -> ServiceSpec:
        name = worker_name(index)
        return ServiceSpec(
            name,
            "fedasync.services.worker",
            {
                "FEDASYNC_WORKER__DEVICE_INDEX": str(index),
                "FEDASYNC_WORKER__SNAPSHOT_URL": self.snapshot_url,
                # the write-up's long-tail fleet, 30 s runs taking 90 ms: updates flow quickly
                "FEDASYNC_WORKER__PROFILE": "longtail",
                "FEDASYNC_WORKER__TIME_SCALE": "0.003",
                "FEDASYNC_WORKER__DOWNLOAD_TIMEOUT_S": "10",
                "FEDASYNC_WORKER__JOURNAL": str(self.journal_dir / f"{name}.journal"),
            },
        )

    def spec(self, name: str) -> ServiceSpec:
        if name == AGGREGATOR:
            return self.aggregator_spec()
        if name == SNAPSHOT:
            return self.snapshot_spec()
        return self.worker_spec(self.workers.index(name))

    # ---------------------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 60.0) -> None:
        """Redis (and the aggregator's proxy to it), then the aggregator and the snapshot service
        (each ready), then the workers."""
        self.redis.start()
        self.proxy.start()
        self.supervisor.start(self.aggregator_spec())
        self.supervisor.wait_ready(AGGREGATOR, timeout)
        self.supervisor.start(self.snapshot_spec())
        self.supervisor.wait_ready(SNAPSHOT, timeout)
        for index in range(self.profile.workers):
            self.supervisor.start(self.worker_spec(index))

    def stop(self) -> None:
        """Every child (workers first), then Redis. Safe to call twice."""
        self.supervisor.stop_all(groups=[self.workers, [SNAPSHOT], [AGGREGATOR]])
        self.proxy.stop()
        self.redis.stop()

    def __enter__(self) -> System:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
