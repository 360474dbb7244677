"""Tiered mode, in the spirit of FedAT (Chai et al. 2021): FedAvg within latency tiers,
asynchrony across them."""

from __future__ import annotations

import math

import numpy as np

from fedasync.shared.decision import Decision
from fedasync.shared.modes.base import State, Strategy, frozen, sum_of_squares
from fedasync.shared.modes.holdings import Tier
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.server_optimizer import OptimizerState
from fedasync.shared.update import Update


class Tiered(Strategy):
    """FedAT (Chai et al. 2021, "FedAT: a high-performance and communication-efficient
    federated learning system with asynchronous tiers").

    Clients are ranked by the τ of their latest update (server steps: their latency) into
    M equal-count tiers, fastest first (`ClientBook.tier`). Within a tier, FedAvg: a round
    takes K of the tier's updates and its model is their sample-weighted mean,
    w_m = Σ n_i·x_i / Σ n_i. Across tiers, asynchrony: whenever a tier completes a round,
    the global model becomes FedAT's weighted average of every tier's latest model, with
    the slower tiers weighted up by the round counts T_m taken in mirror order,

        x ← x + η·(Σ_m ω_m·w_m − x),   ω_m = (T_{M−1−m} + 1) / Σ_j (T_{M−1−j} + 1)

    (FedAT's ω_m = T_{M+1−m}/T, tiers numbered from 1; the + 1 keeps a tier whose mirror has
    not finished a round yet from weighing nothing), over the tiers that have a model. A
    tier's latest model stays in the average until its next round replaces it: the memory
    is per tier, not per client. No delta is formed, so no base model is needed; the
    poisoning bound measures ‖x_new − x‖ as FedAsync does.

    Holds the tiers; a switch away, or to another number of tiers, completes the partial
    rounds, averages the tiers once more, then empties them.
    """

    mode = Mode.TIERED
    holding = "tiers"

    def take(
        self, state: State, update: Update, new: np.ndarray, tau: int, policy: Policy
    ) -> Decision:
        if not np.isfinite(new).all():
            return state.reject_non_finite(update, policy)
        x = state.weights_view()
        pull = new.astype(np.float64) - x
        clip = state.clip(update, policy, tau, math.sqrt(float(np.sum(pull * pull))))
        if isinstance(clip, Decision):
            return clip
        taken = new.astype(np.float64) if clip.scale is None else x + pull * clip.scale
        settlement = state.settle(policy)
        settlement.commit()
        x = settlement.weights
        if not state.tiers:
            state.tiers = [
                Tier(np.zeros(state.layout.size, dtype=np.float64)) for _ in range(policy.tiers)
            ]
        client = str(update.client_id)
        if client not in state.clients:
            state.make_room(policy)
        samples = int(update.num_samples)
        state.clients.heard(client, samples=samples, seen=state.version, tau=tau)
        index = state.clients.tier(client, policy.tiers)
        tier = state.tiers[index]
        tier.total += taken * samples
        tier.weight += samples
        tier.count += 1
        alpha = policy.server_lr * _tier_weights(state.tiers, tier)[index] * samples / tier.weight
        step = tier.count >= policy.buffer_size
        if step:
            _finish_round(tier)
            x = _tier_average(state.tiers, x, policy)
            state.counters["server_steps"] += 1
        stepped = step or settlement.steps > 0
        norm = 0.0
        if stepped:
            before = state.weights_view()
            state.replace_weights(x)
            norm = math.sqrt(sum_of_squares(state.weights_view() - before))
            state.history.clear()
        decision = state.advance(update, policy, tau, alpha, norm, clip, server_step=stepped)
        state.forget_idle(policy)
        return decision

    def held(self, state: State, incoming: Strategy, policy: Policy) -> bool:
        return bool(state.tiers) and (
            incoming.holding != self.holding or len(state.tiers) != policy.tiers
        )

    def settled(
        self, state: State, x: np.ndarray, optimizer: OptimizerState, policy: Policy
    ) -> tuple[np.ndarray, OptimizerState, int]:
        if not any(tier.count > 0 for tier in state.tiers):
            return x, optimizer, 0
        rounds = [_copy_tier(tier) for tier in state.tiers]
        for tier in rounds:
            if tier.count > 0:
                _finish_round(tier)
        return frozen(_tier_average(rounds, x, policy)), optimizer, 1

    def empty(self, state: State) -> None:
        state.tiers = []


def _tier_average(tiers: list[Tier], x: np.ndarray, policy: Policy) -> np.ndarray:
    """x + η·(Σ_m ω_m·w_m − x) over the tiers with a model."""
    weights = _tier_weights(tiers)
    average = np.zeros(x.size, dtype=np.float64)
    for omega, tier in zip(weights, tiers, strict=True):
        if tier.model is not None:
            average += omega * tier.model.astype(np.float64)
    start = x.astype(np.float64)
    moved: np.ndarray = (start + policy.server_lr * (average - start)).astype(np.float32)
    return moved


def _tier_weights(tiers: list[Tier], including: Tier | None = None) -> list[float]:
    """FedAT's ω_m with add-one counts over the tiers that have a model (or are `including`,
    the tier of the update being decided); 0 for the others."""
    count = len(tiers)
    raw = [
        float(tiers[count - 1 - m].rounds + 1)
        if tier.model is not None or tier is including
        else 0.0
        for m, tier in enumerate(tiers)
    ]
    total = sum(raw)
    return [w / total for w in raw] if total else raw


def _finish_round(tier: Tier) -> None:
    """A tier's round is complete: its model is the sample-weighted mean of the round."""
    tier.model = frozen((tier.total / tier.weight).astype(np.float32))
    tier.rounds += 1
    tier.total[:] = 0.0
    tier.weight = tier.count = 0


def _copy_tier(tier: Tier) -> Tier:
    return Tier(tier.total.copy(), tier.weight, tier.count, tier.rounds, tier.model)
