"""The cluster failover audit, short: three kill -9s of a Redis Cluster primary under load.

A LocalCluster (three primaries, a replica each) holds three runs, each on a primary of its
own, each with its aggregator and one worker, and one snapshot service serves them all, in
durable mode (WAIT 1, the cluster's default). The primaries are killed in turn, each once the
cluster is settled and every run has committed since the last kill; the cluster promotes the
replica, the killed node comes back as its replica. `fedasync chaos --profile cluster-failover`
runs the same with two workers per run, durable mode off and on, and prints the table
docs/operations.md describes.

Everything runs under the ACL file for every run on a cluster, as the profile does: each node
loads it with fresh passwords, every process logs in as its role's user (`aggregator`,
`worker`, `snapshot`), the harness as its observer.

What must hold: the ACL was on (no node answered a client that never logged in, before the load
or after the kills and restarts) and refused nothing, on any node, the killed ones read just
before their kill; each kill really killed the primary of a run's slot and a replica took it over;
every run commits after each kill (the victim on the promoted replica, the bystanders on their
untouched primaries); nothing acknowledged is lost and nothing decided twice, in any row; each
run's exactly-once verdict and `ledger verify` pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fedasync.services.commands.chaos.cluster_harness import run_cluster_failover
from fedasync.services.commands.chaos.cluster_report import cluster_failover_table, describe
from fedasync.services.commands.chaos.schedule import PROFILES, FaultKind

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.integration]

SEED = 1
#: one worker per run; the kills as soon as the cluster has settled from the last one
PROFILE = dataclasses.replace(
    PROFILES["cluster-failover"],
    workers=1,
    warmup_s=5.0,  # updates flowing in every run before the first kill
    window_s=8.0,
    min_gap_s=4.0,
    faults=((FaultKind.FAILOVER, 3),),
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("cluster-failover")
    off, on = run_cluster_failover(PROFILE, SEED, out, say=lambda line: None, variants=(0, 1))
    for summary in (off, on):
        print(describe(summary))  # shown by pytest when an assertion fails
    print(cluster_failover_table([off, on]))
    return {"off": off, "on": on}


@pytest.fixture
def summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Durable mode on (WAIT 1, the cluster's default)."""
    return runs["on"]


def rows_of(summary: dict[str, Any], kill: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for row in summary["failovers"] if row["wall"] == kill["wall"]]


@pytest.mark.parametrize("mode", ["off", "on"])
def test_the_acl_was_on_and_refused_nothing_on_any_node(
    runs: dict[str, dict[str, Any]], mode: str
) -> None:
    """The file was loaded: every node turned away a client that did not log in (at the start,
    and at the end, the restarted nodes too); and every process had the rights it used and its
    own password: no command and no login refused, in any node's ACL LOG."""
    summary = runs[mode]
    assert PROFILE.acl
    assert summary["acl"]
    users = summary["users"]
    assert users.pop("snapshot") == "snapshot"
    assert {name: user for name, user in users.items() if name.endswith(".aggregator")} == {
        f"{run['run']}.aggregator": "aggregator" for run in summary["runs"]
    }
    workers = [user for name, user in users.items() if not name.endswith(".aggregator")]
    assert workers == ["worker"] * PROFILE.workers * len(summary["runs"])
    assert summary["open_to_default"] == []
    assert summary["acl_log_unread"] == []
    assert summary["acl_refusals"] == []
    assert summary["failed_logins"] == []
    for check in (
        "every node turns away a client that does not log in",
        "no command refused by Redis's ACL",
        "no login refused by Redis's ACL",
        "every node's ACL LOG read",
    ):
        assert summary["checks"][check], check


@pytest.mark.parametrize("mode", ["off", "on"])
def test_each_kill_was_a_sigkill_of_a_runs_primary_and_a_replica_took_over(
    runs: dict[str, dict[str, Any]], mode: str
) -> None:
    """The fault happened as meant: the slot's primary died of SIGKILL, another node holds the
    victim's slot as primary, the killed node came back; each run was a victim once."""
    summary = runs[mode]
    kills = summary["kills"]
    assert len(kills) == 3, summary["faults_skipped"]
    for kill in kills:
        assert kill["exit_code"] == -9
        assert kill["new_port"] not in (None, kill["old_port"]), kill["problems"]
        assert kill["restarted_s"] is not None, kill["problems"]
        rows = rows_of(summary, kill)
        assert len(rows) == len(summary["runs"])
        [victim] = [row for row in rows if row["role"] == "victim"]
        assert victim["run"] in kill["victims"]
        assert (victim["old_port"], victim["new_port"]) == (kill["old_port"], kill["new_port"])
        for bystander in (row for row in rows if row["role"] == "bystander"):
            # its slot stayed where it was: the kill did not touch its primary
            assert bystander["old_port"] == bystander["new_port"] != kill["old_port"]
    assert sorted(run for kill in kills for run in kill["victims"]) == sorted(
        run["run"] for run in summary["runs"]
    )
    assert summary["checks"]["every kill promoted a replica"]


@pytest.mark.parametrize("mode", ["off", "on"])
def test_every_run_commits_after_every_kill_a_bystander_before_the_promotion(
    runs: dict[str, dict[str, Any]], mode: str
) -> None:
    """The victim on the promoted replica; a bystander without waiting for the promotion of a
    primary it does not use (its client never needs the lost node, not even to place a group
    read: fedasync/client/cluster_link.py, StreamKeysParser)."""
    for row in runs[mode]["failovers"]:
        assert row["first_commit_s"] is not None, row
        assert row["acknowledged"] > 0, row  # updates were flowing under the kill
        if row["role"] == "bystander":
            assert row["first_commit_s"] < row["promoted_s"], row


def test_without_durable_mode_every_other_check_passes(runs: dict[str, dict[str, Any]]) -> None:
    """Off, what is lost is measured, not checked (none is expected with replicas on one
    host); the rest holds as with it on: every decision once, the ledgers verify, the waits
    within the bound (a bystander's decisions never stalled)."""
    off = runs["off"]
    assert off["durable_replicas"] == 0
    assert off["ok"], [name for name, passed in off["checks"].items() if not passed]


def test_durable_mode_loses_nothing_and_decides_nothing_twice_in_any_row(
    summary: dict[str, Any],
) -> None:
    assert summary["durable_replicas"] == 1
    for row in summary["failovers"]:
        assert row["lost"] == 0, row
        assert row["decided_twice"] == 0, row
        assert row["moved_back"] == 0, row
    for run in summary["runs"]:
        assert run["lost"] == 0, run["examples"]["lost"]
        assert run["duplicated"] == 0, run["examples"]["duplicated"]
        assert run["entries_decided_twice"] == 0, run["examples"]["entries_decided_twice"]


def test_each_runs_exactly_once_verdict_and_ledger_verify_pass(summary: dict[str, Any]) -> None:
    for run in summary["runs"]:
        assert run["updates"]["published"] > 0
        assert run["verify"]["ok"], run["verify"]["text"]
        assert run["served"]["version"] == run["served"]["committed_version"]
        assert run["ok"], [name for name, passed in run["checks"].items() if not passed]
    assert summary["unexpected_exits"] == {}
    assert summary["ok"], [name for name, passed in summary["checks"].items() if not passed]
