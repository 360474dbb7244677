"""Redis replicated under Sentinel, as real processes: a primary, replicas and Sentinels.

For the failover test and `fedasync chaos --profile failover`: each server and each Sentinel is
its own `redis-server` process with its own directory and free port (servers through
`RedisServer`, AOF fsynced at every write as everywhere else), so a kill -9 of the primary is what
it would be on a host of its own: the Sentinels notice, agree, promote the replica with the most
data, repoint the others, and turn the old primary into a replica once it is started again. A
SIGSTOP (`pause`) is a host frozen instead (a VM paused, a stall, a partition): its connections
stay open, and after `resume` it takes itself for the primary until the Sentinels demote it.

Each server can be given an address in front of it (`fronts`: a port that forwards to it, such as
the chaos harness's replica links, services/commands/chaos/links.py): the others, Sentinels and
clients then know it only by that address (`replica-announce-port`, `replicaof`, `sentinel
monitor`), as they would know a host across a network.

`sentinel_conf` writes a Sentinel's configuration file; docker/redis/sentinel.conf (compose's
`ha` profile) is the same function's output with password placeholders. Under the ACL each
server loads the generated file (services/stores/acl.py): replicas log in to their primary as
`replica`, the Sentinels to every server as `sentinel`, and to each other as `sentinel` too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from fedasync.services.commands.redis_launch.server import (
    RedisServer,
    find_redis_server,
    free_port,
    wait_answering,
)
from fedasync.services.runtime.supervisor import die_with_parent, stop_process
from fedasync.services.stores.acl import (
    REPLICA_USER,
    SENTINEL_USER,
    acl_file,
    sentinel_acl,
    sentinel_users,
)

#: how often the group polls while it waits for Sentinel to act, seconds
POLL_S = 0.05
#: what the shipped HA configuration (compose's `ha` profile, docker/redis/entrypoint.sh) sets on
#: every server: a primary takes a write only while one of its (two) replicas has acknowledged
#: the replication stream within the last `SHIPPED_MIN_REPLICAS_MAX_LAG_S` seconds. Below
#: Sentinel's down-after (5 s), so a primary cut off from its replicas (partitioned, or paused
#: and resumed after its replicas moved on) refuses writes on its own before or as soon as the
#: Sentinels replace it; with two replicas, losing one still leaves writes possible
SHIPPED_MIN_REPLICAS_TO_WRITE = 1
SHIPPED_MIN_REPLICAS_MAX_LAG_S = 4


@dataclass(frozen=True, slots=True)
class Topology:
    """How many of each, and how quickly the Sentinels act."""

    master_name: str = "fedasync"
    replicas: int = 2
    sentinels: int = 3
    #: Sentinels that must agree the primary is down before one of them fails it over
    quorum: int = 2
    #: silence after which a Sentinel thinks a server down, ms. A Sentinel promotes no replica
    #: whose link to the primary has been down more than ten times this (plus the time the
    #: primary has been down): 5 s keeps that above the 30 s a Sentinel sits out in TILT mode
    #: after its own process stalled (a loaded machine), so a failover is late, never refused
    down_after_ms: int = 5000
    #: bounds each failover's steps; after one, no new failover of the same primary starts for
    #: twice this long (Sentinel's own rule), ms
    failover_timeout_ms: int = 3000
    #: the servers' `min-replicas-to-write`: as shipped (`SHIPPED_MIN_REPLICAS_TO_WRITE`), or
    #: 0 (Redis's default: a primary cut off from every replica goes on taking writes)
    min_replicas_to_write: int = 0
    #: the servers' `min-replicas-max-lag`, seconds: a replica silent longer does not count
    min_replicas_max_lag_s: int = 10


@dataclass(frozen=True, slots=True)
class Auth:
    """The passwords the group's processes use under the ACL, and the files they load."""

    #: the data servers' ACL file (the generated one, plus `admin`)
    acl_file: str
    #: the Sentinels' `user` lines (the generated ones, plus `admin`)
    sentinel_users: str
    replica_password: str
    sentinel_password: str
    #: a user with every right on servers and Sentinels alike: the group's own queries
    admin: tuple[str, str]

    @classmethod
    def generated(cls, prefix: str, passwords: Mapping[str, str], admin: tuple[str, str]) -> Auth:
        """fedasync's users (services/stores/acl.py) with `passwords` (user → password, every
        server and Sentinel user's), and `admin` appended on both sides."""
        name, secret = admin
        admin_line = f"user {name} on >{secret} ~* &* +@all\n"
        sentinel_side = {u.name: passwords[u.name] for u in sentinel_users()}
        return cls(
            acl_file=acl_file(prefix, passwords) + admin_line,
            sentinel_users=sentinel_acl(sentinel_side) + admin_line,
            replica_password=passwords[REPLICA_USER],
            sentinel_password=passwords[SENTINEL_USER],
            admin=admin,
        )


def sentinel_conf(
    *,
    master_name: str,
    host: str,
    port: int,
    quorum: int,
    down_after_ms: int,
    failover_timeout_ms: int,
    sentinel_password: str | None,
    users: str = "",
    listen: tuple[str, int] | None = None,
    hostnames: bool = False,
) -> str:
    """A Sentinel's configuration file: whom it watches, how patiently, and as whom it logs in.

    `sentinel_password` is the `sentinel` user's (on the servers and on the other Sentinels);
    None: no ACL. `users` are the `user` lines of the Sentinel itself (services/stores/acl.py,
    `sentinel_acl`). `listen` is (bind address, port); None keeps Sentinel's 26379 on every
    interface (a container). `hostnames`: the servers are named, not numbered (compose).
    """
    lines = []
    if listen is not None:
        lines += [f"bind {listen[0]}", f"port {listen[1]}"]
    if hostnames:
        lines += ["sentinel resolve-hostnames yes", "sentinel announce-hostnames yes"]
    lines += [
        f"sentinel monitor {master_name} {host} {port} {quorum}",
        f"sentinel down-after-milliseconds {master_name} {down_after_ms}",
        f"sentinel failover-timeout {master_name} {failover_timeout_ms}",
        f"sentinel parallel-syncs {master_name} 1",
    ]
    if sentinel_password is not None:
        lines += [
            f"sentinel auth-user {master_name} {SENTINEL_USER}",
            f"sentinel auth-pass {master_name} {sentinel_password}",
            f"sentinel sentinel-user {SENTINEL_USER}",
            f"sentinel sentinel-pass {sentinel_password}",
        ]
    return "\n".join(lines) + "\n" + users


class SentinelServer:
    """One `redis-server --sentinel` child process with its configuration file in `directory`.

    The file is written once: Sentinel rewrites it with what it learns (the primary after a
    failover, the replicas, the other Sentinels), and a restart must start from that."""

    def __init__(self, directory: Path, config: str, port: int, binary: str) -> None:
        self.directory = directory
        self.config = config
        self.port = port
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "sentinel.conf"
        if not path.exists():
            path.write_text(f"dir {self.directory}\n" + self.config)
            path.chmod(0o600)  # passwords
        log = (self.directory / "sentinel.log").open("ab")
        self.process = subprocess.Popen(
            [self.binary, str(path), "--sentinel"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        log.close()
        wait_answering(self.process, self.port, timeout)

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None


class ReplicatedRedis:
    """A primary, `topology.replicas` replicas and `topology.sentinels` Sentinels.

    Server 0 starts as the primary. Which one is the primary later is the Sentinels' answer
    (`primary_port`); a killed server is started again as a replica of the primary of the
    moment (`restart`), as an operator would.
    """

    def __init__(
        self, directory: Path, topology: Topology | None = None, auth: Auth | None = None
    ) -> None:
        self.directory = directory
        self.topology = topology or Topology()
        self.auth = auth
        self.binary = find_redis_server()
        self.servers = [
            RedisServer(directory / f"server-{i}", binary=self.binary, config_file=True)
            for i in range(self.topology.replicas + 1)
        ]
        #: server port → the port everyone else knows it by (set before `start`); none: its own
        self.fronts: dict[int, int] = {}
        self.sentinel_ports = [free_port() for _ in range(self.topology.sentinels)]
        self.sentinels: list[SentinelServer] = []

    def address(self, server: RedisServer) -> int:
        """The port the others reach `server` at."""
        return self.fronts.get(server.port, server.port)

    def _sentinel(self, index: int, port: int) -> SentinelServer:
        t, auth = self.topology, self.auth
        config = sentinel_conf(
            master_name=t.master_name,
            host="127.0.0.1",
            port=self.address(self.servers[0]),
            quorum=t.quorum,
            down_after_ms=t.down_after_ms,
            failover_timeout_ms=t.failover_timeout_ms,
            sentinel_password=None if auth is None else auth.sentinel_password,
            users="" if auth is None else auth.sentinel_users,
            listen=("127.0.0.1", port),
        )
        return SentinelServer(self.directory / f"sentinel-{index}", config, port, self.binary)

    @property
    def sentinel_addresses(self) -> str:
        """As FEDASYNC_REDIS__SENTINELS takes them."""
        return ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)

    # ------------------------------------------------------------------------------ servers
    def _args(self, server: RedisServer, primary: int | None) -> tuple[str, ...]:
        # a replica that comes back is sent the data at once, not after the default 5 s wait
        # for others to share the transfer with
        args: list[str] = ["--repl-diskless-sync-delay", "0"]
        if self.auth is not None:
            acl = server.directory / "users.acl"
            server.directory.mkdir(parents=True, exist_ok=True)
            acl.write_text(self.auth.acl_file)
            acl.chmod(0o600)
            args += ["--aclfile", str(acl)]
            args += ["--masteruser", REPLICA_USER, "--masterauth", self.auth.replica_password]
        if self.topology.min_replicas_to_write:
            args += ["--min-replicas-to-write", str(self.topology.min_replicas_to_write)]
            args += ["--min-replicas-max-lag", str(self.topology.min_replicas_max_lag_s)]
        if server.port in self.fronts:
            args += ["--replica-announce-port", str(self.fronts[server.port])]
        if primary is not None:
            args += ["--replicaof", "127.0.0.1", str(primary)]
        return tuple(args)

    def start(self, timeout: float = 60.0) -> None:
        """Every server and Sentinel; returns once the Sentinels know the replicas and each
        other, and every replica is in sync, so a failover can happen."""
        primary = self.servers[0]
        primary.extra_args = self._args(primary, None)
        primary.start()
        for server in self.servers[1:]:
            server.extra_args = self._args(server, self.address(primary))
            server.start()
        self.sentinels = [self._sentinel(i, port) for i, port in enumerate(self.sentinel_ports)]
        for sentinel in self.sentinels:
            sentinel.start()
        self.wait_settled(timeout)

    def server_on(self, port: int) -> RedisServer:
        """The server with this port or address."""
        return next(s for s in self.servers if port in (s.port, self.address(s)))

    def kill(self, server: RedisServer) -> None:
        """SIGKILL: the host is gone, with whatever it had not yet sent to its replicas."""
        server.kill()

    def pause(self, server: RedisServer) -> None:
        """SIGSTOP: the host frozen (a VM paused, a long stall, a partition): its sockets stay
        open, and whatever clients send it waits in them until `resume`."""
        if server.process is not None:
            server.process.send_signal(signal.SIGSTOP)

    def resume(self, server: RedisServer) -> None:
        """SIGCONT a paused server: it goes on as it was, a primary in its own eyes until the
        Sentinels tell it otherwise."""
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)

    def restart(self, server: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed server again, as a replica of the primary the Sentinels name now; as
        the primary if they still name it (it came back before they promoted anyone)."""
        primary = self.primary_port()
        server.extra_args = self._args(server, None if primary == self.address(server) else primary)
        server.start(timeout=timeout)

    def stop(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            self.resume(server)  # a stopped process would not act on SIGTERM
            server.stop()

    # ------------------------------------------------------------------------------ queries
    def _client(self, port: int, timeout: float = 2.0) -> redis.Redis:
        user, password = self.auth.admin if self.auth is not None else (None, None)
        return redis.Redis(
            port=port, username=user, password=password, socket_timeout=timeout, protocol=2
        )

    def _ask(self, port: int, *command: Any) -> Any:
        client = self._client(port)
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def primary_port(self) -> int:
        """The primary's port (its address), as the first Sentinel that answers names it."""
        errors = []
        for port in self.sentinel_ports:
            try:
                reply = self._ask(port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
            except (redis.RedisError, OSError) as exc:
                errors.append(str(exc))
                continue
            if reply:
                return int(reply[1])
        raise RuntimeError(f"no Sentinel names a primary: {errors}")

    @property
    def master_name(self) -> str:
        return self.topology.master_name

    def replication(self, port: int) -> dict[str, Any]:
        """INFO replication of one server (by port or address)."""
        client = self._client(self.server_on(port).port)
        try:
            info: dict[str, Any] = client.info("replication")
        finally:
            client.close()
        return info

    def read(self, port: int, key: str) -> bytes | None:
        """GET on one server (by port or address; the admin may read every key)."""
        value: bytes | None = self._ask(self.server_on(port).port, "GET", key)
        return value

    def wait_promoted(self, old: int, timeout: float = 60.0) -> tuple[int, float]:
        """Wait until the Sentinels name a primary other than `old`, and it says it is one;
        (its port, the seconds waited)."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            try:
                port = self.primary_port()
                if port != old and self.replication(port).get("role") == "master":
                    return port, time.monotonic() - started
            except (redis.RedisError, OSError, RuntimeError):
                pass
            time.sleep(POLL_S)
        raise TimeoutError(f"no replica of 127.0.0.1:{old} promoted in {timeout} s")

    def wait_settled(self, timeout: float = 60.0) -> None:
        """Wait until every running server is either the primary or its replica in sync (link
        up, offset equal), and every Sentinel knows them all and the other Sentinels."""
        deadline = time.monotonic() + timeout
        problem = "not checked"
        while time.monotonic() < deadline:
            problem = self._unsettled()
            if not problem:
                return
            time.sleep(POLL_S * 4)
        raise TimeoutError(f"replication not settled in {timeout} s: {problem}")

    def _unsettled(self) -> str:
        try:
            primary = self.primary_port()
            info = self.replication(primary)
            if info.get("role") != "master":
                return f"127.0.0.1:{primary} is not a primary yet"
            running = [
                s for s in self.servers if s.process is not None and self.address(s) != primary
            ]
            for server in running:
                replica = self.replication(server.port)
                if replica.get("role") != "slave" or replica.get("master_port") != primary:
                    return f"127.0.0.1:{server.port} does not replicate 127.0.0.1:{primary}"
                if replica.get("master_link_status") != "up":
                    return f"127.0.0.1:{server.port}: link to the primary down"
            for port in self.sentinel_ports:
                state = _pairs(self._ask(port, "SENTINEL", "MASTER", self.master_name))
                replicas = [
                    _pairs(r) for r in self._ask(port, "SENTINEL", "REPLICAS", self.master_name)
                ]
                up = [r for r in replicas if "disconnected" not in r["flags"]]
                others = int(state["num-other-sentinels"])
                if len(up) < len(running) or others < len(self.sentinel_ports) - 1:
                    return (
                        f"Sentinel {port} knows {len(up)} of {len(running)} replicas and "
                        f"{others} of {len(self.sentinel_ports) - 1} other Sentinels"
                    )
        except (redis.RedisError, OSError, RuntimeError) as exc:
            return str(exc)
        return ""

    def acl_refusals(self) -> list[str]:
        """Commands the ACL refused on any running server or Sentinel (not failed logins)."""
        out = []
        ports = [s.port for s in self.servers if s.process is not None] + self.sentinel_ports
        for port in ports:
            client = self._client(port)
            try:
                entries: Sequence[Mapping[str, Any]] = client.acl_log()
            except (redis.RedisError, OSError):
                continue
            finally:
                client.close()
            for entry in entries:
                if _text(entry["reason"]) == "auth":
                    continue
                out.append(f"{port}: {_text(entry['username'])}: {_text(entry['object'])}")
        return out


def _pairs(reply: Sequence[Any]) -> dict[str, str]:
    """A Sentinel's flat [name, value, name, value, ...] reply as a dict of text."""
    items = [_text(v) for v in reply]
    return dict(zip(items[::2], items[1::2], strict=True))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
