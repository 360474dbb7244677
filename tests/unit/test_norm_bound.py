"""The poisoning bound, with hand-computed values.

Five ordinary updates move the model by delta norms 1, 2, 2, 4, 2 (sorted 1, 2, 2, 2, 4: median
2), so with k = 3 the bound is 6; a delta of norm 10 is beyond it. α = 0.5 (constant decay) keeps
every weight an exact binary fraction, so the expected weights are exact.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import load_state, save_state
from fedasync.shared.decision import Decision, Outcome, RejectReason
from fedasync.shared.params import ParamError
from fedasync.shared.policy import NormAction, Policy
from fedasync.shared.staleness import Decay
from fedasync.shared.wire import pack
from tests.unit.helpers import make_state, make_update

ORDINARY = [(1.0, 0, 0, 0), (0, 2.0, 0, 0), (2.0, 0, 0, 0), (0, 0, 4.0, 0), (0, 0, 0, 2.0)]
HUGE = (10.0, 0, 0, 0)


def bounded(action: NormAction = NormAction.REJECT, **more: object) -> Policy:
    return Policy(
        decay=Decay.CONSTANT,
        alpha0=0.5,
        tau_max=100,
        norm_bound=3.0,
        norm_window=5,
        norm_action=action,
        **more,  # type: ignore[arg-type]
    )


def push(
    state: AggregationState, update_id: str, delta: tuple[float, ...], policy: Policy
) -> Decision:
    """An update that trained from the current model and moved it by `delta`."""
    weights = state.weights_view() + np.asarray(delta, np.float32)
    return state.apply(make_update(update_id, state.version, weights), policy)


def warmed_up(policy: Policy) -> AggregationState:
    state = make_state()
    for i, delta in enumerate(ORDINARY):
        decision = push(state, f"ok{i}", delta, policy)
        assert decision.applied
        assert not decision.clipped
    assert list(state.norms) == [1.0, 2.0, 2.0, 4.0, 2.0]
    assert state.norm_bound(policy) == 6.0
    return state


def test_a_huge_update_is_rejected_with_its_reason_and_changes_nothing() -> None:
    policy = bounded(NormAction.REJECT)
    state = warmed_up(policy)
    before = state.weights_view().copy()
    decision = push(state, "huge", HUGE, policy)
    assert decision.outcome is Outcome.REJECTED
    assert decision.reason == RejectReason.NORM_BOUND
    assert decision.delta_norm == 10.0
    assert "bound 6" in decision.detail
    assert state.version == 5
    np.testing.assert_array_equal(state.weights_view(), before)
    assert len(state.norms) == 5  # a rejected update does not enter the history


def test_a_huge_update_is_clipped_to_exactly_the_bound() -> None:
    policy = bounded(NormAction.CLIP)
    state = warmed_up(policy)
    before = state.weights_view().copy()
    decision = push(state, "huge", HUGE, policy)
    assert decision.applied
    assert decision.clipped
    assert decision.delta_norm == 6.0
    assert decision.step_norm == 3.0  # α · bound
    # x + α · (6/10) · (10, 0, 0, 0) = x + (3, 0, 0, 0)
    np.testing.assert_array_equal(state.weights_view(), before + np.array([3, 0, 0, 0], np.float32))
    assert state.norms[-1] == 6.0  # the clipped norm, so an attacker cannot inflate the median


def test_fedbuff_clips_the_delta_it_buffers() -> None:
    policy = Policy.fedbuff(buffer_size=10, tau_max=100).evolve(
        norm_bound=3.0, norm_window=5, norm_action=NormAction.CLIP
    )
    state = warmed_up(policy)
    total = state.buffer.total.copy()
    decision = push(state, "huge", HUGE, policy)  # τ = 0: s(τ) = 1
    assert decision.clipped
    assert decision.delta_norm == 6.0
    np.testing.assert_array_equal(state.buffer.total - total, [6.0, 0, 0, 0])


def test_no_bound_applies_while_the_history_is_short() -> None:
    policy = bounded(NormAction.REJECT)
    state = make_state()
    for i, delta in enumerate(ORDINARY[:4]):
        push(state, f"ok{i}", delta, policy)
    assert state.norm_bound(policy) is None
    decision = push(state, "huge", HUGE, policy)
    assert decision.applied
    assert not decision.clipped
    assert decision.delta_norm == 10.0


def test_the_bound_is_off_by_default() -> None:
    policy = Policy(decay=Decay.CONSTANT, alpha0=0.5, tau_max=100)
    assert policy.norm_bound is None
    state = make_state()
    for i in range(10):
        push(state, f"ok{i}", ORDINARY[i % 5], policy)
    decision = push(state, "huge", (1e6, 0, 0, 0), policy)
    assert decision.applied
    assert not decision.clipped


def test_the_window_is_the_last_norm_window_applied_updates() -> None:
    policy = bounded(NormAction.REJECT).evolve(norm_window=6)
    state = warmed_up(policy)
    assert push(state, "ok5", (0, 0, 3.0, 4.0), policy).applied  # norm 5 ≤ 6
    assert state.norm_bound(policy) == 6.0  # 1 2 2 4 2 5: median (2 + 2) / 2
    assert push(state, "ok6", (0, 0, 3.0, 4.0), policy).applied
    assert state.norm_bound(policy) == 9.0  # last six 2 2 4 2 5 5: median (2 + 4) / 2


def test_policy_validates_the_bound() -> None:
    with pytest.raises(ParamError, match="norm_bound"):
        Policy(norm_bound=0.5)
    with pytest.raises(ParamError, match="norm_window"):
        Policy(norm_window=4)
    with pytest.raises(ParamError, match="norm_action"):
        Policy(norm_action="ignore")  # type: ignore[arg-type]
    policy = Policy(norm_bound=3, norm_action=NormAction.CLIP)
    assert Policy.from_dict(policy.to_dict()) == policy
    assert policy.to_dict()["norm_action"] == "clip"


def test_the_history_survives_a_checkpoint_and_old_checkpoints_load_empty() -> None:
    policy = bounded(NormAction.REJECT)
    state = warmed_up(policy)
    again = load_state(save_state(state))
    assert list(again.norms) == [1.0, 2.0, 2.0, 4.0, 2.0]
    assert push(again, "huge", HUGE, policy).reason == RejectReason.NORM_BOUND

    older = msgpack.unpackb(save_state(state), raw=False)
    del older["norms"]  # a checkpoint written before the bound existed
    restored = load_state(pack(older))
    assert list(restored.norms) == []
    assert push(restored, "huge", HUGE, policy).applied  # no history: no bound yet
