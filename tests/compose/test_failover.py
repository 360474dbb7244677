"""Two losses of the primary on the compose stack's `ha` profile, as shipped: nothing lost.

The stack as docs/operations.md ("Redis under Sentinel") runs it: `--profile ha` (two replicas
and three Sentinels beside `redis`), every service following the primary through the Sentinels,
durable mode left to its default (on with the Sentinels; the servers' min-replicas-to-write 1),
three workers journalling their publishes. At version 20 the primary's host is lost (its
container frozen, so it answers nothing while its name still resolves; once the Sentinels
promoted a replica, its main process gets SIGKILL by host pid and the engine restarts it, and
the Sentinels make it a replica). Training must commit past the version before the loss on the
new primary, ten commits more, and every service must pass its healthcheck again. Then the new
primary is paused past down-after and thawed once the Sentinels promoted another: it comes back
a primary in its own eyes, the services' connections to it still open; training must go on on
the next primary. Then the compose chaos run's accounting (services/commands/chaos/compose/
failover.py): every acknowledged update decided once, none lost, versions contiguous, nothing
moved back, `ledger verify` OK.
"""

from __future__ import annotations

from typing import Any

import pytest

from fedasync.services.commands.chaos.compose.failover import (
    REPLICAS,
    Failover,
    describe_failover,
)
from fedasync.services.commands.chaos.compose.run import describe
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from tests.compose.helpers import ROOT, Images

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def summary(images: Images, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("compose-failover")
    run = Failover(ROOT, out, project="fedasync-failover-test", say=print)
    result = run.execute()
    print(describe(result))  # shown by pytest when an assertion fails
    print(describe_failover(result))
    print(f"restarts by the engine: {result['engine_restarts']}")
    return result


def test_the_ha_profile_and_the_services_run_under_sentinel(summary: dict[str, Any]) -> None:
    assert {*REPLICAS, "sentinel-1", "sentinel-2", "sentinel-3"} <= set(summary["services"])
    assert summary["failover"]["durable_replicas"] is None  # nothing set: the shipped default


def test_the_sentinels_promote_the_replica(summary: dict[str, Any]) -> None:
    failover = summary["failover"]
    assert failover["primary_before"] == "redis"
    assert failover["promotion_s"] is not None, failover
    assert failover["primary_after"] in REPLICAS
    assert failover["restarted_by_engine"], "a crash: the restart policy brings the process back"


def test_a_paused_primary_is_replaced_and_training_goes_on_past_it(
    summary: dict[str, Any],
) -> None:
    """The pause happened as meant (frozen past the Sentinels' down-after, 5 s, and another
    server promoted meanwhile), and the next primary takes the training on."""
    pause = summary["pause"]
    assert pause["primary_before"] == summary["failover"]["primary_after"]
    assert pause["promotion_s"] is not None, pause
    assert pause["frozen_s"] > max(5.0, pause["promotion_s"])
    assert pause["primary_after"] not in (None, pause["primary_before"])
    assert pause["first_version_after"] > pause["version_before"]
    assert pause["version_later"] >= pause["first_version_after"] + 10
    assert pause["unhealthy"] == []


def test_training_commits_past_the_failover_on_the_new_primary(summary: dict[str, Any]) -> None:
    failover = summary["failover"]
    assert failover["first_commit_s"] is not None, failover
    assert failover["first_version_after"] > failover["version_before"] >= 1
    assert failover["version_later"] >= failover["first_version_after"] + 10
    assert summary["versions"]["last"] >= failover["version_later"]


def test_every_service_is_healthy_again(summary: dict[str, Any]) -> None:
    assert summary["failover"]["unhealthy"] == []
    assert summary["unhealthy_at_end"] == []


def test_every_acknowledged_update_is_decided_once_and_none_is_lost(
    summary: dict[str, Any],
) -> None:
    """Durable mode (the default): an update counts as published only once a replica has it,
    so the promoted replica holds every one, after a kill or a pause alike."""
    assert summary["updates"]["published"] > 0
    assert summary["checks"]["stream drained"]
    assert summary["lost"] == 0, summary["examples"]["lost"]
    assert summary["duplicated"] == 0, summary["examples"]["duplicated"]
    assert summary["unexpected"] == 0, summary["examples"]["unexpected"]
    assert summary["entries_decided_twice"] == 0, summary["examples"]["entries_decided_twice"]
    assert summary["entries_undecided"] == 0, summary["examples"]["entries_undecided"]
    assert summary["dead_letters"] == 0


def test_versions_are_contiguous_and_nothing_moved_back(summary: dict[str, Any]) -> None:
    assert summary["version_gaps"] == 0, summary["examples"]["version_gaps"]
    assert summary["versions"]["last"] == summary["updates"]["applied"]
    assert STATE_MISMATCH not in summary["alerts"]
    assert VERSION_REGRESSED not in summary["alerts"]


def test_ledger_verify_passes_and_the_served_model_is_the_committed_one(
    summary: dict[str, Any],
) -> None:
    assert summary["verify"]["ok"], summary["verify"]["text"]
    assert summary["verify"]["version"] == summary["versions"]["last"]
    served = summary["served"]
    assert served["version"] == served["committed_version"] == summary["versions"]["last"]
    assert served["sha256"] == served["committed_sha256"] != ""


def test_every_check_of_the_run_passes(summary: dict[str, Any]) -> None:
    assert summary["ok"], [name for name, ok in summary["checks"].items() if not ok]
