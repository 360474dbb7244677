"""The cluster failover audit's parts that need no Redis: the profile, a row's figures, the
table, and the cluster client's own reading of a stream read's keys.

The audit itself (a real cluster, services and kills) is tests/chaos/test_cluster_failover.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from fedasync.client.cluster_link import StreamKeysParser, stream_read_keys
from fedasync.services.commands.chaos.cluster_report import cluster_failover_table, row_figures
from fedasync.services.commands.chaos.faults import Failover
from fedasync.services.commands.chaos.schedule import PROFILES, FaultKind, build_schedule
from fedasync.services.stores.exactly_once import Verdict


def test_the_cluster_profile_kills_a_primary_at_least_three_times_durable_on() -> None:
    profile = PROFILES["cluster-failover"]
    kills = [f for f in build_schedule(profile, 1) if f.kind is FaultKind.FAILOVER]
    assert len(kills) >= 3
    assert profile.cluster_runs == 3
    assert profile.durable_replicas == 1
    assert profile.acl  # as the Sentinel profile: every process as its own user
    assert "3 runs on 3 primaries, durable on (WAIT 1)" in profile.label


def test_a_cluster_row_names_its_run_and_role_and_a_sentinel_row_stays_as_it_was() -> None:
    row = Failover(1.0, 7001, run="chaos-1", role="victim").to_dict()
    assert (row["run"], row["role"]) == ("chaos-1", "victim")
    assert "run" not in Failover(1.0, 7001).to_dict()


def entry(seconds: float) -> str:
    return f"{int(seconds * 1000)}-0"


def test_each_update_counts_in_the_row_of_the_last_kill_before_it() -> None:
    """Acknowledged, lost and decided twice by one rule (XADD time, the last kill that began no
    later than 2 s after it), so a row's lost updates are among its acknowledged ones; the
    next commit is the first ledger entry after the kill."""
    rows: list[dict[str, Any]] = [{"wall": 100.0}, {"wall": 200.0}]
    acknowledged = {
        "early": entry(50.0),  # before any kill (and its lead): in no row
        "a": entry(99.0),  # just before the first kill: what a kill may take
        "b": entry(150.0),
        "c": entry(199.5),
        "d": entry(260.0),
    }
    verdict = Verdict(lost=["a", "c"], duplicated=["b"], redecided=[entry(201.0)])
    ledger = [{"ledger_id": entry(s)} for s in (99.0, 104.5, 200.25)]
    lost_outside = row_figures(rows, ledger, acknowledged, verdict)
    assert [r["acknowledged"] for r in rows] == [2, 2]
    assert [r["lost"] for r in rows] == [1, 1]
    assert [r["decided_twice"] for r in rows] == [1, 1]
    assert [r["first_commit_s"] for r in rows] == [4.5, 0.25]
    assert lost_outside == 0


def test_the_cluster_table_has_a_row_per_kill_and_run() -> None:
    def row(run: str, role: str, wall: float, first: float | None) -> dict[str, Any]:
        return {
            "run": run,
            "role": role,
            "wall": wall,
            "promoted_s": 3.0,
            "first_commit_s": first,
            "moved_back": 0,
            "acknowledged": 10,
            "lost": 0,
            "decided_twice": 0,
        }

    summary = {
        "durable_replicas": 1,
        "durable_label": "durable on (WAIT 1)",
        "kills": [{"wall": 100.0, "old_port": 7001, "new_port": 7004}],
        "failovers": [row("a", "victim", 100.0, 5.5), row("b", "bystander", 100.0, None)],
    }
    lines = cluster_failover_table([summary]).splitlines()
    assert lines[0].startswith("| durable mode | kill | primary killed → promoted | run | role |")
    assert lines[2:] == [
        "| durable on (WAIT 1) | 1 | 7001 → 7004 | a | victim | 10 | 0 | 0 | 0 | 3.00 | 5.50 |",
        "| durable on (WAIT 1) | 1 | 7001 → 7004 | b | bystander | 10 | 0 | 0 | 0 | 3.00 | ? |",
    ]


def test_a_stream_reads_keys_are_read_from_its_arguments() -> None:
    group = ("XREADGROUP", "GROUP", "streams", "c", "COUNT", "10", "BLOCK", "100", "STREAMS")
    assert stream_read_keys(*group, "{a}:updates", ">") == ("{a}:updates",)
    assert stream_read_keys(b"XREAD", b"COUNT", b"5", b"STREAMS", b"k1", b"k2", b"0", b"0") == (
        b"k1",
        b"k2",
    )
    assert stream_read_keys("XADD", "{a}:updates", "*", "f", "v") is None


@pytest.mark.asyncio
async def test_the_cluster_client_places_a_group_read_without_asking_a_node() -> None:
    """redis-py would send COMMAND GETKEYS to one node (its parser's) before every group read,
    so that node's loss stopped every run's reads; this parser has no node at all."""
    parser = StreamKeysParser()
    args = ("XREADGROUP", "GROUP", "g", "c", "BLOCK", "100", "STREAMS", "{b}:updates", ">")
    assert await parser.get_keys(*args) == ("{b}:updates",)
