"""Chaos on the compose stack, as `fedasync chaos --compose` runs it: crashes, nothing lost.

One run for the module, seed 1, on the images the session built: while three workers train,
SIGKILL to the main process of a worker (4 times), of the aggregator (twice) and of Redis
(twice: it comes back from its AOF and ACL file on its volume), and `docker compose restart
snapshot` once; the engine's restart policy must bring each crashed container back, healthy.
Then the workers stop, the stream drains, and the process harness's checks run on what the
workers' journals say was acknowledged (services/stores/exactly_once.py) and on the ledger
(`ledger verify`), read as the admin user from inside the compose network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedasync.services.commands.chaos.compose.run import COMPOSE, Run, describe
from fedasync.services.commands.chaos.schedule import FaultKind
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from tests.compose.helpers import ROOT, Images

pytestmark = [pytest.mark.compose, pytest.mark.timeout(3600)]

SEED = 1


@pytest.fixture(scope="module")
def summary(images: Images, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("compose-chaos")
    result = Run(ROOT, out, SEED, project="fedasync-chaos-test", say=print).execute()
    print(describe(result))  # shown by pytest when an assertion fails
    return result


def test_every_fault_kind_was_injected_as_scheduled(summary: dict[str, Any]) -> None:
    assert summary["faults"] == {kind.value: count for kind, count in COMPOSE.faults}
    assert summary["kills"]["kill_worker"] >= 2  # several worker kills


def test_the_restart_policy_brings_every_crashed_container_back(summary: dict[str, Any]) -> None:
    """A SIGKILL by host pid is a crash: the engine restarts the container by itself."""
    for recovery in summary["recoveries"]:
        assert recovery["seconds"] is not None, recovery
        if recovery["kind"] != FaultKind.RESTART_SNAPSHOT.value:
            before, after = recovery["restarts"]
            assert after > before, recovery
    for service in ("worker", "aggregator", "redis"):
        assert summary["engine_restarts"][service] >= 1


def test_a_redis_kill_and_restart_keeps_every_commit(summary: dict[str, Any]) -> None:
    """Redis replays its AOF under the shipped ACL file: the version and the ledger after the
    restart are never less than before the kill (the hardening issue's defect lost them all)."""
    kills = [r for r in summary["recoveries"] if r["kind"] == FaultKind.KILL_REDIS.value]
    assert len(kills) == 2
    for kill in kills:
        assert kill["before"] is not None, kill
        assert kill["after"] is not None, kill
        (version_before, ledger_before), (version_after, ledger_after) = (
            kill["before"],
            kill["after"],
        )
        assert version_before >= 1
        assert version_after >= version_before, kill
        assert ledger_after >= ledger_before, kill


def test_updates_flowed_and_the_stream_was_drained(summary: dict[str, Any]) -> None:
    assert summary["updates"]["published"] > 0
    assert summary["updates"]["applied"] > 0
    assert summary["checks"]["stream drained"]
    assert summary["entries_undecided"] == 0
    assert summary["dead_letters"] == 0


def test_no_acknowledged_update_is_lost(summary: dict[str, Any]) -> None:
    assert summary["lost"] == 0, summary["examples"]["lost"]


def test_no_update_is_decided_twice(summary: dict[str, Any]) -> None:
    assert summary["duplicated"] == 0, summary["examples"]["duplicated"]
    assert summary["entries_decided_twice"] == 0, summary["examples"]["entries_decided_twice"]


def test_no_decision_for_an_update_never_attempted(summary: dict[str, Any]) -> None:
    assert summary["unexpected"] == 0, summary["examples"]["unexpected"]


def test_versions_are_contiguous(summary: dict[str, Any]) -> None:
    assert summary["version_gaps"] == 0, summary["examples"]["version_gaps"]
    assert summary["versions"]["last"] == summary["updates"]["applied"]


def test_ledger_verify_passes(summary: dict[str, Any]) -> None:
    assert summary["verify"]["ok"], summary["verify"]["text"]
    assert summary["verify"]["version"] == summary["versions"]["last"]


def test_the_served_model_is_the_committed_one(summary: dict[str, Any]) -> None:
    served = summary["served"]
    assert served["version"] == served["committed_version"] == summary["versions"]["last"]
    assert served["sha256"] == served["committed_sha256"] != ""


def test_every_service_is_healthy_again_and_nothing_alarmed(summary: dict[str, Any]) -> None:
    """No false alarm of a move back in time: restarts of Redis, the aggregator and the
    snapshot service are normal; and no service lacked a right under the ACL."""
    assert summary["unhealthy_at_end"] == []
    assert STATE_MISMATCH not in summary["alerts"]
    assert VERSION_REGRESSED not in summary["alerts"]
    assert summary["acl_refusals"] == []


def test_summary_and_logs_are_written(summary: dict[str, Any]) -> None:
    out = Path(summary["out"])
    assert (out / "summary.json").is_file()
    assert (out / "logs" / "compose.log").stat().st_size > 0
    assert len(list((out / "journal").glob("*.journal"))) == COMPOSE.workers
    assert summary["ok"], [name for name, ok in summary["checks"].items() if not ok]
