"""The modes that keep slow clients' data: memory (MIFA), tiered (FedAT), fedbuff-fair.

Each rule is checked against its formula on numbers small enough to follow by hand, and so are
the bounds of what the server remembers and what a change of mode does with it.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import CheckpointError, load_state, save_state
from fedasync.shared.decision import Outcome
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.staleness import Decay
from tests.unit.helpers import make_state, make_update


def memory(**changes: object) -> Policy:
    return Policy.configured(
        {"mode": "memory", "buffer_size": 1, "server_lr": 1.0, "tau_max": 100} | changes
    )


def one(value: float) -> np.ndarray:
    return np.array([value], np.float32)


# ------------------------------------------------------------------------------------ memory
def test_memory_steps_with_the_sample_weighted_mean_of_every_clients_latest_delta() -> None:
    """x ← x + η·Σ n_i·m_i / Σ n_i over every client remembered, not only the one just heard."""
    state = make_state(size=1)
    policy = memory(server_lr=0.5)
    state.apply(make_update("a", 0, one(4.0), size=1, client="slow", samples=30), policy)
    assert state.weights_view()[0] == np.float32(0.5 * 4.0)  # only "slow" remembered: mean = 4
    # "fast" trained from x1 = 2 and reached 3: Δ = 1; the mean is (30·4 + 10·1)/40 = 3.25
    state.apply(make_update("b", 1, one(3.0), size=1, client="fast", samples=10), policy)
    assert state.weights_view()[0] == np.float32(2.0 + 0.5 * 3.25)
    # "fast" again (from x2): only its own delta is replaced; "slow"'s 4 still counts
    x2 = float(state.weights_view()[0])
    state.apply(make_update("c", 2, one(x2 - 2.0), size=1, client="fast", samples=10), policy)
    assert state.weights_view()[0] == np.float32(x2 + 0.5 * (30 * 4.0 + 10 * -2.0) / 40)
    assert len(state.clients) == 2
    assert state.memory.weight == 40


def test_memory_takes_a_server_step_every_k_updates() -> None:
    state = make_state(size=1)
    policy = memory(buffer_size=3)
    decisions = [
        state.apply(make_update(f"u{i}", 0, one(1.0), size=1, client=f"c{i}"), policy)
        for i in range(3)
    ]
    assert [d.server_step for d in decisions] == [False, False, True]
    assert [d.version for d in decisions] == [0, 0, 1]
    assert all(d.applied for d in decisions)
    assert state.weights_view()[0] == 1.0  # three deltas of 1, mean 1, η 1
    assert decisions[0].alpha == pytest.approx(1.0)  # η·s·n/W at the time: alone in memory
    assert decisions[2].alpha == pytest.approx(1 / 3)


def test_a_slow_clients_delta_keeps_pulling_until_it_sends_a_new_one() -> None:
    """What FedAsync forgets: coordinate 1 stands for the rare class, which only the slow client
    raises and every other client's training halves (their data lacks it). After 60 updates
    from the others, the memory still holds the slow client's +1 in every step, so the model
    settles where it balances the others' pull (1 = 9 × ½·x₁, x₁ ≈ 0.22); FedAsync mixes the
    slow update in once and each later update takes (1 − α0)·½ of it away."""

    def others(state: AggregationState, policy: Policy) -> None:
        for i in range(60):
            trained = state.weights_view().copy()
            trained[1] *= 0.5
            state.apply(
                make_update(f"f{i}", state.version, trained, size=2, client=f"f{i % 9}"), policy
            )

    rare = np.array([0.0, 1.0], np.float32)
    kept = make_state(size=2)
    kept.apply(make_update("slow", 0, rare, size=2, client="slow"), memory(server_lr=0.2))
    others(kept, memory(server_lr=0.2))
    assert kept.clients.get("slow") is not None
    assert kept.weights_view()[1] > 0.15
    forgetful = make_state(size=2)
    forgetful.apply(make_update("slow", 0, rare, size=2, client="slow"), Policy(tau_max=100))
    others(forgetful, Policy(tau_max=100))
    assert forgetful.weights_view()[1] < 1e-6


def test_memory_is_bounded_by_clients_and_forgets_the_least_recently_heard() -> None:
    state = make_state(size=1)
    policy = memory(memory_clients=2, buffer_size=10)
    for i, client in enumerate(["a", "b", "a", "c"]):
        state.apply(make_update(f"u{i}", 0, one(1.0 + i), size=1, client=client), policy)
    assert [c for c, _ in state.clients.items()] == ["a", "c"]  # b was heard least recently
    assert state.memory.weight == 20
    assert state.clients.deltas == 2
    entry_a, entry_c = state.clients.get("a"), state.clients.get("c")
    assert entry_a is not None
    assert entry_c is not None
    assert entry_a.delta is not None
    assert entry_c.delta is not None
    expected = 10 * (entry_a.delta.astype(np.float64) + entry_c.delta.astype(np.float64))
    np.testing.assert_array_equal(state.memory.total, expected)


def test_a_client_silent_for_more_than_memory_idle_steps_is_forgotten() -> None:
    state = make_state(size=1)
    policy = memory(memory_idle=3)
    state.apply(make_update("gone", 0, one(5.0), size=1, client="gone"), policy)  # at version 0
    for i in range(2):
        state.apply(make_update(f"u{i}", state.version, one(1.0), size=1, client="here"), policy)
    assert state.version == 3
    assert "gone" in state.clients  # 3 steps since the version it was decided at: remembered
    state.apply(make_update("u3", state.version, one(1.0), size=1, client="here"), policy)
    assert "gone" not in state.clients
    assert state.memory.weight == 10
    assert state.clients.take_changes() >= {"gone"}  # a store deletes its record


def test_memory_delta_is_against_the_base_and_older_bases_are_unavailable() -> None:
    state = make_state(size=1)
    state.apply(make_update("a", 0, one(2.0), size=1), Policy())  # FedAsync to version 1
    decision = state.apply(make_update("b", 0, one(1.0), size=1), memory())
    assert decision.outcome is Outcome.DROPPED
    assert decision.reason == "base_unavailable"
    assert state.apply(make_update("c", 1, one(1.0), size=1), memory()).applied


# ------------------------------------------------------------------------------------ tiered
def tiered(**changes: object) -> Policy:
    return Policy.configured(
        {"mode": "tiered", "tiers": 2, "buffer_size": 2, "tau_max": 100} | changes
    )


def test_tiers_rank_clients_by_the_tau_of_their_latest_update() -> None:
    state = make_state(size=1)
    policy = tiered(buffer_size=100)
    state.apply(make_update("f", 0, one(1.0), size=1, client="fast"), policy)
    assert state.clients.tier("fast", 2) == 0  # alone: in the fastest tier
    state.version = 5  # as if five server steps went by
    state.apply(make_update("s", 0, one(1.0), size=1, client="slow"), policy)
    assert (state.clients.tier("fast", 2), state.clients.tier("slow", 2)) == (0, 1)
    assert [t.count for t in state.tiers] == [1, 1]


def test_a_tier_round_is_the_sample_weighted_mean_and_the_model_fedats_weighted_average() -> None:
    """Two tiers; the fast tier completes two rounds, the slow one one. FedAT's weights with
    add-one counts: ω_fast = (T_slow + 1)/Σ = 2/5, ω_slow = (T_fast + 1)/Σ = 3/5."""
    state = make_state(size=1)
    policy = tiered()
    state.apply(make_update("f1", 0, one(1.0), size=1, client="f", samples=10), policy)
    d = state.apply(make_update("f2", 0, one(4.0), size=1, client="f", samples=30), policy)
    assert d.server_step
    assert state.weights_view()[0] == np.float32(3.25)  # (10·1 + 30·4)/40, the only model
    state.version = 10  # the slow client's τ ranks it into the slow tier
    state.apply(make_update("s1", 0, one(8.0), size=1, client="s"), policy)
    state.apply(make_update("s2", 0, one(6.0), size=1, client="s"), policy)  # slow round: 7
    slow_tier, fast_tier = state.tiers[1], state.tiers[0]
    assert (fast_tier.rounds, slow_tier.rounds) == (1, 1)
    assert state.weights_view()[0] == np.float32(0.5 * 3.25 + 0.5 * 7.0)
    state.apply(make_update("f3", state.version, one(2.0), size=1, client="f"), policy)
    state.apply(make_update("f4", state.version, one(2.0), size=1, client="f"), policy)
    assert (fast_tier.rounds, slow_tier.rounds) == (2, 1)
    expected = (2 / 5) * 2.0 + (3 / 5) * 7.0
    assert state.weights_view()[0] == pytest.approx(expected, rel=1e-6)


# ------------------------------------------------------------------------------------ fedbuff-fair
def test_fedbuff_fair_weighs_each_delta_by_its_clients_inverse_contribution_rate() -> None:
    state = make_state(size=1)
    policy = Policy.configured(
        {"mode": "fedbuff-fair", "buffer_size": 4, "decay": Decay.CONSTANT, "tau_max": 100}
    )
    values = [("fast", 1.0), ("fast", 1.0), ("fast", 1.0), ("slow", 5.0)]
    decisions = [
        state.apply(make_update(f"u{i}", 0, one(v), size=1, client=c), policy)
        for i, (c, v) in enumerate(values)
    ]
    # weights C/(N·c_i) as each arrives: 1/(1·1), 2/(1·2), 3/(1·3), then 4/(2·1) = 2
    assert [d.alpha for d in decisions] == pytest.approx([1 / 4, 1 / 4, 1 / 4, 2 / 4])
    # Σ w·Δ / Σ w = (1 + 1 + 1 + 2·5) / (1 + 1 + 1 + 2)
    assert state.weights_view()[0] == np.float32(13 / 5)


def test_fedbuff_fair_weight_is_capped_at_k() -> None:
    state = make_state(size=1)
    policy = Policy.configured({"mode": "fedbuff-fair", "buffer_size": 2, "tau_max": 100})
    for i in range(20):
        state.apply(make_update(f"u{i}", state.version, one(1.0), size=1, client="fast"), policy)
    d = state.apply(make_update("s", state.version, one(1.0), size=1, client="slow"), policy)
    assert d.alpha == pytest.approx(policy.server_lr * 2 / 2)  # 21/(2·1) capped at K = 2


# ------------------------------------------------------------------------------------ mode changes
def test_leaving_memory_steps_its_pending_updates_and_empties_it() -> None:
    state = make_state(size=1)
    state.apply(make_update("a", 0, one(2.0), size=1, client="a"), memory(buffer_size=2))
    assert (state.version, state.memory.pending) == (0, 1)
    fedasync = Policy(alpha0=0.5, tau_max=100)
    d = state.apply(make_update("b", 0, one(2.0), size=1, client="b"), fedasync)
    # memory step 0 + 2 = 2, then the mix 0.5·2 + 0.5·2: one new version
    assert d.server_step
    assert state.version == 1
    assert state.weights_view()[0] == 2.0
    assert state.memory.weight == 0
    assert all(e.delta is None for _, e in state.clients.items())
    assert state.counters["server_steps"] == 2


def test_entering_memory_steps_a_leftover_fedbuff_buffer_first() -> None:
    state = make_state(size=1)
    buff = Policy.fedbuff(buffer_size=3, decay=Decay.CONSTANT, tau_max=100)
    state.apply(make_update("a", 0, one(3.0), size=1), buff)
    d = state.apply(make_update("b", 0, one(1.0), size=1, client="b"), memory(buffer_size=5))
    assert d.server_step  # the leftover step changed the model: a new version
    assert state.buffer.count == 0
    assert state.weights_view()[0] == 3.0  # the buffer's mean 3; memory waits for K = 5
    assert state.memory.pending == 1


def test_leaving_tiered_completes_partial_rounds() -> None:
    state = make_state(size=1)
    state.apply(make_update("a", 0, one(4.0), size=1, client="a"), tiered(buffer_size=3))
    assert state.version == 0
    d = state.apply(make_update("b", 0, one(4.0), size=1, client="b"), Policy(tau_max=100))
    assert d.server_step
    assert state.tiers == []
    assert state.weights_view()[0] == np.float32(4.0)


# ------------------------------------------------------------------------------------ checkpoints
@pytest.mark.parametrize("mode", [Mode.MEMORY, Mode.TIERED, Mode.FEDBUFF_FAIR])
def test_each_mode_round_trips_with_its_memory_kept_elsewhere(mode: Mode) -> None:
    policy = Policy.configured({"mode": mode, "buffer_size": 3, "tiers": 2, "tau_max": 50})
    state = make_state(size=3)
    rng = np.random.default_rng(3)
    for i in range(11):
        base = max(0, state.version - int(rng.integers(0, 3)))
        value = rng.standard_normal(3).astype(np.float32)
        state.apply(make_update(f"u{i}", base, value, size=3, client=f"c{i % 4}"), policy)
    deltas = {c: e.delta.tobytes() for c, e in state.clients.items() if e.delta is not None}
    assert bool(deltas) == (mode is Mode.MEMORY)
    raw = save_state(state, include_weights=False, include_memory=False)
    again = load_state(raw, state.weights_view(), memory_deltas=deltas)
    assert save_state(again) == save_state(state)
    assert again.clients.deltas == state.clients.deltas == len(deltas)
    follow = make_update("next", state.version, np.ones(3, np.float32), size=3, client="c1")
    assert again.apply(follow, policy) == state.apply(follow, policy)
    assert again.weights_view().tobytes() == state.weights_view().tobytes()
    if deltas:
        with pytest.raises(CheckpointError, match="remembered delta"):
            load_state(raw, state.weights_view(), memory_deltas={})


def test_fedasync_and_fedbuff_keep_no_book() -> None:
    state: AggregationState = make_state()
    for i in range(5):
        state.apply(make_update(f"a{i}", state.version, client=f"c{i}"), Policy())
        state.apply(make_update(f"b{i}", state.version, client=f"c{i}"), Policy.fedbuff())
    assert len(state.clients) == 0
    assert state.tiers == []


def test_a_memory_delta_beyond_float32_is_rejected_and_changes_nothing() -> None:
    """Finite weights far apart: the delta exists in float64 but not in the float32 memory."""
    state = make_state(size=1, value=-3e38)
    d = state.apply(make_update("far", 0, one(3e38), size=1), memory())
    assert (d.outcome, d.reason) == (Outcome.REJECTED, "non_finite")
    assert "overflows float32" in d.detail
    assert (len(state.clients), state.memory.weight, state.memory.pending) == (0, 0, 0)
    assert (state.version, state.weights_view()[0]) == (0, np.float32(-3e38))
