"""Zeno++ in the core (shared/zeno.py): the score, the lazy refresh, and FedAsync's refusals."""

from __future__ import annotations

import numpy as np
import pytest

from fedasync.learning.dataset import Dataset
from fedasync.learning.linear import LinearRegression
from fedasync.learning.task import Task
from fedasync.services.aggregator.deciding import zeno_gradient_source
from fedasync.services.runtime.settings import SettingsError, TaskSettings
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import load_state, save_state
from fedasync.shared.decision import Outcome, RejectReason
from fedasync.shared.params import ParamError
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.update import Update
from fedasync.shared.zeno import ValidationGradient, due, score
from tests.unit.helpers import make_state, make_update


def test_the_score_is_the_papers_formula_on_hand_inputs() -> None:
    # v = (3, 4): ‖v‖ = 5. Δ = (0, −2): ‖Δ‖ = 2, ⟨v, Δ⟩ = −8. With γ = 0.5, ρ = 0.25:
    # g̃ = −(5/2)Δ = (0, 5), Score = γ⟨v, g̃⟩ − ρ‖g̃‖² = 0.5·20 − 0.25·25 = 3.75
    policy = Policy(zeno_margin=2.0, zeno_lr=0.5, zeno_rho=0.25)
    v = ValidationGradient.at(0, np.array([3.0, 4.0]))
    verdict = score(v, np.array([0.0, -2.0], np.float32), policy)
    assert verdict.score == 3.75
    assert verdict.threshold == -1.0  # −γε
    assert verdict.accepted


def test_the_score_depends_on_the_direction_only_and_a_reversed_update_scores_below() -> None:
    policy = Policy(zeno_margin=0.5, zeno_lr=0.5, zeno_rho=0.25)
    v = ValidationGradient.at(0, np.array([3.0, 4.0]))
    # Δ along +v (ascent): g̃ = −v, Score = −0.5·25 − 0.25·25 = −18.75, whatever |Δ|
    for size in (0.001, 1.0, 1000.0):
        verdict = score(v, np.array([3.0, 4.0]) * size, policy)
        assert verdict.score == pytest.approx(-18.75, rel=1e-12)
        assert not verdict.accepted
    assert score(v, np.zeros(2), policy).score == 0.0  # no pull: accepted


def test_the_refresh_is_due_every_zeno_every_steps_and_never_when_off() -> None:
    on = Policy(zeno_margin=0.1, zeno_every=3)
    v = ValidationGradient.at(5, np.ones(2))
    assert due(None, 5, on)
    assert [due(v, version, on) for version in (5, 6, 7, 8)] == [False, False, False, True]
    assert due(v, 4, on)  # a gradient from the future (a restored state): refreshed
    assert not due(None, 5, Policy())


def test_zeno_is_refused_outside_fedasync() -> None:
    with pytest.raises(ParamError, match="zeno_margin"):
        Policy(mode=Mode.FEDBUFF, zeno_margin=0.1)


def test_the_policy_dict_leaves_zeno_out_at_its_default_and_reads_it_back() -> None:
    assert not any(k.startswith("zeno") for k in Policy().to_dict())
    on = Policy(zeno_margin=0.1, zeno_every=4)
    assert Policy.from_dict(on.to_dict()) == on
    assert on.to_dict()["zeno_margin"] == 0.1


def _toy() -> tuple[LinearRegression, Dataset, Dataset, np.ndarray]:
    task = LinearRegression(dim=5, samples=400)
    train, test = task.dataset(np.random.default_rng(3))
    return task, train, test, task.init_weights(np.random.default_rng(0))


def test_a_sign_flipped_update_is_rejected_and_the_honest_one_applied() -> None:
    task, train, held_out, w0 = _toy()
    honest, _ = task.train(w0, train, np.random.default_rng(1), epochs=1, lr=0.05, batch_size=32)
    flipped = (w0 - (honest - w0)).astype(np.float32)
    policy = Policy(zeno_margin=0.01, tau_max=100)

    def decide(weights: np.ndarray, uid: str) -> tuple[AggregationState, Outcome, str | None]:
        state = AggregationState(w0.copy(), task.layout)
        assert state.zeno_due(policy)
        state.zeno_refresh(task.gradient(state.weights_view(), held_out))
        decision = state.apply(Update(uid, "c", 0, 10, weights), policy)
        return state, decision.outcome, decision.reason

    state, outcome, reason = decide(flipped, "bad")
    assert (outcome, reason) == (Outcome.REJECTED, RejectReason.ZENO)
    assert state.version == 0
    assert np.array_equal(state.weights_view(), w0)
    state, outcome, reason = decide(honest, "good")
    assert (outcome, reason) == (Outcome.APPLIED, None)
    assert state.version == 1


def test_the_rejection_records_the_score_and_the_gradients_version() -> None:
    state = make_state(size=2)
    policy = Policy(zeno_margin=0.5, zeno_lr=0.5, zeno_rho=0.25)
    state.zeno_refresh(np.array([3.0, 4.0]))
    decision = state.apply(make_update("u", 0, np.array([3.0, 4.0], np.float32)), policy)
    assert decision.reason == RejectReason.ZENO
    assert decision.detail == "zeno++ score -18.75 < -γε = -0.25 (validation gradient of version 0)"
    assert decision.delta_norm == 5.0
    assert decision.tau == 0


def test_without_a_validation_gradient_nothing_is_scored() -> None:
    state = make_state(size=2)
    decision = state.apply(make_update("u", 0, 1.0, size=2), Policy(zeno_margin=0.0))
    assert decision.outcome is Outcome.APPLIED


def test_a_gradient_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(ValueError, match="shape"):
        make_state(size=2).zeno_refresh(np.ones(3))


def test_a_restored_state_scores_with_the_same_gradient_as_one_never_stopped() -> None:
    task, train, held_out, w0 = _toy()
    policy = Policy(zeno_margin=0.01, zeno_every=3, tau_max=100)
    rng = np.random.default_rng(5)

    def gradient_at(weights: np.ndarray) -> np.ndarray:
        return task.gradient(weights, held_out)

    updates = []
    model = w0
    for i in range(12):
        trained, _ = task.train(model, train, rng, epochs=1, lr=0.05, batch_size=64)
        sent = trained if i % 3 else (model - (trained - model)).astype(np.float32)
        updates.append(Update(f"u{i}", f"c{i % 4}", 0, 10, sent))
        model = trained

    def run(state: AggregationState, batch: list[Update]) -> list[dict[str, object]]:
        out = []
        for update in batch:
            state.zeno_prepare(policy, gradient_at)
            out.append(state.apply(update, policy).to_dict())
        return out

    never = AggregationState(w0.copy(), task.layout)
    expected = run(never, updates)
    assert {d["reason"] for d in expected} >= {"zeno"}
    first = AggregationState(w0.copy(), task.layout)
    decided = run(first, updates[:7])
    assert first.zeno_gradient is not None
    restored = load_state(save_state(first))
    assert restored.zeno_gradient is not None
    assert restored.zeno_gradient.version == first.zeno_gradient.version
    decided += run(restored, updates[7:])
    assert decided == expected
    assert restored.weights_view().tobytes() == never.weights_view().tobytes()


def test_a_checkpoint_without_zeno_has_no_zeno_section() -> None:
    assert b"zeno" not in save_state(make_state())


class NoGradientTask(LinearRegression):
    """A task that keeps Task.gradient's default: it computes no gradient."""

    gradient = Task.gradient


def test_zeno_with_a_task_that_has_no_gradient_is_one_settings_error() -> None:
    task = TaskSettings(name="tests.unit.test_zeno:NoGradientTask")
    with pytest.raises(SettingsError, match=r"FEDASYNC_POLICY__ZENO_MARGIN.*does not compute"):
        zeno_gradient_source(task)
