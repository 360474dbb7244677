"""A Sentinel failover under load, with real processes: durable mode off, then as shipped.

A primary, two replicas 100 ms behind it (chaos/links.py: on other hosts) and three Sentinels;
the aggregator, the snapshot service and four workers following the primary through the
Sentinels, each as its own Redis user, with the default socket timeout (10 s) as deployed. Two
losses of the primary per run: a kill -9, and a pause (SIGSTOP past the Sentinels' down-after,
held until they promote a replica and a moment longer, then SIGCONT: the old primary comes back
a primary in its own eyes, with the services' connections still open to it). A Sentinel
promotes a replica each time, the services carry on against it without a restart, and the
chaos checker counts. One of each per mode keeps this near three minutes; `fedasync chaos
--profile failover` makes four of each with durable mode off, on and as shipped, and prints the
table docs/operations.md quotes.

What must hold either way: a replica promoted, every update decided once and applied at most
once, versions contiguous, the ledger replaying to the model served. As shipped (no durable
setting: on with Sentinels, the servers' `min-replicas-*` as docker/redis/entrypoint.sh sets
them), nothing acknowledged is lost and no version a device was offered moves back, the pause
included. Off, an update acknowledged in the last moments before the primary was lost (killed or
frozen) may be lost, and only there: nothing the old primary takes after its resume, since the
services dropped it when the Sentinels announced the switch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from fedasync.services.commands.chaos.harness import run_failover
from fedasync.services.commands.chaos.report import describe, failover_table
from fedasync.services.commands.chaos.schedule import PROFILES, FaultKind
from fedasync.services.commands.chaos.waits import xadd_time
from fedasync.services.commands.redis_launch.sentinel import Topology
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from fedasync.services.worker.journal import read_journals

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

SEED = 2
#: one kill and one pause of the primary per mode, soon after the warm-up
PROFILE = dataclasses.replace(
    PROFILES["failover"],
    window_s=20.0,
    faults=((FaultKind.FAILOVER, 1), (FaultKind.PAUSE_PRIMARY, 1)),
)
#: an update lost with the primary was acknowledged this close before its kill or freeze, at
#: most: the replicas' lag (100 ms) and the time the fault takes, with room for a loaded machine
LOSS_WINDOW_S = 2.0
#: the Sentinels' down-after in the harness's group, seconds
DOWN_AFTER_S = Topology().down_after_ms / 1000


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("failover")
    off, shipped = run_failover(PROFILE, SEED, out, say=lambda line: None, variants=(0, None))
    for summary in (off, shipped):
        print(describe(summary))  # shown by pytest when an assertion fails
    print(failover_table([off, shipped]))
    return {"off": off, "shipped": shipped}


def test_each_pause_outlasted_down_after_and_the_services_heard_the_switch(
    runs: dict[str, dict[str, Any]],
) -> None:
    """The fault happened as meant: frozen longer than the Sentinels' down-after, a replica
    promoted meanwhile, and the services told by the Sentinels (they log it)."""
    for summary in runs.values():
        [pause] = [f for f in summary["failovers"] if f["how"] == "pause"]
        assert pause["frozen_s"] > DOWN_AFTER_S
        assert pause["new_port"] not in (None, pause["old_port"]), pause["problems"]
        assert pause["frozen_s"] > pause["promoted_s"]  # resumed only after the promotion
        assert summary["switches_heard"] > 0


@pytest.mark.parametrize("mode", ["off", "shipped"])
def test_a_replica_is_promoted_and_the_services_carry_on_against_it(
    runs: dict[str, dict[str, Any]], mode: str
) -> None:
    summary = runs[mode]
    assert [f["how"] for f in summary["failovers"]] in (["kill", "pause"], ["pause", "kill"])
    for failover in summary["failovers"]:
        assert failover["new_port"] not in (None, failover["old_port"]), failover["problems"]
        assert failover["first_commit_s"] is not None  # decisions resumed on the new primary
    assert summary["checks"]["every failover promoted a replica"]
    assert summary["updates"]["published"] > 0
    assert summary["checks"]["stream drained"]
    assert summary["unexpected_exits"] == {}  # nothing crashed; a refusal is no crash


@pytest.mark.parametrize("mode", ["off", "shipped"])
def test_no_update_is_decided_twice_and_versions_stay_contiguous(
    runs: dict[str, dict[str, Any]], mode: str
) -> None:
    summary = runs[mode]
    assert summary["duplicated"] == 0, summary["examples"]["duplicated"]
    assert summary["entries_decided_twice"] == 0, summary["examples"]["entries_decided_twice"]
    assert summary["unexpected"] == 0
    assert summary["entries_undecided"] == 0
    assert summary["version_gaps"] == 0, summary["examples"]["version_gaps"]
    assert summary["verify"]["ok"], summary["verify"]["text"]
    served = summary["served"]
    assert served["version"] == served["committed_version"] == summary["versions"]["last"]
    assert summary["checks"]["XADD→decision waits within the bound"]


@pytest.mark.parametrize("mode", ["off", "shipped"])
def test_every_process_ran_as_its_own_user_and_the_acl_refused_nothing(
    runs: dict[str, dict[str, Any]], mode: str
) -> None:
    """Services, replicas (`replica`) and Sentinels (`sentinel`, `discovery`) alike, on every
    server and Sentinel."""
    assert runs[mode]["acl"] is True
    assert runs[mode]["acl_refusals"] == []


def test_as_shipped_nothing_acknowledged_is_lost_and_no_version_moves_back_kill_or_pause(
    runs: dict[str, dict[str, Any]],
) -> None:
    shipped = runs["shipped"]
    assert shipped["durable_replicas"] is None  # nothing set: the default
    assert shipped["lost"] == 0, shipped["examples"]["lost"]
    assert shipped["versions_moved_back"] == 0, shipped["failovers"]
    assert shipped["aggregator_refusals"] == 0  # it carried on, no exit 4
    assert STATE_MISMATCH not in shipped["alerts"]
    assert VERSION_REGRESSED not in shipped["alerts"]
    assert shipped["ok"]


def test_without_durable_mode_only_updates_acknowledged_just_before_the_fault_can_be_lost(
    runs: dict[str, dict[str, Any]],
) -> None:
    """The doc's window, and nothing outside it: each lost update was added to the old primary
    moments before its kill or freeze (its entry id is Redis's clock), by none of its replicas;
    none after the frozen primary's resume."""
    off = runs["off"]
    assert off["durable_replicas"] == 0
    journals = read_journals(sorted((Path(off["out"]) / "journal").glob("*.journal")))
    walls = [f["wall"] for f in off["failovers"]]
    for update_id in off["examples"]["lost"]:
        added = xadd_time(journals.acknowledged[update_id])
        assert any(wall - LOSS_WINDOW_S <= added <= wall for wall in walls), update_id
    assert off["lost_outside_failovers"] == 0
    assert off["checks"]["every failover promoted a replica"]
    # what the run found is printed with the table; the checks that hold off all passed
    assert off["ok"], [name for name, passed in off["checks"].items() if not passed]
