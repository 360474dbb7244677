"""The system under the cluster failover audit: a Redis Cluster, several runs, their services.

A `LocalCluster` (services/commands/redis_launch/cluster.py: three primaries, a replica each,
`cluster-require-full-coverage no`) holds `profile.cluster_runs` runs, their ids chosen so that
each run's slot (its hash tag, the id) is on a primary of its own: a kill -9 of one primary is
then one run's failover (the victim) and nothing to the others (the bystanders), which is what
the audit shows. Each run has its aggregator and `profile.workers` workers (its devices, each
journalling what it publishes, in a folder per run); one snapshot service serves every run, as
`fedasync up --runs` deploys it (services/commands/up/many.py): the first run is the
deployment's default run (the legacy routes), the others are named runs, whose processes know
the default run from FEDASYNC_AUTH__DEFAULT_RUN (services/runtime/own_run.py). One snapshot
process rather than one per run keeps the CPU of a 2-core machine for the runs.

Every child talks to the cluster (FEDASYNC_REDIS__CLUSTER), in durable mode as the profile asks
(FEDASYNC_REDIS__DURABLE_REPLICAS: 1 is the cluster's default), with the socket timeout, retry
budget and refusal linger of the Sentinel failover profile (chaos/system.py), whose reasons hold
here too. Settings come from a clean environment, as in chaos/system.py.

Under the ACL (the profile's default, as the Sentinel profile's), every node loads the file for
every run on a cluster (`fedasync acl --all-runs --cluster`, services/stores/acl.py) with fresh
passwords (`LocalCluster(auth=...)`: replicas log in as `replica`, the cluster is made as
`cluster-admin`), and every process logs in as its role's user: each run's aggregator as
`aggregator`, the workers as `worker`, the snapshot service as `snapshot`. The harness reads,
audits and asks the cluster as chaos/system.py's `observer` (every right, no service's). With
`--no-acl`, everyone is Redis's default user.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import redis

from fedasync.services.commands.chaos.schedule import Profile
from fedasync.services.commands.chaos.system import (
    AGGREGATOR,
    AGGREGATOR_SETTINGS,
    DURABLE_TIMEOUT_MS,
    FAILOVER_RECONNECT_ATTEMPTS,
    KEEP_VERSIONS,
    OBSERVER,
    REFUSAL_LINGER_S,
    REPLICATED_SOCKET_TIMEOUT_S,
    SNAPSHOT,
    acl_passwords,
    redis_url,
    worker_name,
)
from fedasync.services.commands.redis_launch.cluster import (
    ClusterAuth,
    LocalCluster,
    prefixes_on_distinct_primaries,
)
from fedasync.services.commands.redis_launch.server import find_redis_server
from fedasync.services.runtime.ports import free_port
from fedasync.services.runtime.settings import env_name
from fedasync.services.runtime.supervisor import ServiceSpec, StopsOnExit, Supervisor
from fedasync.services.stores.acl import all_users
from fedasync.shared.keys import Keys
from fedasync.shared.runs import DEFAULT_RUN
from fedasync.shared.snapshot_protocol import latest_path

#: the run ids tried, in order, until `cluster_runs` of them fall on distinct primaries
RUN_CANDIDATES = tuple(f"chaos-{i}" for i in range(1, 65))


@dataclass(slots=True)
class ClusterRun:
    """One run of the system: its id (key prefix and hash tag), its aggregator's port, and its
    children's names."""

    id: str
    default: bool
    aggregator_port: int
    workers: list[str]
    journal_dir: Path

    @property
    def keys(self) -> Keys:
        return Keys(self.id)

    @property
    def tag(self) -> str:
        """A key in the run's slot: every one of its keys is `{id}:...`."""
        return "{" + self.id + "}"

    @property
    def aggregator(self) -> str:
        return f"{self.id}.{AGGREGATOR}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.aggregator_port}/metrics"

    def journals(self) -> list[Path]:
        return sorted(self.journal_dir.glob("*.journal"))


class ClusterSystem(StopsOnExit):
    """The cluster, the shared snapshot service, and each run's aggregator and workers."""

    def __init__(
        self, out: Path, profile: Profile, policy: Mapping[str, str] | None = None
    ) -> None:
        if profile.cluster_runs < 1:
            raise ValueError(f"profile {profile.name} holds no cluster runs")
        self.out = out
        self.profile = profile
        #: policy fields every aggregator starts with (FEDASYNC_POLICY__*), e.g. {"mode": "memory"}
        self.policy = dict(policy or {})
        self.acl = profile.acl
        #: user → password under the ACL (fresh for each run); empty without it
        self.passwords: dict[str, str] = {}
        auth = None
        if self.acl:
            among = all_users(DEFAULT_RUN, all_runs=True, cluster=True)
            self.passwords = acl_passwords(find_redis_server(), among)
            auth = ClusterAuth.generated(self.passwords, (OBSERVER, self.passwords[OBSERVER]))
        self.cluster = LocalCluster(out / "cluster", auth=auth)
        self.snapshot_port = free_port()
        self.runs: list[ClusterRun] = []
        self.supervisor = Supervisor(out / "logs")

    @property
    def snapshot_url(self) -> str:
        return f"http://127.0.0.1:{self.snapshot_port}"

    def url_of(self, user: str, port: int | None = None) -> str:
        """The Redis URL `user` logs in with (without the ACL: the default user's), to one node
        (`port`, else the first): beside FEDASYNC_REDIS__CLUSTER it gives user and password."""
        return redis_url(f"127.0.0.1:{port or self.cluster.nodes[0].port}", user, self.passwords)

    @property
    def observer_url(self) -> str:
        """The harness's own: it may read every key of every run."""
        return self.url_of(OBSERVER)

    def observer(self, port: int, socket_timeout: float = 10.0) -> redis.Redis:
        """A client of one node (a run's primary), as the observer."""
        return redis.Redis.from_url(self.url_of(OBSERVER, port), socket_timeout=socket_timeout)

    def run_of(self, name: str) -> ClusterRun | None:
        """The run a child belongs to (by its name's `<run>.` prefix); None: the shared ones."""
        return next((r for r in self.runs if name.startswith(r.id + ".")), None)

    def latest_url(self, run: ClusterRun) -> str:
        """The run's newest model at the snapshot service (the legacy route for the default)."""
        return self.snapshot_url + latest_path(None if run.default else run.id)

    # ---------------------------------------------------------------------------- the children
    def _env(self, run: str, user: str) -> dict[str, str]:
        """The settings of a child of `run` that logs in as `user`."""
        env = {
            "FEDASYNC_REDIS__URL": self.url_of(user),
            "FEDASYNC_REDIS__CLUSTER": self.cluster.addresses,
            "FEDASYNC_REDIS__KEY_PREFIX": run,
            "FEDASYNC_REDIS__SOCKET_TIMEOUT_S": REPLICATED_SOCKET_TIMEOUT_S,
            "FEDASYNC_REDIS__CONNECT_TIMEOUT_S": "1.0",
            "FEDASYNC_REDIS__DURABLE_TIMEOUT_MS": DURABLE_TIMEOUT_MS,
            "FEDASYNC_REDIS__RECONNECT_ATTEMPTS": FAILOVER_RECONNECT_ATTEMPTS,
            "FEDASYNC_AGGREGATOR__REFUSAL_LINGER_S": REFUSAL_LINGER_S,
            "FEDASYNC_AUTH__DEFAULT_RUN": self.runs[0].id,
            "FEDASYNC_TASK__NAME": "linear",
            "FEDASYNC_TASK__NUM_DEVICES": str(self.profile.workers),
            "FEDASYNC_BUDGET__MAX_UPDATES": "100000000",
            "FEDASYNC_BUDGET__MAX_SECONDS": "100000000",
            "FEDASYNC_AGGREGATOR__KEEP_PAYLOADS": "true",  # `ledger verify` replays them
            "FEDASYNC_AGGREGATOR__KEEP_VERSIONS": str(KEEP_VERSIONS),
            "FEDASYNC_AGGREGATOR__BLOCK_MS": str(AGGREGATOR_SETTINGS.block_ms),
        }
        if self.profile.durable_replicas is not None:  # None: the cluster's default (1)
            env["FEDASYNC_REDIS__DURABLE_REPLICAS"] = str(self.profile.durable_replicas)
        return env | {env_name("policy", name): value for name, value in self.policy.items()}

    def aggregator_spec(self, run: ClusterRun) -> ServiceSpec:
        return ServiceSpec(
            run.aggregator,
            "fedasync.services.aggregator",
            self._env(run.id, "aggregator")
            | {
                "FEDASYNC_AGGREGATOR__PORT": str(run.aggregator_port),
                "FEDASYNC_AGGREGATOR__BATCH_MS": str(AGGREGATOR_SETTINGS.batch_ms),
            },
            ready_url=f"http://127.0.0.1:{run.aggregator_port}/readyz",
        )

    def snapshot_spec(self) -> ServiceSpec:
        return ServiceSpec(
            SNAPSHOT,
            "fedasync.services.snapshot",
            self._env(self.runs[0].id, "snapshot")
            | {"FEDASYNC_SNAPSHOT__PORT": str(self.snapshot_port)},
            ready_url=f"{self.snapshot_url}/readyz",
        )

    def worker_spec(self, run: ClusterRun, index: int) -> ServiceSpec:
        name = run.workers[index]
        local = name.removeprefix(run.id + ".")
        return ServiceSpec(
            name,
            "fedasync.services.worker",
            self._env(run.id, "worker")
            | {
                "FEDASYNC_WORKER__DEVICE_INDEX": str(index),
                "FEDASYNC_WORKER__SNAPSHOT_URL": self.snapshot_url,
                # as chaos/system.py's: the long-tail fleet, sped up, so updates flow quickly
                "FEDASYNC_WORKER__PROFILE": "longtail",
                "FEDASYNC_WORKER__TIME_SCALE": "0.003",
                "FEDASYNC_WORKER__DOWNLOAD_TIMEOUT_S": "10",
                "FEDASYNC_WORKER__JOURNAL": str(run.journal_dir / f"{local}.journal"),
            },
        )

    def spec(self, name: str) -> ServiceSpec:
        """The spec a child of that name starts from (again)."""
        if name == SNAPSHOT:
            return self.snapshot_spec()
        run = self.run_of(name)
        if run is None:
            raise KeyError(name)
        if name == run.aggregator:
            return self.aggregator_spec(run)
        return self.worker_spec(run, run.workers.index(name))

    def user_of(self, name: str) -> str | None:
        """The Redis user the child `name` logs in as (None: the default user, no ACL)."""
        return urlsplit(self.spec(name).env["FEDASYNC_REDIS__URL"]).username

    @property
    def children(self) -> list[str]:
        """Every child's name: the aggregators, the snapshot service, the workers."""
        return [
            *(r.aggregator for r in self.runs),
            SNAPSHOT,
            *(w for r in self.runs for w in r.workers),
        ]

    @property
    def workers(self) -> list[str]:
        return [w for r in self.runs for w in r.workers]

    # ---------------------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 90.0) -> None:
        """The cluster; the runs placed on distinct primaries; every aggregator (each commits
        its run's genesis and records its task, by which the snapshot service knows the run),
        then the snapshot service, each ready; then the workers."""
        self.cluster.start(timeout)
        ids = prefixes_on_distinct_primaries(
            self.cluster, list(RUN_CANDIDATES), self.profile.cluster_runs
        )
        for i, run_id in enumerate(ids):
            journal = self.out / "journal" / run_id
            journal.mkdir(parents=True, exist_ok=True)
            workers = [f"{run_id}.{worker_name(w)}" for w in range(self.profile.workers)]
            self.runs.append(ClusterRun(run_id, i == 0, free_port(), workers, journal))
        for run in self.runs:
            self.supervisor.start(self.aggregator_spec(run))
        for run in self.runs:
            self.supervisor.wait_ready(run.aggregator, timeout)
        self.supervisor.start(self.snapshot_spec())
        self.supervisor.wait_ready(SNAPSHOT, timeout)
        for run in self.runs:
            for index in range(self.profile.workers):
                self.supervisor.start(self.worker_spec(run, index))

    def stop(self) -> None:
        """Every child (workers first), then the cluster. Safe to call twice."""
        self.supervisor.stop_all(
            groups=[self.workers, [SNAPSHOT], [r.aggregator for r in self.runs]]
        )
        self.cluster.stop()
