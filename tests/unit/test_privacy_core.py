"""Differential privacy in the core: clipping and noise exact, the adaptive clip's tracking,
DP-FedAsync and DP-FedBuff as their formulas say, the participation cap, the privacy budget,
the checkpoint's privacy section, and the policy's refusals (shared/privacy/)."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import math

import numpy as np
import pytest

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import load_state, save_state
from fedasync.shared.decision import Decision, DropReason, Outcome
from fedasync.shared.layout import Layout
from fedasync.shared.params import ParamError
from fedasync.shared.policy import Mode, Policy, PrivacyModel
from fedasync.shared.privacy import accounting
from fedasync.shared.privacy.clipping import clip_delta, delta_noise_multiplier, next_clip
from fedasync.shared.privacy.noise import count_draw, gaussian
from fedasync.shared.privacy.spent import PrivacyError
from fedasync.shared.update import Update

SECRET = bytes(range(32))
SIZE = 6


def dp_state(size: int = SIZE, secret: bytes | None = SECRET) -> AggregationState:
    return AggregationState(np.zeros(size, np.float32), Layout.flat(size), dp_secret=secret)


def update(uid: str, base: int, weights: np.ndarray, client: str = "c0") -> Update:
    return Update(uid, client, base, 10, np.asarray(weights, np.float32))


def seeded_weights(seed: int, size: int = SIZE, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(size) * scale).astype(np.float32)


# ----------------------------------------------------------------------------- clipping
def test_clip_delta_scales_to_the_bound_exactly_and_leaves_smaller_deltas_alone() -> None:
    delta = np.array([3.0, 4.0])  # norm 5
    clipped, norm = clip_delta(delta.copy(), 2.0)
    assert norm == 5.0
    assert clipped.tolist() == [3.0 * (2.0 / 5.0), 4.0 * (2.0 / 5.0)]
    small, norm = clip_delta(np.array([0.3, 0.4]), 2.0)
    assert norm == pytest.approx(0.5)
    assert small.tolist() == [0.3, 0.4]


def test_adaptive_delta_noise_multiplier_is_theorem_1_of_andrew_et_al() -> None:
    policy = Policy(mode=Mode.FEDBUFF, buffer_size=20, dp_clip=1.0, dp_noise=1.0, dp_quantile=0.5)
    sigma_b = 20 / 20  # K/20
    assert delta_noise_multiplier(policy) == (1.0**-2 - (2 * sigma_b) ** -2) ** -0.5


def test_next_clip_is_the_geometric_update() -> None:
    policy = Policy(mode=Mode.FEDBUFF, buffer_size=10, dp_clip=1.0, dp_noise=0.5, dp_quantile=0.7)
    got = next_clip(2.0, 4, 10, 0.3, policy)
    b = (4 + 0.5 * 0.3) / 10  # σ_b = K/20 = 0.5
    assert got == 2.0 * math.exp(-0.2 * (b - 0.7))


# ----------------------------------------------------------------------------- noise
def test_noise_is_a_pcg64_keyed_by_hmac_sha256_of_the_step() -> None:
    digest = hmac.new(SECRET, b"fedasync-dp/delta/7", hashlib.sha256).digest()
    expected = np.random.Generator(np.random.PCG64(int.from_bytes(digest, "big")))
    assert np.array_equal(gaussian(SECRET, 7, 5, 2.5), expected.standard_normal(5) * 2.5)
    assert np.array_equal(gaussian(SECRET, 7, 5, 2.5), gaussian(SECRET, 7, 5, 2.5))
    assert not np.array_equal(gaussian(SECRET, 7, 5, 1.0), gaussian(SECRET, 8, 5, 1.0))
    assert not np.array_equal(gaussian(SECRET, 7, 5, 1.0), gaussian(b"other", 7, 5, 1.0))
    assert count_draw(SECRET, 7) != float(gaussian(SECRET, 7, 1, 1.0)[0])  # its own stream


def test_noise_has_the_stated_standard_deviation() -> None:
    noise = gaussian(SECRET, 1, 200_000, 3.0)
    assert abs(float(noise.std()) - 3.0) < 0.03  # 200k draws: sd of the sd ≈ 0.005


# ----------------------------------------------------------------------------- DP-FedAsync
def test_dp_fedasync_mixes_the_clipped_noised_delta_against_the_base() -> None:
    policy = Policy(dp_clip=0.5, dp_noise=1.2, alpha0=0.6)
    state = dp_state()
    first = seeded_weights(1)
    d1 = state.apply(update("u1", 0, first), policy)
    assert d1.applied
    assert d1.server_step
    assert d1.clipped
    delta = first.astype(np.float64) - 0.0
    delta *= 0.5 / math.sqrt(float(np.sum(delta * delta)))
    expected = (np.zeros(SIZE, np.float32) + 0.6 * (delta + gaussian(SECRET, 1, SIZE, 0.6))).astype(
        np.float32
    )
    assert np.array_equal(state.weights_view(), expected)
    # a stale update's delta is against its own base (version 0), not the current model
    second = seeded_weights(2, scale=0.01)
    x1 = state.weights_view().copy()
    d2 = state.apply(update("u2", 0, second, client="c1"), policy)
    alpha = policy.alpha(1, 1)
    assert d2.alpha == alpha
    assert not d2.clipped
    delta2 = second.astype(np.float64) + gaussian(SECRET, 2, SIZE, 0.6)
    assert np.array_equal(state.weights_view(), (x1 + alpha * delta2).astype(np.float32))
    assert d2.epsilon_conservative is not None
    assert d2.epsilon_sampled is None


def test_a_dp_policy_without_a_secret_is_refused_with_a_typed_error() -> None:
    with pytest.raises(PrivacyError, match="dp_secret"):
        dp_state(secret=None).apply(update("u", 0, seeded_weights(1)), Policy(dp_clip=1.0))


# ----------------------------------------------------------------------------- DP-FedBuff
def test_dp_fedbuff_noises_the_sum_of_the_k_clipped_contributions() -> None:
    policy = Policy.fedbuff(buffer_size=3, dp_clip=1.0, dp_noise=0.8)
    state = dp_state()
    total = np.zeros(SIZE)
    for i in range(3):
        new = seeded_weights(10 + i, scale=2.0)
        decision = state.apply(update(f"u{i}", 0, new, client=f"c{i}"), policy)
        delta = new.astype(np.float64)
        norm = math.sqrt(float(np.sum(delta * delta)))
        delta *= min(1.0, 1.0 / norm)
        total += policy.staleness(0, 0) * delta
        assert decision.applied
        assert decision.server_step == (i == 2)
    noised = total + gaussian(SECRET, 1, SIZE, 0.8)
    assert np.array_equal(state.weights_view(), (0.0 + noised * (1.0 / 3)).astype(np.float32))
    assert state.privacy.steps == {(1.0, 0.8): 1}
    assert state.privacy.most == 1


def test_dp_fedbuff_fair_keeps_each_contribution_within_the_clip() -> None:
    """A slow client's fair weight (up to K) raises its contribution only up to norm C."""
    policy = Policy.configured(
        {"mode": Mode.FEDBUFF_FAIR, "buffer_size": 5, "dp_clip": 1.0, "dp_noise": 0.5}
    )
    state = dp_state()
    taken = []
    for i, client in enumerate(["fast", "fast", "fast", "slow"]):
        state.apply(update(f"u{i}", 0, seeded_weights(20 + i, scale=3.0), client=client), policy)
        taken.append(state.buffer.total.copy())
    contributions = [taken[0], *(b - a for a, b in itertools.pairwise(taken))]
    for c in contributions[:3]:
        assert math.sqrt(float(np.sum(c * c))) <= 1.0 + 1e-12
    slow = contributions[3]
    assert math.sqrt(float(np.sum(slow * slow))) == pytest.approx(1.0)  # w = 2, capped at C


# ----------------------------------------------------------------------------- adaptive clip
def test_the_adaptive_clip_tracks_the_target_quantile_of_a_stationary_norm_distribution() -> None:
    """Norms log-normal around e⁰ = 1 (σ = 0.5): the 0.8-quantile is exp(0.5·0.8416) ≈ 1.522.
    After 300 server steps of K = 40 the clip sits within 5% of it, averaged over the last 100."""
    k = 40
    policy = Policy.configured(
        {
            "mode": Mode.FEDBUFF,
            "buffer_size": k,
            "dp_clip": 0.1,
            "dp_noise": 0.5,
            "dp_quantile": 0.8,
            "tau_max": 1000,
        }
    )
    rng = np.random.default_rng(7)
    state = dp_state(size=2)
    clips = []
    for i in range(300 * k):
        norm = math.exp(0.5 * rng.standard_normal())
        direction = rng.standard_normal(2)
        delta = direction / np.linalg.norm(direction) * norm
        base = state.version
        weights = (state.weights_view().astype(np.float64) + delta).astype(np.float32)
        state.apply(update(f"u{i}", base, weights, client=f"c{i}"), policy)
        if state.buffer.count == 0:
            clips.append(state.privacy.clip_norm(policy))
    target = math.exp(0.5 * 0.8416212)
    tracked = float(np.mean(clips[-100:]))
    assert abs(tracked - target) / target < 0.05, (tracked, target)


def test_each_decision_records_the_adaptive_clip_in_force_after_it() -> None:
    """The ledger's `adaptive_clip`: what the state clips to after the decision, moved at each
    server step; absent with a fixed clip and without DP, whose records are unchanged."""
    policy = Policy.configured(
        {"mode": Mode.FEDBUFF, "buffer_size": 3, "dp_clip": 0.5, "dp_quantile": 0.5}
        | {"dp_noise": 0.1, "dp_participation": 10}
    )
    state = dp_state()
    recorded = []
    for i in range(6):  # two server steps
        decision = state.apply(update(f"u{i}", state.version, seeded_weights(i)), policy)
        assert decision.adaptive_clip == state.privacy.clip_norm(policy)
        recorded.append(decision.to_dict()["adaptive_clip"])
    assert recorded[:2] == [0.5, 0.5]  # before the first step: the configured C
    assert len({recorded[2], recorded[5], 0.5}) == 3  # each step moved it
    fixed = dp_state().apply(update("f", 0, seeded_weights(0)), Policy(dp_clip=0.5))
    plain = dp_state().apply(update("p", 0, seeded_weights(0)), Policy())
    assert "adaptive_clip" not in fixed.to_dict()
    assert "adaptive_clip" not in plain.to_dict()


# ----------------------------------------------------------------------------- cap and budget
def test_updates_past_the_participation_cap_are_dropped_with_their_reason() -> None:
    policy = Policy(dp_clip=1.0, dp_participation=2)
    state = dp_state()
    outcomes = [
        state.apply(update(f"u{i}", state.version, seeded_weights(i)), policy) for i in range(4)
    ]
    assert [d.outcome for d in outcomes] == [Outcome.APPLIED] * 2 + [Outcome.DROPPED] * 2
    assert {d.reason for d in outcomes[2:]} == {DropReason.PARTICIPATION_CAP.value}
    other = state.apply(update("v", state.version, seeded_weights(9), client="c1"), policy)
    assert other.applied
    # conservative ε: Gaussian(z) composed twice, the most any device contributed
    assert other.epsilon_conservative == accounting.rdp_epsilon(((1.0, 1.0, 2),), 1e-5)


def test_the_privacy_budget_closes_training_before_the_step_that_would_pass_it() -> None:
    budget = 3.0
    policy = Policy(dp_clip=1.0, dp_noise=2.0, privacy_budget=budget)
    state = dp_state()
    decisions: list[Decision] = []
    for i in range(200):
        decisions.append(state.apply(update(f"u{i}", state.version, seeded_weights(i)), policy))
        if state.closed:
            break
    assert state.closed == "privacy_budget"
    applied = [d for d in decisions if d.applied]
    assert applied[-1].epsilon_conservative is not None
    assert applied[-1].epsilon_conservative <= budget
    # one more contribution of the same device would have passed it
    n = len(applied)
    assert accounting.rdp_epsilon(((1.0, 2.0, n + 1),), 1e-5) > budget
    closing = decisions[-1]
    assert closing.outcome is Outcome.DROPPED
    assert closing.detail == "privacy_budget"
    # and it stays closed across a checkpoint, like max_updates
    restored = load_state(save_state(state), dp_secret=SECRET)
    later = restored.apply(update("late", restored.version, seeded_weights(1), "c9"), policy)
    assert later.reason == DropReason.CLOSED.value
    assert later.detail == "privacy_budget"


def test_the_sampled_budget_counts_server_steps_with_amplification() -> None:
    policy = Policy.fedbuff(
        buffer_size=5,
        dp_clip=1.0,
        dp_noise=1.0,
        dp_population=100,
        privacy_model=PrivacyModel.SAMPLED,
        privacy_budget=4.0,
        tau_max=1000,
    )
    state = dp_state()
    for i in range(10_000):
        decision = state.apply(update(f"u{i}", state.version, seeded_weights(i), f"c{i}"), policy)
        if state.closed:
            break
    steps = state.privacy.steps[(0.05, 1.0)]
    assert state.closed == "privacy_budget"
    assert decision.detail == "privacy_budget"
    assert accounting.rdp_epsilon(((0.05, 1.0, steps),), 1e-5) <= 4.0
    assert accounting.rdp_epsilon(((0.05, 1.0, steps + 1),), 1e-5) > 4.0
    assert state.buffer.count == 4  # closed before the 5th update that would have stepped


# ----------------------------------------------------------------------------- checkpoint
def test_the_privacy_state_round_trips_and_the_restored_state_decides_identically() -> None:
    policy = Policy.configured(
        {
            "mode": Mode.FEDBUFF,
            "buffer_size": 3,
            "dp_clip": 0.5,
            "dp_noise": 0.1,
            "dp_quantile": 0.5,
            "dp_participation": 5,
        }
    )
    state = dp_state()
    for i in range(7):  # two steps and one update buffered
        state.apply(update(f"u{i}", state.version, seeded_weights(i), f"c{i % 2}"), policy)
    raw = save_state(state)
    restored = load_state(raw, dp_secret=SECRET)
    assert save_state(restored) == raw
    assert restored.privacy.to_dict() == state.privacy.to_dict()
    for i in range(7, 12):
        a = state.apply(update(f"u{i}", state.version, seeded_weights(i), f"c{i % 2}"), policy)
        b = restored.apply(
            update(f"u{i}", restored.version, seeded_weights(i), f"c{i % 2}"), policy
        )
        assert a == b
    assert np.array_equal(state.weights_view(), restored.weights_view())


def test_a_state_without_dp_writes_the_checkpoint_format_it_always_has() -> None:
    from fedasync.shared.wire import unpack

    state = dp_state(secret=None)
    state.apply(update("u", 0, seeded_weights(1)), Policy())
    raw = save_state(state)
    data = unpack(raw, max_bytes=len(raw))
    assert data["format"] == 3
    assert "privacy" not in data


# ----------------------------------------------------------------------------- the policy
def test_dp_fields_are_left_out_of_the_policy_and_decision_records_at_their_default() -> None:
    assert not any(k.startswith(("dp_", "privacy_")) for k in Policy().to_dict())
    assert Policy.from_dict(Policy().to_dict()) == Policy()
    private = Policy(dp_clip=1.0, privacy_budget=2.0)
    assert Policy.from_dict(private.to_dict()) == private
    decision = dp_state(secret=None).apply(update("u", 0, seeded_weights(1)), Policy())
    assert "epsilon_sampled" not in decision.to_dict()
    assert Decision.from_dict(decision.to_dict()) == decision


@pytest.mark.parametrize("mode", [Mode.MEMORY, Mode.TIERED])
def test_dp_is_refused_in_the_modes_that_reuse_deltas(mode: Mode) -> None:
    with pytest.raises(ParamError, match="differential privacy applies to modes"):
        Policy.configured({"mode": mode, "dp_clip": 1.0})


def test_the_sampled_model_needs_a_population() -> None:
    with pytest.raises(ParamError, match="dp_population"):
        Policy(dp_clip=1.0, privacy_model=PrivacyModel.SAMPLED)


def test_adaptive_clipping_needs_a_count_noise_the_delta_noise_can_be_raised_for() -> None:
    with pytest.raises(ParamError, match="2·σ_b"):
        Policy(dp_clip=1.0, dp_quantile=0.5)  # FedAsync: σ_b = 1/20, z = 1 ≥ 0.1


def test_a_privacy_budget_may_be_lowered_never_raised_or_unset() -> None:
    policy = Policy(dp_clip=1.0, privacy_budget=4.0)
    assert policy.evolve(privacy_budget=3.0).privacy_budget == 3.0
    for value in (5.0, None):
        with pytest.raises(ParamError, match="never raised"):
            policy.evolve(privacy_budget=value)


def test_dp_cannot_be_turned_on_or_off_or_change_mode_during_a_run() -> None:
    with pytest.raises(ParamError, match="before a run"):
        Policy().evolve(dp_clip=1.0)
    with pytest.raises(ParamError, match="turned off"):
        Policy(dp_clip=1.0).evolve(dp_clip=None)
    with pytest.raises(ParamError, match="fixed during a run"):
        Policy(dp_clip=1.0).evolve(mode=Mode.FEDBUFF)


def test_a_privacy_budget_without_dp_is_refused() -> None:
    with pytest.raises(ParamError, match="privacy_budget"):
        Policy(privacy_budget=3.0)


def test_dp_fedavg_is_the_fixed_denominator_mean_of_clipped_deltas_plus_noise() -> None:
    from fedasync.shared.fedavg import dp_fedavg

    base = seeded_weights(40)
    models = [seeded_weights(41 + i, scale=2.0) for i in range(3)]
    noise = gaussian(SECRET, 1, SIZE, 0.7)
    total = np.zeros(SIZE)
    for model in models:
        delta = model.astype(np.float64) - base
        norm = math.sqrt(float(np.sum(delta * delta)))
        total += delta * min(1.0, 1.0 / norm)
    expected = (base.astype(np.float64) + (total + noise) / 5).astype(np.float32)
    assert np.array_equal(dp_fedavg(base, models, 5, 1.0, noise), expected)


def test_the_noise_is_the_same_bits_in_another_process() -> None:
    import subprocess
    import sys

    code = (
        "from fedasync.shared.privacy.noise import gaussian;"
        "print(gaussian(bytes(range(32)), 3, 8, 1.5).tobytes().hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == gaussian(SECRET, 3, 8, 1.5).tobytes().hex()
