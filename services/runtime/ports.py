"""Free ports on this machine, for processes that start others (`fedasync up`, the supervisor,
the tests' redis-servers)."""

from __future__ import annotations

import socket

#: every port `free_port` handed out in this process
_handed_out: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now and that this process was not given before.

    Callers pick several ports before any of them is bound (`fedasync up` picks five, then starts
    the services), and the kernel may offer a port again as soon as the probe that found it is
    closed: without the memory, two services of one run would now and then get the same port
    and the second to bind would fail.
    """
    for _ in range(1000):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free port that was not handed out already")
