"""A Redis Cluster as real processes: three primaries, a replica of each, on free ports.

For the cluster tests, and later the cluster failover audit and the runs bench: each node is its
own `redis-server` process (through `RedisServer`: AOF fsynced at every write, as everywhere
else) with its own directory, where it keeps `nodes.conf`, so a node killed -9 and started again
on the same port and directory rejoins the cluster as it left it: a primary whose replica was
promoted meanwhile comes back as that replica's replica.

Every node gets `--cluster-port` (the bus port): the default, port + 10000, overflows for the
high ports `free_port` hands out. `cluster-require-full-coverage no` keeps the slots of the live
primaries served while another primary is down (one run's failover must not stop the others),
and `cluster-allow-replica-migration no` keeps each replica with its primary, so which node
holds what stays predictable across kills. The cluster is made with `redis-cli --cluster
create` (by hand below three primaries, which it refuses: the throughput bench compares one
primary with three), and `start` returns once every node says `cluster_state:ok`, agrees on the
slot map, and every replica is in sync with its primary.

With `auth` (`ClusterAuth`) every node loads the ACL file for every run on a cluster
(services/stores/acl.py, `acl_file(..., all_runs=True, cluster=True)`, with real passwords):
each replica logs in to its primary as `replica` (masteruser/masterauth), `redis-cli --cluster
create` runs as `cluster-admin`, and this harness's own queries as a test-only user with every
right (`ClusterAuth.admin`), as redis_launch/sentinel.py does for Sentinel.

The methods mirror redis_launch/sentinel.ReplicatedRedis, which services/commands/chaos/faults.py
drives (kill, pause, resume, restart, read, wait_promoted, wait_settled), with `primary_of(key)`
in place of `primary_port()`: a cluster has a primary per slot.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from fedasync.services.commands.redis_launch.server import RedisServer, find_redis_server, free_port
from fedasync.services.stores.acl import CLUSTER_ADMIN_USER, REPLICA_USER, acl_file
from fedasync.shared.runs import DEFAULT_RUN

#: how often the cluster is polled while it settles or fails over, seconds
POLL_S = 0.05
#: a node silent this long is failed by the others, and its replica promoted, ms
NODE_TIMEOUT_MS = 2000


def find_redis_cli() -> str:
    """redis-cli, beside the redis-server found, or on PATH."""
    beside = Path(find_redis_server()).with_name("redis-cli")
    found = str(beside) if beside.is_file() else shutil.which("redis-cli")
    if not found:
        raise RuntimeError("no redis-cli found: `redis-cli --cluster create` makes the cluster")
    return found


@dataclass(frozen=True, slots=True)
class ClusterAuth:
    """The ACL file every node loads, and the passwords the cluster's own processes use."""

    acl_file: str
    replica_password: str
    #: the user and password `redis-cli --cluster create` logs in with
    cluster_admin: tuple[str, str]
    #: a user with every right: the harness's own queries (slot map, roles, reads)
    admin: tuple[str, str]

    @classmethod
    def generated(cls, passwords: Mapping[str, str], admin: tuple[str, str]) -> ClusterAuth:
        """fedasync's users for every run on a cluster (services/stores/acl.py) with
        `passwords` (user → password, each one's), and `admin` appended."""
        name, secret = admin
        text = acl_file(DEFAULT_RUN, passwords, all_runs=True, cluster=True)
        return cls(
            acl_file=text + f"user {name} on >{secret} ~* &* +@all\n",
            replica_password=passwords[REPLICA_USER],
            cluster_admin=(CLUSTER_ADMIN_USER, passwords[CLUSTER_ADMIN_USER]),
            admin=admin,
        )


class LocalCluster:
    """`primaries` primaries with `replicas` replicas each, made into one Redis Cluster.

    The node objects stay with their ports for good; which of them is a primary changes with
    every failover (`primary_of`, `primaries`)."""

    def __init__(
        self,
        directory: Path,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = NODE_TIMEOUT_MS,
        extra_args: tuple[str, ...] = (),
        auth: ClusterAuth | None = None,
    ) -> None:
        self.directory = directory
        self.auth = auth
        self.primary_count = primaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.binary = find_redis_server()
        self.nodes = [
            RedisServer(directory / f"node-{i}", binary=self.binary)
            for i in range(primaries * (replicas + 1))
        ]
        #: node port → its cluster bus port (kept across restarts: nodes.conf names it)
        self.bus_ports = {node.port: free_port() for node in self.nodes}
        for node in self.nodes:
            node.extra_args = self._args(node, extra_args)
        #: ports of the nodes SIGSTOPped (`pause`) and not yet resumed: not asked anything
        self.paused: set[int] = set()

    def _args(self, node: RedisServer, extra: tuple[str, ...]) -> tuple[str, ...]:
        acl: tuple[str, ...] = ()
        if self.auth is not None:
            path = node.directory / "users.acl"
            node.directory.mkdir(parents=True, exist_ok=True)
            path.write_text(self.auth.acl_file)
            path.chmod(0o600)
            acl = ("--aclfile", str(path))
            acl += ("--masteruser", REPLICA_USER, "--masterauth", self.auth.replica_password)
        return (
            *acl,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            str(self.bus_ports[node.port]),
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            "--cluster-require-full-coverage",
            "no",
            "--cluster-allow-replica-migration",
            "no",
            # a restarted node is sent the data at once, not after the 5 s wait for company
            "--repl-diskless-sync-delay",
            "0",
            *extra,
        )

    # ------------------------------------------------------------------------------ lifecycle
    @property
    def addresses(self) -> str:
        """The nodes as FEDASYNC_REDIS__CLUSTER takes them (host:port,host:port)."""
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    @property
    def url(self) -> str:
        """A URL of one node: for FEDASYNC_REDIS__URL beside the cluster setting (it gives only
        user and password there) and for tools that talk to one node."""
        return self.nodes[0].url

    def redis_settings(self, **more: Any) -> dict[str, Any]:
        """The `redis` section of the settings for this cluster (plus `more`)."""
        return {"url": self.url, "cluster": self.addresses, **more}

    def start(self, timeout: float = 60.0) -> None:
        """Every node, then the cluster made of them; returns once it is settled."""
        for node in self.nodes:
            node.start()
        if self.primary_count < 3:
            self._make_small()
            self.wait_settled(timeout)
            return
        command = [
            find_redis_cli(),
            "--cluster",
            "create",
            *(f"127.0.0.1:{node.port}" for node in self.nodes),
            "--cluster-replicas",
            str(self.replicas),
            "--cluster-yes",
        ]
        env = None
        if self.auth is not None:
            user, password = self.auth.cluster_admin
            command += ["--user", user, "--no-auth-warning"]
            env = {**os.environ, "REDISCLI_AUTH": password}  # not on the command line
        made = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if made.returncode != 0 or "[OK] All 16384 slots covered" not in made.stdout:
            raise RuntimeError(f"redis-cli --cluster create failed: {made.stdout}{made.stderr}")
        self.wait_settled(timeout)

    def _make_small(self, timeout: float = 60.0) -> None:
        """A cluster of one or two primaries, which `redis-cli --cluster create` refuses to make
        (it wants three): each primary its share of the slots, every node met, then each replica
        told whose it is (the nodes after the primaries, `replicas` per primary in order)."""
        count = self.primary_count
        primaries, replicas = self.nodes[:count], self.nodes[count:]
        for i, node in enumerate(primaries):
            first, last = i * 16384 // count, (i + 1) * 16384 // count - 1
            self._ask(node.port, "CLUSTER", "ADDSLOTSRANGE", first, last)
            self._ask(node.port, "CLUSTER", "SET-CONFIG-EPOCH", i + 1)
        for node in self.nodes[1:]:
            self._ask(
                self.nodes[0].port,
                "CLUSTER",
                "MEET",
                "127.0.0.1",
                node.port,
                self.bus_ports[node.port],
            )
        ids = {n.port: self._ask(n.port, "CLUSTER", "MYID").decode() for n in self.nodes}
        deadline = time.monotonic() + timeout
        while not all(self._knows_all(n.port, ids.values()) for n in self.nodes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the nodes did not meet in {timeout} s")
            time.sleep(POLL_S)
        for i, node in enumerate(replicas):
            primary = primaries[i // self.replicas]
            self._ask(node.port, "CLUSTER", "REPLICATE", ids[primary.port])

    def _knows_all(self, port: int, ids: Any) -> bool:
        """The node at `port` knows every node of `ids` (past the handshake)."""
        lines = self._ask(port, "CLUSTER", "NODES").decode().splitlines()
        known = {line.split()[0] for line in lines if "handshake" not in line}
        return set(ids) <= known

    def stop(self) -> None:
        for node in self.nodes:
            self.resume(node)  # a stopped process would not act on SIGTERM
            node.stop()

    def node_on(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def kill(self, node: RedisServer) -> None:
        """SIGKILL: the host is gone, with whatever it had not yet sent to its replica."""
        node.kill()

    def pause(self, node: RedisServer) -> None:
        """SIGSTOP: the host frozen; its sockets stay open until `resume`."""
        if node.process is not None:
            node.process.send_signal(signal.SIGSTOP)
            self.paused.add(node.port)
            _wait_stopped(node.process.pid)

    def resume(self, node: RedisServer) -> None:
        """SIGCONT: a paused primary goes on as one until it hears it was replaced."""
        if node.process is not None:
            node.process.send_signal(signal.SIGCONT)
        self.paused.discard(node.port)

    def restart(self, node: RedisServer, timeout: float = 30.0) -> None:
        """Start a killed node again on its port and directory: it rejoins from nodes.conf (as
        a replica, if its replica was promoted meanwhile)."""
        node.start(timeout=timeout)

    # ------------------------------------------------------------------------------ queries
    def _client(self, port: int, timeout: float = 2.0, **more: Any) -> redis.Redis:
        user, password = self.auth.admin if self.auth is not None else (None, None)
        return redis.Redis(
            port=port,
            username=user,
            password=password,
            socket_timeout=timeout,
            protocol=2,
            **more,
        )

    def _ask(self, port: int, *command: Any) -> Any:
        client = self._client(port)
        try:
            return client.execute_command(*command)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def _info(self, port: int, section: str) -> dict[str, Any]:
        client = self._client(port)
        try:
            info: dict[str, Any] = client.info(section)
        finally:
            client.close()
        return info

    def running(self) -> list[RedisServer]:
        """The nodes started and not paused."""
        return [n for n in self.nodes if n.process is not None and n.port not in self.paused]

    def slot_owners(self, port: int | None = None) -> dict[int, int]:
        """Slot range start → the port of its primary, as one running node (`port`, or the
        first that answers) sees it (CLUSTER SLOTS)."""
        ports = [port] if port is not None else [n.port for n in self.running()]
        errors = []
        for asked in ports:
            try:
                reply = self._ask(asked, "CLUSTER", "SLOTS")
            except (redis.RedisError, OSError) as exc:
                errors.append(str(exc))
                continue
            return {int(start): int(primary[1]) for start, _end, primary, *_ in reply}
        raise RuntimeError(f"no node answers CLUSTER SLOTS: {errors}")

    def primary_of(self, key: str, asked: int | None = None) -> int:
        """The port of the primary of `key`'s slot, as a running node sees it."""
        slot = key_slot(key.encode())
        for port in [asked] if asked is not None else [n.port for n in self.running()]:
            try:
                reply = self._ask(port, "CLUSTER", "SLOTS")
            except (redis.RedisError, OSError):
                continue
            for start, end, primary, *_ in reply:
                if int(start) <= slot <= int(end):
                    return int(primary[1])
        raise RuntimeError(f"no running node knows the primary of slot {slot} ({key})")

    def primaries(self) -> list[int]:
        """The ports of the nodes that say they are a primary (running ones only)."""
        return [n.port for n in self.running() if self.role(n.port) == "master"]

    def role(self, port: int) -> str:
        return str(self._info(port, "replication").get("role"))

    def replica_of(self, primary: int) -> int:
        """The port of a running replica of `primary`."""
        for node in self.running():
            if node.port == primary:
                continue
            info = self._info(node.port, "replication")
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary:
                return node.port
        raise RuntimeError(f"127.0.0.1:{primary} has no running replica")

    def read(self, port: int, key: str) -> bytes | None:
        """GET on one node, a primary or a replica of the key's slot (READONLY first: a
        replica otherwise answers MOVED)."""
        client = self._client(port, single_connection_client=True)
        try:
            client.execute_command("READONLY")  # type: ignore[no-untyped-call]
            value: bytes | None = client.execute_command("GET", key)  # type: ignore[no-untyped-call]
        finally:
            client.close()
        return value

    def acl_refusals(self, nodes: Sequence[RedisServer] | None = None) -> list[str]:
        """Commands the ACL refused on `nodes` (by default every running node), not failed
        logins, as `port: user: command or key`. A node's log lives as long as its process:
        read a node before killing it to keep what it holds."""
        return [
            f"{port}: {_text(e['username'])}: {_text(e['object'])}"
            for port, e in self._acl_log(nodes)
            if _text(e["reason"]) != "auth"
        ]

    def failed_logins(self, nodes: Sequence[RedisServer] | None = None) -> list[str]:
        """Logins refused on `nodes` (by default every running node), as `port: user`."""
        return [
            f"{port}: {_text(e['username'])}"
            for port, e in self._acl_log(nodes)
            if _text(e["reason"]) == "auth"
        ]

    def _acl_log(
        self, nodes: Sequence[RedisServer] | None = None
    ) -> list[tuple[int, Mapping[str, Any]]]:
        out: list[tuple[int, Mapping[str, Any]]] = []
        for node in self.running() if nodes is None else nodes:
            client = self._client(node.port)
            try:
                entries: Sequence[Mapping[str, Any]] = client.acl_log()
            finally:
                client.close()
            out += [(node.port, entry) for entry in entries]
        return out

    def open_to_default(self) -> list[int]:
        """The ports of the running nodes that answer a client that never logs in (Redis's
        default user): every one without `auth`, none with it. No AUTH is sent, so the probe
        leaves no failed login in any node's ACL LOG."""
        open_ports = []
        for node in self.running():
            # no retry: redis-py takes a refusal at connect for a connection lost, and retries
            client = redis.Redis(
                port=node.port, socket_timeout=2.0, protocol=2, retry=Retry(NoBackoff(), 0)
            )
            try:
                client.ping()
                open_ports.append(node.port)
            except redis.AuthenticationError:
                pass
            finally:
                client.close()
        return open_ports

    def wait_promoted(self, old: int, key: str, timeout: float = 60.0) -> tuple[int, float]:
        """Wait until a node other than `old` holds `key`'s slot as a primary, by every running
        node's account; (its port, the seconds waited)."""
        started = time.monotonic()
        deadline = started + timeout
        while time.monotonic() < deadline:
            try:
                seen = {self.primary_of(key, node.port) for node in self.running()}
                if len(seen) == 1:
                    (port,) = seen
                    if port != old and self.role(port) == "master":
                        return port, time.monotonic() - started
            except (redis.RedisError, OSError, RuntimeError):
                pass
            time.sleep(POLL_S)
        raise TimeoutError(f"no replica of 127.0.0.1:{old} promoted in {timeout} s")

    def wait_settled(self, timeout: float = 60.0) -> None:
        """Wait until every running node says cluster_state:ok and sees the same slot map, and
        every running replica is in sync with its primary (link up, caught up with the offset
        its primary had just before)."""
        deadline = time.monotonic() + timeout
        problem = "not checked"
        while time.monotonic() < deadline:
            problem = self._unsettled()
            if not problem:
                return
            time.sleep(POLL_S * 4)
        raise TimeoutError(f"cluster not settled in {timeout} s: {problem}")

    def _unsettled(self) -> str:
        try:
            maps = []
            for node in self.running():
                info = self._ask(node.port, "CLUSTER", "INFO").decode()
                if "cluster_state:ok" not in info:
                    return f"127.0.0.1:{node.port}: cluster_state not ok"
                maps.append(self.slot_owners(node.port))
            if any(m != maps[0] for m in maps):
                return "the nodes disagree on the slot map"
            for node in self.running():
                info = self._info(node.port, "replication")
                if info.get("role") != "slave":
                    continue
                if info.get("master_link_status") != "up":
                    return f"127.0.0.1:{node.port}: link to its primary down"
                # the primary's offset first, then the replica's: in sync means it has all the
                # primary held a moment ago (under load the primary is always a little ahead of
                # any reading taken after it, so equal offsets might never be seen)
                primary = self._info(int(info["master_port"]), "replication")
                replica = self._info(node.port, "replication")
                if int(replica["slave_repl_offset"]) < int(primary["master_repl_offset"]):
                    return f"127.0.0.1:{node.port}: behind its primary"
            if len(self.primaries()) * (self.replicas + 1) < len(self.running()):
                return "a node is neither a primary nor a replica yet"
        except (redis.RedisError, OSError, RuntimeError) as exc:
            return str(exc)
        return ""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def process_state(pid: int) -> str:
    """A process's state letter (/proc/<pid>/stat: R, S, D, T for stopped, ...)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until a SIGSTOPped process is stopped: the signal waits out a system call in progress
    (an fsync of the AOF, state D)."""
    deadline = time.monotonic() + timeout
    while process_state(pid) != "T":
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} not stopped in {timeout} s")
        time.sleep(0.005)


def prefixes_on_distinct_primaries(
    cluster: LocalCluster, candidates: list[str], count: int = 2
) -> list[str]:
    """The first `count` of `candidates` (run prefixes) whose hash tags fall on distinct
    primaries of `cluster` (a run's keys are `{prefix}:...`)."""
    chosen: list[str] = []
    taken: set[int] = set()
    for prefix in candidates:
        primary = cluster.primary_of("{" + prefix + "}")
        if primary not in taken:
            taken.add(primary)
            chosen.append(prefix)
        if len(chosen) == count:
            return chosen
    raise ValueError(f"{candidates} fall on fewer than {count} primaries")
