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

The methods mirror redis_launch/sentinel.ReplicatedRedis, which services/commands/chaos/faults.py
drives (kill, pause, resume, restart, read, wait_promoted, wait_settled), with `primary_of(key)`
in place of `primary_port()`: a cluster has a primary per slot.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from fedasync.services.commands.redis_launch.server import RedisServer, find_redis_server, free_port

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
    ) -> None:
        self.directory = directory
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
        return (
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
        made = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
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
    def _client(self, port: int, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=timeout, protocol=2)

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
        client = redis.Redis(
            port=port, socket_timeout=2.0, protocol=2, single_connection_client=True
        )
        try:
            client.execute_command("READONLY")  # type: ignore[no-untyped-call]
            value: bytes | None = client.execute_command("GET", key)  # type: ignore[no-untyped-call]
        finally:
            client.close()
        return value

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
        every running replica is in sync with its primary (link up, offset equal)."""
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
                primary = self._info(int(info["master_port"]), "replication")
                if int(primary["master_repl_offset"]) != int(info["slave_repl_offset"]):
                    return f"127.0.0.1:{node.port}: behind its primary"
            if len(self.primaries()) * (self.replicas + 1) < len(self.running()):
                return "a node is neither a primary nor a replica yet"
        except (redis.RedisError, OSError, RuntimeError) as exc:
            return str(exc)
        return ""


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
