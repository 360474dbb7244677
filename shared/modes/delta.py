"""What the modes that form a delta against the device's base model share (fedbuff,
fedbuff-fair, memory): the base model's history, the delta, its norm bound and its decay.

Δ_i = x_i − x_base(i), τ the server steps since that model (Nguyen et al. 2022, Algorithm 1),
weighted by s(τ) (the policy's decay) for τ_max alike. The update counts as applied when it is
taken in; its decision records the version in force, which the step then raises by one: the
updates taken in since the last step are part of that next version.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import NamedTuple

import numpy as np

from fedasync.shared.decision import Decision, DropReason, Outcome
from fedasync.shared.modes.base import Clip, State, Strategy, sum_of_squares
from fedasync.shared.policy import Policy
from fedasync.shared.privacy.clipping import clip_delta
from fedasync.shared.server_optimizer import OptimizerState
from fedasync.shared.update import Update


class Taking(NamedTuple):
    """The update a delta mode is taking in, and what it was measured with."""

    update: Update
    tau: int
    #: s(τ), the policy's decay at this τ
    s: float
    #: ‖Δ‖ after the norm bound or the DP clip (the bound when clipped)
    delta_norm: float
    policy: Policy
    #: DP: the delta was within the clip (not scaled); what the adaptive clip counts
    within: bool = True


class DeltaStrategy(Strategy):
    """A mode that takes in s(τ)·Δ: `prepare` may still refuse it, `fold` takes it in."""

    def take(
        self, state: State, update: Update, new: np.ndarray, tau: int, policy: Policy
    ) -> Decision:
        delta = delta_from_base(state, update, new, tau, policy)
        if isinstance(delta, Decision):
            return delta
        within = True
        if policy.private:  # the DP clip, to C (the poisoning bound is off with DP)
            clip = private_clip(state, policy, delta)
            within = not clip.clipped
        else:
            found = state.clip(update, policy, tau, math.sqrt(float(np.sum(delta * delta))))
            if isinstance(found, Decision):
                return found
            clip = found
            if clip.scale is not None:
                delta *= clip.scale
        s = policy.staleness(tau, state.version)
        taking = Taking(update, tau, s, clip.norm, policy, within)
        taken = self.prepare(state, taking, delta)
        if isinstance(taken, Decision):
            return taken
        # nothing below can refuse the update: the state may change from here on
        before = state.weights_view()
        settlement = state.settle(policy)
        settlement.commit()
        alpha, x, optimizer, step = self.fold(
            state, taking, taken, settlement.weights, settlement.optimizer
        )
        stepped = step or settlement.steps > 0
        norm = 0.0
        if stepped:
            state.replace_weights(x)
            state.optimizer = optimizer
            norm = math.sqrt(sum_of_squares(state.weights_view() - before))
        decision = state.advance(update, policy, tau, alpha, norm, clip, server_step=stepped)
        if stepped:
            state.history.append((state.version, state.weights_view()))
        prune_history(state, policy.tau_max)
        state.forget_idle(policy)
        return decision

    @abstractmethod
    def prepare(self, state: State, taking: Taking, delta: np.ndarray) -> np.ndarray | Decision:
        """What this mode takes in of Δ (`delta`, float64, clipped), or the decision refusing
        it. Changes nothing."""

    @abstractmethod
    def fold(
        self,
        state: State,
        taking: Taking,
        taken: np.ndarray,
        x: np.ndarray,
        optimizer: OptimizerState,
    ) -> tuple[float, np.ndarray, OptimizerState, bool]:
        """Take `taken` (what `prepare` made) into what this mode holds, and step the server
        from `x` and `optimizer` (the model once a switch is settled) when the rule says so.
        Returns α (the update's weight in a step), the weights and optimizer after it, and
        whether it stepped (counted in `state.counters`); the caller commits them."""


def delta_from_base(
    state: State, update: Update, new: np.ndarray, tau: int, policy: Policy
) -> np.ndarray | Decision:
    """Δ = x_new − x_base in float64, or the decision refusing the update: dropped when its base
    model is no longer kept, rejected when x_new is not finite. Changes nothing but the history's
    first entry (the model in force, kept from the first update on)."""
    if not state.history:
        state.history.append((state.version, state.weights_view()))
    base = base_weights(state.history, update.base_version)
    if base is None:
        return state.decide(
            update, policy, Outcome.DROPPED, tau=tau, reason=DropReason.BASE_UNAVAILABLE
        )
    if not np.isfinite(new).all():
        return state.reject_non_finite(update, policy)
    delta: np.ndarray = new.astype(np.float64) - base
    return delta


def base_weights(history: list[tuple[int, np.ndarray]], base_version: int) -> np.ndarray | None:
    """The newest model at or before `base_version` (exactly it, but for checkpoints of the
    build that numbered FedBuff versions per update), or None once it is pruned."""
    for version, weights in reversed(history):
        if version <= base_version:
            found: np.ndarray = weights
            return found
    return None


def private_clip(state: State, policy: Policy, delta: np.ndarray) -> Clip:
    """Differential privacy's clip of `delta` (float64, scaled in place) to the clip C in force
    (shared/privacy/clipping.py): the norm it counts with, and the scale when it was beyond."""
    bound = state.privacy.clip_norm(policy)
    _, norm = clip_delta(delta, bound)
    return Clip(bound, bound / norm) if norm > bound else Clip(norm)


def prune_history(state: State, tau_max: int) -> None:
    """Forget the base models no update within τ_max can name any more (the oldest kept is the
    newest at or before version − τ_max)."""
    oldest_needed = state.version - tau_max
    history = state.history
    while len(history) > 1 and history[1][0] <= oldest_needed:
        history.pop(0)
