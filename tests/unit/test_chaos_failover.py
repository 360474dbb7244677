"""The failover profile's parts that need no Redis: the replica links, the figures, the table.

The runs themselves (real servers, Sentinels, services) are tests/chaos/test_failover.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from fedasync.services.commands.chaos.faults import Failover
from fedasync.services.commands.chaos.links import Link, _names_replication
from fedasync.services.commands.chaos.report import attribute_lost, failover_table, first_commits
from fedasync.services.commands.chaos.schedule import PROFILES, durable_label
from fedasync.services.commands.chaos.waits import FAILOVER_S, RECOVERY_S, Interruption, measure


def resp(*args: str) -> bytes:
    return f"*{len(args)}\r\n".encode() + b"".join(f"${len(a)}\r\n{a}\r\n".encode() for a in args)


def test_a_replica_is_told_by_its_handshake() -> None:
    handshake = resp("AUTH", "replica", "pw") + resp("PING") + resp("REPLCONF", "capa", "psync2")
    assert _names_replication(bytearray(handshake))
    assert _names_replication(bytearray(resp("PSYNC", "?", "-1")))
    client = resp("AUTH", "worker", "pw") + resp("XADD", "{p}:updates", "*", "m", "x")
    assert not _names_replication(bytearray(client))
    assert not _names_replication(bytearray(resp("REPL")[:-3]))  # incomplete: not yet


@pytest.mark.asyncio
async def test_a_link_delays_replication_and_drops_it_when_the_server_dies() -> None:
    """What the primary sent a replica within the lag before it died never arrives."""
    got_psync = asyncio.Event()

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"psync2\r\n")
        writer.write(b"+FULLRESYNC\r\n")  # in flight on the link for its lag
        await writer.drain()
        got_psync.set()
        writer.transport.abort()  # kill -9

    upstream = await asyncio.start_server(server, "127.0.0.1", 0)
    link = Link(upstream.sockets[0].getsockname()[1], lag_s=5.0)
    await link.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(resp("REPLCONF", "capa", "psync2"))
        await writer.drain()
        await asyncio.wait_for(got_psync.wait(), 30)
        # the server is gone: the link cuts the replica off at once, the reply undelivered
        try:
            received = await asyncio.wait_for(reader.read(), 30)
        except ConnectionResetError:  # the cut is a reset, not a close
            received = b""
        assert received == b""
        assert link.replication_links == 1
        writer.close()
    finally:
        await link.aclose()
        upstream.close()
        await upstream.wait_closed()


def test_versions_moved_back_are_announced_ones_the_new_primary_lacks() -> None:
    assert Failover(0.0, 1, version_before=10, version_after=8).moved_back == 2
    # durable mode: the new primary may hold more than was announced, never less
    assert Failover(0.0, 1, version_before=10, version_after=11).moved_back == 0
    assert Failover(0.0, 1).moved_back == 0  # no reading: nothing claimed


def test_the_first_commit_after_a_kill_is_the_first_ledger_entry_after_it() -> None:
    failovers = [{"wall": 100.0}, {"wall": 200.0}, {"wall": 300.0}]
    ledger = [{"ledger_id": f"{ms}-0"} for ms in (99_000, 103_500, 104_000, 201_250)]
    first_commits(failovers, ledger)
    assert [f["first_commit_s"] for f in failovers] == [3.5, 1.25, None]


def summary(
    durable: int | None, lost: list[int], moved: list[int], promoted: list[float]
) -> dict[str, object]:
    """A run whose losses of the primary are kills and pauses, alternately."""
    hows = (["kill", "pause"] * len(promoted))[: len(promoted)]
    return {
        "durable_replicas": durable,
        "durable_label": durable_label(
            dataclasses.replace(PROFILES["failover"], durable_replicas=durable)
        ),
        "failovers": [
            {"how": how, "promoted_s": p, "first_commit_s": p + 1.0, "moved_back": m, "lost": n}
            for how, p, m, n in zip(hows, promoted, moved, lost, strict=True)
        ],
        "updates": {"published": 500},
        "lost": sum(lost),
        "duplicated": 0,
        "entries_decided_twice": 0,
        "versions_moved_back": sum(moved),
        "aggregator_refusals": 2 if any(moved) else 0,
        "snapshot_unfrozen": 1 if any(moved) else 0,
        "ok": True,
    }


def test_the_failover_table_has_a_row_per_durable_mode_and_loss_of_the_primary() -> None:
    table = failover_table(
        [
            summary(0, [3, 200, 1, 100], [2, 300, 0, 100], [6.0, 6.5, 7.0, 6.6]),
            summary(None, [0, 0], [0, 0], [6.1, 6.2]),
        ]
    )
    lines = table.splitlines()
    assert lines[0].startswith("| durable mode | fault | faults | acknowledged (run) | lost |")
    assert lines[2:] == [
        "| durable off | kill -9 of the primary | 2 | 500 | 4 | 0 | 2 | 7.00 / 7.00 | 8.00 / 8.00 "
        "| pass |",
        "| durable off | pause, then resume | 2 | 500 | 300 | 0 | 400 | 6.60 / 6.60 "
        "| 7.60 / 7.60 | pass |",
        "| shipped default (durable on, WAIT 1, min-replicas 1) | kill -9 of the primary | 1 | 500 "
        "| 0 | 0 | 0 | 6.10 / 6.10 | 7.10 / 7.10 | pass |",
        "| shipped default (durable on, WAIT 1, min-replicas 1) | pause, then resume | 1 | 500 "
        "| 0 | 0 | 0 | 6.20 / 6.20 | 7.20 / 7.20 | pass |",
    ]


def test_a_lost_update_belongs_to_the_last_loss_of_the_primary_that_began_just_after_it() -> None:
    """A kill takes what was acknowledged just before it; a resumed primary what it took after
    its resume; an update lost long before any fault is counted apart."""
    failovers: list[dict[str, Any]] = [{"wall": 100.0}, {"wall": 200.0}]
    unexplained = attribute_lost(failovers, [99.5, 101.0, 150.0, 199.0, 205.0, 50.0])
    assert [f["lost"] for f in failovers] == [3, 2]
    assert unexplained == 1


def test_a_resumed_primary_moves_back_what_it_announced_after_its_resume() -> None:
    paused = Failover(0.0, 1, how="pause", version_before=10, version_after=10, version_resumed=25)
    assert paused.moved_back == 15


def test_a_failover_excuses_waits_for_its_promotion_and_the_recovery_after() -> None:
    assert Interruption.of("failover", 100.0, 2.5) is None  # its outage is the killed server's
    failover = Interruption.failover(100.0, promoted_s=6.0)
    assert failover.at == 100.0
    assert failover.seconds == 6.0 + FAILOVER_S + RECOVERY_S
    waits = measure([{"stream_id": "99900-0", "at": 100.0 + failover.seconds - 1}], 3.0, [failover])
    assert waits.ok
