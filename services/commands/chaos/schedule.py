"""What the chaos harness does, and when: profiles and the seeded fault schedule.

The schedule is a pure function of the profile and the seed, so a failing run can be repeated
fault for fault (`fedasync chaos --seed N`); only the instants the faults land on, relative to
what the services are doing, vary between runs, which is the point of injecting them.
numpy and the proxy are imported by `build_schedule`: `fedasync chaos --help` lists the profiles
without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    KILL_WORKER = "kill_worker"  # kill -9 one worker, restart it after a short outage
    KILL_AGGREGATOR = "kill_aggregator"  # kill -9 the aggregator, restart it
    KILL_REDIS = "kill_redis"  # kill -9 redis-server, restart it from its AOF (same port, dir)
    PAUSE_REDIS = "pause_redis"  # CLIENT PAUSE: clients' sockets time out, commands queue
    RESTART_SNAPSHOT = "restart_snapshot"  # SIGTERM the snapshot service, start it again later
    #: start a second aggregator while the first runs; the first is stopped (SIGSTOP) meanwhile,
    #: so its blocked read strands entries under it, then continued: it finds itself fenced off
    SECOND_AGGREGATOR = "second_aggregator"
    #: one command of the aggregator's held at the Redis proxy, longer than its socket timeout
    STALL_REDIS = "stall_redis"
    #: a burst of slow HTTP clients (slowloris) against the snapshot service, for a while
    SLOW_CLIENTS = "slow_clients"
    #: kill -9 the primary of a replicated Redis; Sentinel promotes a replica, the services
    #: follow it; the killed server starts again later, as a replica (replicated profiles only)
    FAILOVER = "failover"
    #: SIGSTOP the primary of a replicated Redis past the Sentinels' down-after, until they
    #: promote a replica and `outage_s` longer, then SIGCONT it: it comes back still a primary
    #: in its own eyes, with the services' connections still open (replicated profiles only)
    PAUSE_PRIMARY = "pause_primary"


#: the losses of a primary: only a replicated profile (Sentinel) or a cluster profile has a
#: replica to promote
REPLICATED_ONLY = frozenset({FaultKind.FAILOVER, FaultKind.PAUSE_PRIMARY})

#: commands the aggregator sends on every batch, commit or claim: a stall armed on one of them
#: happens within moments (services/commands/chaos/proxy.py names them)
STALLED_COMMANDS = ("XREADGROUP", "EVALSHA", "GET", "XPENDING", "EXISTS", "XINFO GROUPS", "XLEN")


@dataclass(frozen=True, slots=True)
class Profile:
    """How many faults of each kind, over how long, against how many workers."""

    name: str
    workers: int
    #: seconds of normal operation before the first fault
    warmup_s: float
    #: the faults land in [warmup_s, warmup_s + window_s]
    window_s: float
    #: least time between two faults: each finds the previous one recovered
    min_gap_s: float
    faults: tuple[tuple[FaultKind, int], ...]
    #: how long a killed or stopped service stays down before it is started again
    outage_s: tuple[float, float] = (0.1, 0.6)
    #: how long CLIENT PAUSE lasts; above the services' socket timeout so they really time out
    pause_ms: tuple[int, int] = (2500, 3500)
    #: how long a stalled command is held; above the aggregator's socket timeout
    stall_ms: tuple[int, int] = (1500, 3000)
    #: how long the first aggregator stays stopped once a second one started: above the claim
    #: bound, so what its blocked read took is the running one's to take over
    stopped_s: tuple[float, float] = (4.0, 6.0)
    #: how many slow clients a burst opens, and how long it trickles
    slow_clients: int = 100
    #: above the services' header timeout (FEDASYNC_HTTP__HEADER_TIMEOUT_S, 10 s): the service
    #: must cut every one of them off before the burst ends
    slow_s: tuple[float, float] = (14.0, 18.0)
    #: Redis loads the generated ACL file and every service logs in as its own user
    acl: bool = True
    #: Redis as a primary, two replicas and three Sentinels
    #: (services/commands/redis_launch/sentinel.py)
    replicated: bool = False
    #: durable mode: WAIT for this many replicas (0: off), also the servers'
    #: `min-replicas-to-write`; None: the shipped default (no FEDASYNC_REDIS__DURABLE_REPLICAS,
    #: so on with Sentinels; the servers as docker/redis/entrypoint.sh sets them)
    durable_replicas: int | None = 0
    #: how far behind its primary a replica receives the replication stream, ms (chaos/links.py):
    #: replicas on other hosts; 0: all on this one, replication as fast as loopback
    replica_lag_ms: int = 0
    #: a Redis Cluster (3 primaries, a replica each) holding this many runs, each on a primary
    #: of its own, `workers` workers per run (chaos/cluster_system.py); 0: no cluster
    cluster_runs: int = 0

    @property
    def label(self) -> str:
        """The name, with the durable mode of a replicated or cluster profile."""
        if self.cluster_runs:
            return f"{self.name}, {self.cluster_runs} runs on 3 primaries, {durable_label(self)}"
        if not self.replicated:
            return self.name
        return f"{self.name}, replicas {self.replica_lag_ms} ms behind, {durable_label(self)}"


def durable_label(profile: Profile) -> str:
    """How a replicated profile's durable mode is set, as the failover table heads it."""
    if profile.durable_replicas is None:
        return "shipped default (durable on, WAIT 1, min-replicas 1)"
    if profile.durable_replicas:
        return f"durable on (WAIT {profile.durable_replicas})"
    return "durable off"


PROFILES: dict[str, Profile] = {
    "fast": Profile(
        name="fast",
        workers=4,
        warmup_s=3.0,
        window_s=30.0,
        min_gap_s=1.2,
        faults=(
            (FaultKind.KILL_AGGREGATOR, 3),
            (FaultKind.KILL_WORKER, 5),
            (FaultKind.KILL_REDIS, 2),
            (FaultKind.PAUSE_REDIS, 1),
            (FaultKind.RESTART_SNAPSHOT, 1),
            (FaultKind.SECOND_AGGREGATOR, 1),
            (FaultKind.STALL_REDIS, 2),
            (FaultKind.SLOW_CLIENTS, 1),
        ),
    ),
    "long": Profile(
        name="long",
        workers=6,
        warmup_s=3.0,
        window_s=150.0,
        min_gap_s=1.2,
        faults=(
            (FaultKind.KILL_AGGREGATOR, 12),
            (FaultKind.KILL_WORKER, 24),
            (FaultKind.KILL_REDIS, 6),
            (FaultKind.PAUSE_REDIS, 4),
            (FaultKind.RESTART_SNAPSHOT, 3),
            (FaultKind.SECOND_AGGREGATOR, 4),
            (FaultKind.STALL_REDIS, 8),
            (FaultKind.SLOW_CLIENTS, 3),
        ),
    ),
    # the long profile's Redis kills under the ACL on their own, in a minute
    "redis": Profile(
        name="redis",
        workers=4,
        warmup_s=3.0,
        window_s=40.0,
        min_gap_s=2.0,
        faults=(
            (FaultKind.KILL_AGGREGATOR, 2),
            (FaultKind.KILL_WORKER, 2),
            (FaultKind.KILL_REDIS, 8),
            (FaultKind.PAUSE_REDIS, 0),
            (FaultKind.RESTART_SNAPSHOT, 0),
            (FaultKind.SECOND_AGGREGATOR, 0),
            (FaultKind.STALL_REDIS, 0),
            (FaultKind.SLOW_CLIENTS, 0),
        ),
    ),
    # kill -9 and pause-then-resume of the primary under Sentinel, four of each: run with
    # durable mode off, on, and as shipped (`fedasync chaos --profile failover`), the replicas
    # 100 ms behind (other hosts across a slow link, or replicas under load;
    # `--replica-lag-ms` changes it). A Sentinel starts no second failover of the same primary
    # within twice its failover timeout (6 s): the gap leaves room for that, for the lost
    # server's return (a pause: down-after, the promotion, `outage_s`, the demotion) and its
    # resync. A paused primary is resumed 0.5-1.5 s after the promotion: before the services'
    # 10 s socket timeout ends the commands that wait in it, as on a deployment
    "failover": Profile(
        name="failover",
        workers=4,
        warmup_s=4.0,
        window_s=150.0,
        min_gap_s=18.0,
        faults=((FaultKind.FAILOVER, 4), (FaultKind.PAUSE_PRIMARY, 4)),
        outage_s=(0.5, 1.5),
        replicated=True,
        replica_lag_ms=100,
    ),
    # kill -9 of a Redis Cluster primary under load, round-robin over the primaries that hold
    # a run (`fedasync chaos --profile cluster-failover`, chaos/cluster_failover.py): three
    # runs, one on each primary, durable mode on (the cluster default, WAIT 1), and each kill
    # read per run, the victim (its slot's primary lost) and the bystanders, under the ACL as
    # the other profiles (chaos/cluster_system.py). Each kill waits
    # for the cluster to be settled again (the killed node back as a replica, in sync) and the
    # victim to have committed since the last one; the gap is a floor, not a pace
    "cluster-failover": Profile(
        name="cluster-failover",
        workers=2,
        warmup_s=4.0,
        window_s=30.0,
        min_gap_s=12.0,
        faults=((FaultKind.FAILOVER, 3),),
        outage_s=(0.5, 1.5),
        durable_replicas=1,
        cluster_runs=3,
    ),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: at `at` seconds into the fault phase, against `target`, lasting `outage_s`."""

    at: float
    kind: FaultKind
    #: the worker index for KILL_WORKER, else 0
    target: int = 0
    #: seconds down before the restart (kills, snapshot stop); the pause length for PAUSE_REDIS,
    #: the stall's for STALL_REDIS, how long the first aggregator stays stopped for
    #: SECOND_AGGREGATOR
    outage_s: float = 0.0
    #: STALL_REDIS: the command held, and how ("reply" or "request")
    command: str = ""
    mode: str = ""

    def describe(self) -> str:
        who = f" worker-{self.target}" if self.kind is FaultKind.KILL_WORKER else ""
        if self.kind is FaultKind.STALL_REDIS:
            who = f" {self.command} ({self.mode})"
        return f"{self.kind.value}{who} ({self.outage_s:.2f} s)"


def build_schedule(profile: Profile, seed: int) -> list[Fault]:
    """The faults of `profile` in time order: kinds shuffled, times uniform with a minimum gap.

    Times are drawn as sorted uniforms in the window shortened by the gaps, then spread by one
    gap each, which keeps them uniform without rejection sampling.
    """
    import numpy as np

    from fedasync.services.commands.chaos.proxy import StallMode

    # how a stall holds the command: its reply lost, or the command itself late
    stall_modes = tuple(mode.value for mode in StallMode)
    rng = np.random.default_rng(seed)
    kinds = [kind for kind, count in profile.faults for _ in range(count)]
    rng.shuffle(kinds)
    n = len(kinds)
    slack = profile.window_s - profile.min_gap_s * max(n - 1, 0)
    if slack < 0:
        raise ValueError(f"profile {profile.name}: {n} faults do not fit in {profile.window_s} s")
    draws = np.sort(rng.uniform(0.0, slack, n))
    faults = []
    for i, (kind, draw) in enumerate(zip(kinds, draws, strict=True)):
        at = profile.warmup_s + float(draw) + i * profile.min_gap_s
        target = int(rng.integers(profile.workers)) if kind is FaultKind.KILL_WORKER else 0
        command = mode = ""
        if kind is FaultKind.PAUSE_REDIS:
            outage = float(rng.integers(profile.pause_ms[0], profile.pause_ms[1] + 1)) / 1000
        elif kind is FaultKind.STALL_REDIS:
            outage = float(rng.integers(profile.stall_ms[0], profile.stall_ms[1] + 1)) / 1000
            command = str(rng.choice(STALLED_COMMANDS))
            mode = str(rng.choice(stall_modes))
        elif kind is FaultKind.SECOND_AGGREGATOR:
            outage = float(rng.uniform(*profile.stopped_s))
        elif kind is FaultKind.SLOW_CLIENTS:
            outage = float(rng.uniform(*profile.slow_s))
        else:
            outage = float(rng.uniform(*profile.outage_s))
        faults.append(Fault(round(at, 3), kind, target, round(outage, 3), command, mode))
    return faults
