"""The aggregation state machine: mixing, dropping, dedup, rejection, FedBuff, snapshots."""

from __future__ import annotations

import numpy as np
import pytest

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.decision import DropReason, Outcome, RejectReason
from fedasync.shared.layout import Layout
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.staleness import Decay
from fedasync.shared.update import Update
from tests.unit.helpers import make_state, make_update


def test_fedasync_mixes_exactly_as_the_rule_says() -> None:
    state = make_state(size=3, value=1.0)
    policy = Policy(decay=Decay.POLYNOMIAL, alpha0=0.5, gamma=1.0)
    new = np.array([3.0, -1.0, 0.5], np.float32)
    first = state.apply(make_update("a", 0, new), policy)
    assert (first.outcome, first.tau, first.alpha, first.version) == (Outcome.APPLIED, 0, 0.5, 1)
    expected = np.float32(0.5) * np.ones(3, np.float32) + np.float32(0.5) * new
    np.testing.assert_array_equal(state.weights_view(), expected)

    second = state.apply(make_update("b", 0, np.zeros(3, np.float32)), policy)
    assert (second.tau, second.alpha) == (1, 0.25)  # 0.5 · (1+1)^−1
    np.testing.assert_array_equal(state.weights_view(), np.float32(0.75) * expected)
    assert second.step_norm == pytest.approx(float(np.linalg.norm(0.25 * expected)), rel=1e-6)


def test_stale_update_is_dropped_and_version_unchanged() -> None:
    state = make_state()
    policy = Policy(tau_max=2)
    for i in range(3):
        state.apply(make_update(f"u{i}", state.version), policy)
    before = state.weights_view().copy()
    decision = state.apply(make_update("old", 0), policy)
    assert (decision.outcome, decision.tau, decision.reason) == (
        Outcome.DROPPED,
        3,
        DropReason.STALE,
    )
    assert decision.alpha is None
    assert state.version == 3
    np.testing.assert_array_equal(state.weights_view(), before)


def test_duplicate_is_decided_once_whatever_the_policy_becomes() -> None:
    state = make_state()
    strict = Policy(tau_max=0)
    state.apply(make_update("first", 0), strict)
    dropped = state.apply(make_update("late", 0), strict)
    assert dropped.outcome is Outcome.DROPPED
    relaxed = strict.evolve(tau_max=50)
    again = state.apply(make_update("late", 0), relaxed)
    assert again.outcome is Outcome.DUPLICATE
    assert state.apply(make_update("first", 0), relaxed).outcome is Outcome.DUPLICATE
    assert state.version == 1
    assert state.counters == {
        "applied": 1,
        "dropped": 1,
        "duplicate": 2,
        "rejected": 0,
        "server_steps": 1,
    }


@pytest.mark.parametrize(
    ("update", "reason"),
    [
        (make_update("x", 0, size=5), RejectReason.SHAPE_MISMATCH),
        (make_update("x", 0, np.ones((2, 2), np.float32)), RejectReason.SHAPE_MISMATCH),
        (Update("x", "c", 0, 1, np.ones(4, np.float64)), RejectReason.BAD_DTYPE),
        (Update("x", "c", 0, 1, [1.0, 2.0, 3.0, 4.0]), RejectReason.BAD_DTYPE),  # type: ignore[arg-type]
        (make_update("x", 0, np.array([1, np.nan, 0, 0], np.float32)), RejectReason.NON_FINITE),
        (make_update("x", 0, np.array([1, np.inf, 0, 0], np.float32)), RejectReason.NON_FINITE),
        (make_update("x", 5), RejectReason.FUTURE_BASE_VERSION),
        (make_update("x", 0, samples=0), RejectReason.BAD_NUM_SAMPLES),
        (Update("x", "c", -1, 1, np.ones(4, np.float32)), RejectReason.BAD_BASE_VERSION),
        (Update("x", "c", True, 1, np.ones(4, np.float32)), RejectReason.BAD_BASE_VERSION),
        (Update("", "c", 0, 1, np.ones(4, np.float32)), RejectReason.BAD_ID),
        (Update("x", "", 0, 1, np.ones(4, np.float32)), RejectReason.BAD_ID),
        (Update("x" * 129, "c", 0, 1, np.ones(4, np.float32)), RejectReason.BAD_ID),
    ],
)
def test_invalid_updates_are_rejected_with_reason(update: Update, reason: RejectReason) -> None:
    state = make_state()
    decision = state.apply(update, Policy())
    assert decision.outcome is Outcome.REJECTED
    assert decision.reason == reason
    assert decision.detail
    assert state.version == 0
    np.testing.assert_array_equal(state.weights_view(), np.zeros(4, np.float32))


def test_rejected_update_is_not_decided_again() -> None:
    state = make_state()
    state.apply(make_update("x", 0, size=5), Policy())
    assert state.apply(make_update("x", 0), Policy()).outcome is Outcome.DUPLICATE


def test_float16_weights_are_accepted_and_widened() -> None:
    state = make_state()
    decision = state.apply(make_update("h", 0, np.full(4, 0.5, np.float16)), Policy(alpha0=1.0))
    assert decision.applied
    assert state.weights_view().dtype == np.float32
    np.testing.assert_array_equal(state.weights_view(), np.full(4, 0.5, np.float32))


def test_snapshot_is_a_copy_never_a_reference() -> None:
    state = make_state()
    snap = state.snapshot()
    snap.weights[:] = 99.0
    np.testing.assert_array_equal(state.weights_view(), np.zeros(4, np.float32))
    assert not state.weights_view().flags.writeable
    view = state.weights_view()
    state.apply(make_update("u", 0), Policy())
    np.testing.assert_array_equal(view, np.zeros(4, np.float32))  # replaced, never written


def test_update_weights_are_never_aliased_into_the_model() -> None:
    state = make_state()
    new = np.ones(4, np.float32)
    state.apply(make_update("u", 0, new), Policy(alpha0=1.0))
    new[:] = 7.0
    np.testing.assert_array_equal(state.weights_view(), np.ones(4, np.float32))


def test_initial_state_is_checked() -> None:
    with pytest.raises(ValueError, match="float32"):
        AggregationState(np.zeros(4), Layout.flat(4))
    with pytest.raises(ValueError, match="finite"):
        AggregationState(np.array([np.nan], np.float32), Layout.flat(1))


# ------------------------------------------------------------------------------------ FedBuff
def test_fedbuff_steps_once_every_k_with_weighted_deltas() -> None:
    state = make_state(size=2, value=1.0)
    policy = Policy.fedbuff(buffer_size=2, server_lr=0.5)
    d1 = state.apply(make_update("a", 0, np.array([3.0, 1.0], np.float32)), policy)
    assert d1.applied
    assert not d1.server_step
    assert d1.step_norm == 0.0
    np.testing.assert_array_equal(state.weights_view(), [1.0, 1.0])  # buffered only
    d2 = state.apply(make_update("b", 0, np.array([1.0, 5.0], np.float32)), policy)
    assert d2.server_step
    # the version counts server steps: the buffered update leaves it at 0, the step makes 1
    assert (d1.version, d2.version, d1.tau, d2.tau) == (0, 1, 0, 0)
    # Δa = (2, 0), Δb = (0, 4), both s(0) = 1; step = 0.5·(Σ)/2
    expected = np.array([1.0 + 0.25 * 2.0, 1.0 + 0.25 * 4.0], np.float32)
    np.testing.assert_allclose(state.weights_view(), expected, rtol=1e-6)
    assert d2.alpha == pytest.approx(0.5 / 2)
    assert state.counters["server_steps"] == 1
    assert (state.version, state.applied) == (1, 2)


@pytest.mark.parametrize("k", [1, 3, 10])
@pytest.mark.parametrize("steps", [0, 1, 4, 7])
def test_fedbuff_tau_counts_server_steps_not_buffered_updates(k: int, steps: int) -> None:
    """Nguyen et al. 2022: K updates from base version v after s server steps have τ = s, weight
    1/√(1 + s), and τ_max is compared with s (not with the s·K updates applied meanwhile)."""
    state = make_state(size=2, value=0.0)
    policy = Policy.fedbuff(buffer_size=k, tau_max=100)
    for i in range(steps * k):  # s server steps of K fresh updates each
        decision = state.apply(make_update(f"warm{i}", state.version, 1.0, size=2), policy)
        assert decision.tau == 0
    base = state.version
    assert (base, state.applied, state.buffer.count) == (steps, steps * k, 0)
    stale = [make_update(f"late{i}", 0, 2.0, size=2) for i in range(k)]
    decisions = [state.apply(update, policy) for update in stale]
    assert [d.tau for d in decisions] == [steps] * k
    weight = 1.0 / np.sqrt(1.0 + steps)
    assert [d.alpha for d in decisions] == [pytest.approx(weight / k)] * k
    assert [d.version for d in decisions] == [steps] * (k - 1) + [steps + 1]
    assert [d.server_step for d in decisions] == [False] * (k - 1) + [True]
    # τ_max compares against s: at τ_max = s the same updates pass, at s − 1 they are dropped
    if steps:
        strict = make_state(size=2, value=0.0)
        for i in range(steps * k):
            strict.apply(make_update(f"warm{i}", strict.version, 1.0, size=2), policy)
        # dropped first: with K = 1 the applied one would take a step and raise the version
        beyond = strict.apply(make_update("beyond", 0, size=2), policy.evolve(tau_max=steps - 1))
        at = strict.apply(make_update("at", 0, size=2), policy.evolve(tau_max=steps))
        assert (at.outcome, at.tau) == (Outcome.APPLIED, steps)
        assert (beyond.reason, beyond.tau) == (DropReason.STALE, steps)


def test_fedbuff_step_uses_the_weights_the_device_trained_from() -> None:
    """Each delta is x_i − x_base(i), with the model of the version it names, weighted by
    1/√(1 + τ) in steps; the step adds η·mean of them."""
    state = make_state(size=1, value=0.0)
    policy = Policy.fedbuff(buffer_size=2, server_lr=1.0)
    state.apply(make_update("a", 0, 4.0, size=1), policy)
    state.apply(make_update("b", 0, 2.0, size=1), policy)  # x1 = (4 + 2)/2 = 3
    assert (state.version, state.weights_view()[0]) == (1, 3.0)
    state.apply(make_update("c", 1, 5.0, size=1), policy)  # Δ = 2 from x1, τ 0
    state.apply(make_update("d", 0, 1.0, size=1), policy)  # Δ = 1 from x0, τ 1: weight 1/√2
    expected = np.float32(3.0 + (2.0 + 1.0 / np.sqrt(2.0)) / 2)
    assert state.weights_view()[0] == expected


def test_fedbuff_delta_is_against_the_version_the_device_trained_from() -> None:
    state = make_state(size=1, value=0.0)
    policy = Policy.fedbuff(buffer_size=1, server_lr=1.0).evolve(decay=Decay.CONSTANT)
    state.apply(make_update("a", 0, np.array([2.0], np.float32), size=1), policy)  # x = 2
    assert state.weights_view()[0] == 2.0
    # trained from version 0 (x = 0) and reached 1: the delta is +1, not 1 − 2
    state.apply(make_update("b", 0, np.array([1.0], np.float32), size=1), policy)
    assert state.weights_view()[0] == 3.0


def test_fedbuff_base_weights_unavailable_after_switch_from_fedasync() -> None:
    state = make_state()
    state.apply(make_update("a", 0), Policy())
    state.apply(make_update("b", 1), Policy())
    decision = state.apply(make_update("c", 1), Policy.fedbuff(buffer_size=2, tau_max=10))
    assert decision.outcome is Outcome.DROPPED
    assert decision.reason == DropReason.BASE_UNAVAILABLE
    ok = state.apply(make_update("d", 2), Policy.fedbuff(buffer_size=2, tau_max=10))
    assert ok.applied


def test_switching_back_to_fedasync_applies_the_leftover_buffer() -> None:
    state = make_state(size=1, value=0.0)
    buff = Policy.fedbuff(buffer_size=3, server_lr=1.0).evolve(decay=Decay.CONSTANT)
    state.apply(make_update("a", 0, np.array([3.0], np.float32), size=1), buff)
    assert state.weights_view()[0] == 0.0
    fedasync = buff.evolve(mode=Mode.FEDASYNC, alpha0=0.5)
    assert state.version == 0  # a buffered update is not a server step
    state.apply(make_update("b", 0, np.array([3.0], np.float32), size=1), fedasync)
    # leftover step: 0 + 1.0·3/1 = 3; then mix: 0.5·3 + 0.5·3 = 3
    assert state.weights_view()[0] == 3.0
    assert state.buffer.count == 0
    assert state.history == []
    assert state.counters["server_steps"] == 2
    assert state.version == 1  # the leftover step and the mix make one new model


def test_fedbuff_history_is_bounded_by_tau_max() -> None:
    state = make_state()
    policy = Policy.fedbuff(buffer_size=1, tau_max=3)
    for i in range(50):
        assert state.apply(make_update(f"u{i}", state.version), policy).applied
    assert len(state.history) <= policy.tau_max + 1
    assert state.apply(make_update("late", state.version - 3), policy).applied


# ------------------------------------------------------------------------------------ dedup
def test_dedup_memory_forgets_beyond_the_horizon_and_drops_older_updates() -> None:
    state = make_state(horizon=1000)
    policy = Policy(tau_max=5)
    for i in range(1200):
        state.apply(make_update(f"u{i}", state.version), policy)
    assert state.dedup.floor == 200
    assert len(state.dedup) == 1000
    decision = state.apply(make_update("u3", 3), policy)  # decided long ago, now forgotten
    assert decision.outcome is Outcome.DROPPED
    assert decision.reason == DropReason.BEYOND_DEDUP_HORIZON
    assert state.apply(make_update("u1100", 1100), policy).outcome is Outcome.DUPLICATE


def test_dedup_memory_is_bounded_when_the_version_stalls() -> None:
    state = make_state(capacity=100)
    policy = Policy(tau_max=0)
    state.apply(make_update("seed", 0), policy)
    for i in range(1000):  # all stale: the version never moves
        state.apply(make_update(f"s{i}", 0), policy)
    assert len(state.dedup) <= 100
    assert state.dedup.floor == 1  # version 0 forgotten: anything trained from it is dropped
    assert state.apply(make_update("s5", 0), policy).reason == DropReason.BEYOND_DEDUP_HORIZON
    assert state.apply(make_update("fresh", 1), policy).applied


def test_finite_weights_whose_float32_difference_overflows_still_mix_exactly() -> None:
    big = np.finfo(np.float32).max
    state = make_state(size=2, value=-big)
    decision = state.apply(make_update("far", 0, np.array([big, big], np.float32)), Policy())
    assert decision.applied
    assert np.isfinite(state.weights_view()).all()
    expected = (-float(big) + 0.6 * 2 * float(big)) * np.ones(2)
    np.testing.assert_allclose(state.weights_view(), expected.astype(np.float32), rtol=1e-6)
    assert decision.step_norm == pytest.approx(0.6 * 2 * float(big) * np.sqrt(2), rel=1e-6)


def test_a_stale_update_is_dropped_without_reading_its_weights() -> None:
    state = make_state()
    policy = Policy(tau_max=0)
    state.apply(make_update("a", 0), policy)
    nan = make_update("nan", 0, np.full(4, np.nan, np.float32))
    assert state.apply(nan, policy).reason == DropReason.STALE


def test_non_finite_update_with_a_pending_fedbuff_buffer_changes_nothing() -> None:
    state = make_state(size=1, value=0.0)
    state.apply(make_update("a", 0, 2.0, size=1), Policy.fedbuff(buffer_size=3))
    bad = make_update("b", 0, np.array([np.nan], np.float32), size=1)
    decision = state.apply(bad, Policy())
    assert decision.reason == RejectReason.NON_FINITE
    assert state.buffer.count == 1
    assert state.weights_view()[0] == 0.0


def test_closed_state_drops_everything_new_and_keeps_dedup() -> None:
    state = make_state()
    state.apply(make_update("a", 0), Policy())
    state.close("max_updates")
    state.close("max_seconds")  # the first reason stands
    late = state.apply(make_update("b", 1), Policy())
    assert (late.outcome, late.reason, late.detail) == (
        Outcome.DROPPED,
        DropReason.CLOSED,
        "max_updates",
    )
    assert state.apply(make_update("a", 0), Policy()).outcome is Outcome.DUPLICATE
    assert state.apply(make_update("b", 1), Policy()).outcome is Outcome.DUPLICATE
    assert state.version == 1
