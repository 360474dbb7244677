"""The fast chaos profile, as CI runs it: real processes, real faults, nothing lost or doubled.

`pytest -m chaos` selects it (and `-m "not chaos"` leaves it out). One run of about 40 s per
mode (FedAsync, and the memory mode whose per-client memory is part of the committed state), with
Redis under the generated ACL file and each service logged in as its own user: the aggregator
killed 3 times, workers 5 times, Redis killed twice and paused once, the snapshot service
restarted once, two of the aggregator's commands stalled at its Redis proxy and a second
aggregator started while the first ran; then the total-queue check on what the workers' journals
say was acknowledged, after each Redis restart the check that state, model, ledger and group came
back whole, and the longest wait from XADD to decision against the bound.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedasync.services.commands.chaos.harness import run
from fedasync.services.commands.chaos.report import describe
from fedasync.services.commands.chaos.schedule import PROFILES, REPLICATED_ONLY, FaultKind
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from fedasync.shared.policy import MODE_PRESETS, Mode

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

SEED = 1


@pytest.fixture(scope="module", params=["fedasync", "memory"])
def summary(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """One run per mode: FedAsync, and the memory mode, whose per-client memory lives in Redis
    beside the state and must come back whole after every kill of the aggregator and of Redis."""
    out = tmp_path_factory.mktemp(f"chaos-{request.param}")
    result = run(PROFILES["fast"], SEED, out, say=lambda line: None, policy={"mode": request.param})
    print(describe(result))  # shown by pytest when an assertion fails
    return result


def test_every_fault_kind_was_injected(summary: dict[str, Any]) -> None:
    # but a loss of the primary: one server has no replica to promote (test_failover.py)
    for kind in set(FaultKind) - REPLICATED_ONLY:
        assert summary["faults"].get(kind.value, 0) >= 1, kind


def test_updates_flowed_and_the_stream_was_drained(summary: dict[str, Any]) -> None:
    assert summary["updates"]["published"] > 0
    assert summary["updates"]["applied"] > 0
    assert summary["checks"]["stream drained"]
    assert summary["entries_undecided"] == 0


def test_no_acknowledged_update_is_lost(summary: dict[str, Any]) -> None:
    assert summary["lost"] == 0, summary["examples"]["lost"]


def test_no_update_is_decided_twice(summary: dict[str, Any]) -> None:
    assert summary["duplicated"] == 0, summary["examples"]["duplicated"]
    assert summary["entries_decided_twice"] == 0, summary["examples"]["entries_decided_twice"]


def test_no_decision_for_an_update_never_attempted(summary: dict[str, Any]) -> None:
    assert summary["unexpected"] == 0, summary["examples"]["unexpected"]


def test_versions_are_contiguous(summary: dict[str, Any]) -> None:
    assert summary["version_gaps"] == 0, summary["examples"]["version_gaps"]
    assert summary["versions"]["last"] == summary["updates"]["server_steps"]
    if summary["policy"]["mode"] == "fedasync":  # every applied update is a server step
        assert summary["versions"]["last"] == summary["updates"]["applied"]
    else:  # one step per K applied updates (the memory preset's K)
        k = MODE_PRESETS[Mode.MEMORY]["buffer_size"]
        assert summary["updates"]["server_steps"] == summary["updates"]["applied"] // k


def test_ledger_verify_passes(summary: dict[str, Any]) -> None:
    assert summary["verify"]["ok"], summary["verify"]["text"]


def test_the_served_model_is_the_committed_one(summary: dict[str, Any]) -> None:
    served = summary["served"]
    assert served["version"] == served["committed_version"] == summary["versions"]["last"]
    assert served["sha256"] == served["committed_sha256"] != ""


def test_every_service_ran_as_its_own_redis_user_and_nothing_was_refused(
    summary: dict[str, Any],
) -> None:
    assert summary["acl"] is True
    assert summary["acl_refusals"] == []
    assert summary["checks"]["no command refused by Redis's ACL"]


def test_state_model_and_ledger_are_intact_after_every_redis_restart(
    summary: dict[str, Any],
) -> None:
    restarts = summary["redis_restarts"]
    assert len(restarts) == summary["faults"]["kill_redis"] >= 1
    for restart in restarts:
        assert restart["intact"], restart["problems"]
        before, after = restart["commit_seq"]
        assert after >= before >= 1
    assert summary["checks"]["state, model and ledger intact after every Redis restart"]


def test_no_move_back_in_time_was_alarmed(summary: dict[str, Any]) -> None:
    """No false alarm: restarts of Redis, the aggregator and the snapshot service are normal."""
    assert STATE_MISMATCH not in summary["alerts"]
    assert VERSION_REGRESSED not in summary["alerts"]


def test_summary_and_logs_are_written(summary: dict[str, Any]) -> None:
    out = Path(summary["out"])
    assert (out / "summary.json").is_file()
    logs = {p.name for p in (out / "logs").iterdir()}
    assert {"aggregator.log", "snapshot.log", "worker-0.log"} <= logs
    assert summary["ok"]


def test_no_update_waited_longer_than_the_bound(summary: dict[str, Any]) -> None:
    """From XADD to decision, within the decision bound plus the faults overlapping the wait;
    a second aggregator excuses only its start (chaos/waits.py)."""
    assert summary["faults"].get(FaultKind.SECOND_AGGREGATOR.value, 0) >= 1
    assert summary["waits"]["longest_s"] > 0
    assert summary["waits"]["over_bound"] == 0, summary["examples"]["waits_over_bound"]


def test_a_superseded_aggregator_stops_by_itself_fenced_off(summary: dict[str, Any]) -> None:
    assert not [name for name in summary["unexpected_exits"] if "superseded" in name]


def test_the_lag_at_rest_is_0_after_the_kills_of_redis_and_the_aggregator(
    summary: dict[str, Any],
) -> None:
    """Issue 25: Redis 7.0's own lag can drift across restarts (it reported 71 at rest after a
    compose chaos run; tests/integration/test_lag_at_rest.py makes it drift on purpose);
    fedasync's figure, which the rules and the control status read, is 0 once drained."""
    assert summary["faults"][FaultKind.KILL_REDIS.value] >= 1  # restarts, each AOF rewritten
    assert summary["lag_at_rest"]["aggregator"] == 0, summary["lag_at_rest"]
    assert summary["checks"]["lag at rest == 0"]
