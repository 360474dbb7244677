"""Slow and hostile HTTP clients against the snapshot service, while the fleet trains.

A burst of connections each sends the start of a request and then one header byte a second,
never finishing it (what a slowloris client does), for the fault's length. The service must close
them on its own (its header timeout, docs/security.md) and keep answering the workers meanwhile;
the run's checks (every update decided, the decision bound) show the second. The burst runs in a
thread of its own so the injector's schedule goes on.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field

#: the start of a request that never ends
PARTIAL_REQUEST = b"GET /v1/models/latest HTTP/1.1\r\nHost: chaos\r\n"


@dataclass(slots=True)
class SlowClients:
    """One burst: `count` connections to host:port, trickling for `seconds`."""

    host: str
    port: int
    count: int
    seconds: float
    opened: int = 0
    #: connections the server closed before the burst ended (its header timeout at work)
    closed_by_server: int = 0
    _thread: threading.Thread | None = field(default=None, repr=False)

    def start(self) -> SlowClients:
        self._thread = threading.Thread(target=self._run, name="chaos-slow-clients", daemon=True)
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        sockets: list[socket.socket] = []
        try:
            for _ in range(self.count):
                try:
                    sock = socket.create_connection((self.host, self.port), timeout=2.0)
                    sock.sendall(PARTIAL_REQUEST)
                    sock.setblocking(False)
                except OSError:
                    continue  # refused or reset at once: the connection bound at work
                sockets.append(sock)
                self.opened += 1
            end = time.monotonic() + self.seconds
            alive = list(sockets)
            while alive and time.monotonic() < end:
                for sock in list(alive):
                    if _closed(sock):
                        self.closed_by_server += 1
                        alive.remove(sock)
                        continue
                    try:
                        sock.send(b"X")  # one more byte of a header that never ends
                    except OSError:
                        self.closed_by_server += 1
                        alive.remove(sock)
                time.sleep(1.0)  # the client's own pace: one byte a second
        finally:
            for sock in sockets:
                sock.close()


def _closed(sock: socket.socket) -> bool:
    """The server closed it (EOF) or answered and closed (e.g. 408): either ends the attack."""
    try:
        data = sock.recv(4096)
    except BlockingIOError:
        return False
    except OSError:
        return True
    return data == b"" or data.startswith(b"HTTP/1.1 4") or data.startswith(b"HTTP/1.1 5")
