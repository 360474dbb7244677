"""The chaos harness's wait figure, and its new faults in the schedule, on hand-made inputs."""

from __future__ import annotations

from fedasync.services.commands.chaos.proxy import StallMode
from fedasync.services.commands.chaos.schedule import (
    PROFILES,
    STALLED_COMMANDS,
    FaultKind,
    build_schedule,
)
from fedasync.services.commands.chaos.waits import RECOVERY_S, Interruption, measure
from fedasync.services.runtime.settings import AggregatorSettings


def decided(added_s: float, after_s: float) -> dict[str, object]:
    """A ledger record for an entry XADDed at `added_s` and decided `after_s` later."""
    return {"stream_id": f"{round(added_s * 1000)}-0", "at": added_s + after_s}


def test_the_longest_wait_is_reported_and_checked_against_the_bound() -> None:
    waits = measure([decided(100.0, 0.5), decided(101.0, 2.5), decided(102.0, 0.1)], 3.0)
    assert waits.count == 3
    assert waits.longest_entry == "101000-0"
    assert abs(waits.longest_s - 2.5) < 1e-6
    assert waits.ok


def test_a_stranded_entry_is_over_the_bound() -> None:
    waits = measure([decided(100.0, 0.5), decided(101.0, 38.0)], 3.0)
    assert not waits.ok
    assert [entry for entry, _, _ in waits.over] == ["101000-0"]


def test_a_fault_overlapping_a_wait_extends_what_it_may_wait() -> None:
    kill = Interruption.of("kill_aggregator", 101.5, 0.5)
    assert kill is not None
    assert kill.seconds == 0.5 + RECOVERY_S
    record = decided(101.0, 3.0 + kill.seconds - 0.1)
    assert measure([record], 3.0, [kill]).ok
    before = Interruption(50.0, 10.0)  # over long before the entry was added: no excuse
    assert not measure([record], 3.0, [before]).ok


def test_a_second_aggregator_excuses_only_its_start_never_how_long_the_first_is_stopped() -> None:
    second = Interruption.of("second_aggregator", 100.0, 60.0)
    assert second is not None
    assert second.seconds == RECOVERY_S
    assert not measure([decided(100.5, 3.0 + 30.0)], 3.0, [second]).ok


def test_faults_that_do_not_stop_the_deciding_excuse_nothing() -> None:
    assert Interruption.of("kill_worker", 1.0, 0.5) is None
    assert Interruption.of("restart_snapshot", 1.0, 0.5) is None


def test_the_decision_bound_is_idle_time_plus_a_claim_period_plus_a_batch() -> None:
    cfg = AggregatorSettings(claim_idle_s=2.0, claim_interval_s=1.0, batch_ms=50)
    assert cfg.decision_bound_s == 3.05


def test_the_new_faults_are_in_both_profiles_with_their_parameters() -> None:
    for profile in (PROFILES["fast"], PROFILES["long"]):
        schedule = build_schedule(profile, 5)
        stalls = [f for f in schedule if f.kind is FaultKind.STALL_REDIS]
        seconds = [f for f in schedule if f.kind is FaultKind.SECOND_AGGREGATOR]
        assert stalls
        assert seconds
        for stall in stalls:
            assert stall.command in STALLED_COMMANDS
            assert StallMode(stall.mode) in StallMode
            assert profile.stall_ms[0] <= stall.outage_s * 1000 <= profile.stall_ms[1]
        bound = AggregatorSettings().decision_bound_s
        for second in seconds:
            # the first stays stopped longer than the bound: the claim, not its return, decides
            assert second.outage_s > bound
