"""`free_port` never hands one process the same port twice.

`fedasync up`, the chaos harness and the benches pick several ports before any is bound; the
kernel may offer a closed probe's port again, and the second service to bind it would fail. Of
2,000 bare `bind(0)` probes on Linux's ~14,000 ephemeral ports, about 140 pairs would coincide.
"""

from __future__ import annotations

import socket

from fedasync.services.commands.redis_launch.server import free_port


def test_ports_picked_before_any_is_bound_are_all_different() -> None:
    ports = [free_port() for _ in range(2000)]
    assert len(set(ports)) == len(ports)


def test_a_picked_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        assert sock.getsockname()[1] == port
