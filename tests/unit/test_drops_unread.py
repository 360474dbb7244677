"""`drops_unread`: when it says an update is decided without its weights, it is.

The simulator relies on it to skip training such an update (issue 16), so the promise is
checked the strong way: the same update with NaN weights and with real weights gets the same
decision and leaves the same state, in every mode, at every τ around τ_max and below the
dedup floor.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.policy import Policy
from tests.unit.helpers import make_state, make_update

MODES = ("fedasync", "fedbuff", "memory", "tiered", "fedbuff-fair")


def advanced(mode: str, versions: int) -> tuple[AggregationState, Policy]:
    """A state `versions` server steps in, with a small dedup horizon."""
    policy = Policy.configured({"mode": mode, "tau_max": 3, "buffer_size": 1})
    state = make_state(horizon=1000, capacity=6)
    run = 0
    while state.version < versions:
        state.apply(make_update(f"warm{run}", state.version, 0.1 * run, client=f"c{run}"), policy)
        run += 1
    return state, policy


@pytest.mark.parametrize("mode", MODES)
def test_an_update_it_calls_unread_is_decided_the_same_with_any_weights(mode: str) -> None:
    checked = 0
    for base in range(12):
        state, policy = advanced(mode, 12)
        if not state.drops_unread(base, policy):
            continue
        twin, _ = advanced(mode, 12)
        real = state.apply(make_update("u", base, 0.5), policy)
        garbage = twin.apply(make_update("u", base, np.full(4, np.nan, np.float32)), policy)
        assert real.to_dict() == garbage.to_dict()
        assert real.outcome.value == "dropped"
        assert state.weights_view().tobytes() == twin.weights_view().tobytes()
        assert state.counters == twin.counters
        checked += 1
    assert checked == 9  # bases below version − τ_max, six of them below the dedup floor
    assert advanced(mode, 12)[0].dedup.floor == 6


@pytest.mark.parametrize("mode", MODES)
def test_a_fresh_update_is_not_called_unread(mode: str) -> None:
    state, policy = advanced(mode, 12)
    assert not state.drops_unread(state.version, policy)
    assert not state.drops_unread(state.version - policy.tau_max, policy)
    assert state.drops_unread(state.version - policy.tau_max - 1, policy)


def _state_bytes(state: AggregationState) -> tuple[object, ...]:
    """What a decision may change: weights, version, counters, the dedup memory."""
    return (
        state.weights_view().tobytes(),
        state.version,
        dict(state.counters),
        state.dedup.floor,
        list(state.dedup.items()),
    )


@pytest.mark.parametrize("mode", MODES)
def test_decide_unread_decides_as_apply_does_without_weights(mode: str) -> None:
    """`decide_unread` (issue 29): for every update `drops_unread` names, the decision `apply`
    makes and the same state after it; for every other, None and nothing changed."""
    decided = 0
    for base in range(13):
        state, policy = advanced(mode, 12)
        twin, _ = advanced(mode, 12)
        before = _state_bytes(state)
        fast = state.decide_unread("u", "c", base, 1, policy)
        if not twin.drops_unread(base, policy):
            assert fast is None
            assert _state_bytes(state) == before
            continue
        assert fast is not None
        slow = twin.apply(make_update("u", base, 0.5, client="c"), policy)
        assert fast.to_dict() == slow.to_dict()
        assert _state_bytes(state) == _state_bytes(twin)
        decided += 1
    assert decided == 9  # as many as `drops_unread` names: the stale and the beyond-horizon


@pytest.mark.parametrize(
    ("update_id", "client", "base", "samples", "why"),
    [
        ("", "c", 0, 1, "a bad id is rejected by apply"),
        ("u", "c", 99, 1, "a base from the future is rejected"),
        ("u", "c", 7, 0, "no samples is rejected"),
        ("u", "c", True, 1, "a bool is not a version"),
        ("seen", "c", 7, 1, "a duplicate"),
    ],
)
def test_decide_unread_leaves_what_apply_refuses_to_apply(
    update_id: str, client: str, base: int, samples: int, why: str
) -> None:
    state, policy = advanced("fedasync", 12)
    state.apply(make_update("seen", 12, 0.5), policy)  # applied, and remembered
    before = _state_bytes(state)
    assert state.decide_unread(update_id, client, base, samples, policy) is None, why
    assert _state_bytes(state) == before


def test_decide_unread_leaves_a_closed_run_to_apply() -> None:
    state, policy = advanced("fedbuff", 12)
    state.close("max_updates")
    before = _state_bytes(state)
    assert state.decide_unread("u", "c", 7, 1, policy) is None
    assert _state_bytes(state) == before
