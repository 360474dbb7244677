"""FedBuff (Nguyen et al. 2022): K staleness-weighted deltas buffered, then one server step."""

from __future__ import annotations

import numpy as np

from fedasync.shared import robust
from fedasync.shared.decision import Decision
from fedasync.shared.modes.base import State, Strategy, frozen
from fedasync.shared.modes.delta import DeltaStrategy, Taking
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.robust import Kept, RuleSpec
from fedasync.shared.server_optimizer import OptimizerState, server_step
from fedasync.shared.update import Update


class FedBuff(DeltaStrategy):
    """Buffer w·s(τ)·Δ with w = 1 (`weight`) and take one server step, through the server
    optimizer, once K are in: x ← opt(x, Σ w_i·s(τ_i)·Δ_i / Σ w_i).

    With differential privacy (`dp_clip`), each Δ_i is clipped to C first (`private_clip`),
    and the step adds Gaussian noise of std z·C to the sum of the K contributions before the
    server optimizer divides it: x ← opt(x, (Σ w_i·s(τ_i)·clip_C(Δ_i) + N(0, z²C²I)) / Σ w_i)
    (DP-FedBuff, as Papaya ran it). A contribution's sensitivity must stay at most C:
    s(τ) ≤ 1 keeps it so in FedBuff, and fedbuff-fair's weight w_i (up to K) may raise a slow
    client's contribution up to norm C but never beyond (`_private_scale`).

    Holds the buffer; a switch to a mode that does not buffer steps a partial buffer with the
    policy now in force. Under a robust rule (policy `robust`, shared/robust.py) the buffer also
    keeps each v_i = w·s(τ)·Δ and the step takes the rule's Δ̄ instead of the mean; a change of
    the rule (or of its parameters) mid-buffer settles the partial buffer under the rule it was
    gathered under, as a switch does, and a switch away steps it under that rule too.
    """

    mode = Mode.FEDBUFF
    holding = "buffer"

    def weight(self, state: State, update: Update, tau: int, policy: Policy) -> float:
        """w, the update's weight in the buffer: 1 in FedBuff."""
        return 1.0

    def prepare(self, state: State, taking: Taking, delta: np.ndarray) -> np.ndarray | Decision:
        return delta

    def fold(
        self,
        state: State,
        taking: Taking,
        taken: np.ndarray,
        x: np.ndarray,
        optimizer: OptimizerState,
    ) -> tuple[float, np.ndarray, OptimizerState, bool]:
        alpha = self.contribute(state, taking, taken)
        policy = taking.policy
        if state.buffer.count < policy.buffer_size:
            return alpha, x, optimizer, False
        x, optimizer = self.step(state, x, optimizer, policy)
        self.empty(state)
        state.counters["server_steps"] += 1
        return alpha, x, optimizer, True

    def contribute(self, state: State, taking: Taking, taken: np.ndarray) -> float:
        """Add w·s(τ)·Δ (`taken`: Δ, clipped) to the buffer and return α, the update's weight
        in the step: server_lr·w·s(τ)/K. Steps nothing: `fold` (here) and a tree's leaf
        (shared/tree.py, which hands its buffer to the root as a partial) share this one sum."""
        update, tau, s, _, policy, _ = taking
        weight = self.weight(state, update, tau, policy)
        buffer = state.buffer
        scale = weight * s
        if policy.private:
            scale = _private_scale(state, taking, scale)
        contribution = scale * taken
        buffer.total += contribution
        if buffer.count == 0:
            buffer.rule = RuleSpec.of(policy)
        if buffer.rule is not None:  # a robust rule (never with DP: the policy refuses both)
            buffer.kept.append(Kept(str(update.update_id), weight, frozen(contribution)))
        buffer.count += 1
        buffer.weight += weight
        return policy.server_lr * weight * s / policy.buffer_size

    def held(self, state: State, incoming: Strategy, policy: Policy) -> bool:
        buffer = state.buffer
        return buffer.count > 0 and (
            incoming.holding != self.holding or buffer.rule != RuleSpec.of(policy)
        )

    def settled(
        self, state: State, x: np.ndarray, optimizer: OptimizerState, policy: Policy
    ) -> tuple[np.ndarray, OptimizerState, int]:
        weights, optimizer = self.step(state, x, optimizer, policy)
        return frozen(weights), optimizer, 1

    def empty(self, state: State) -> None:
        buffer = state.buffer
        buffer.total[:] = 0.0
        buffer.count = 0
        buffer.weight = 0.0
        buffer.rule = None
        buffer.kept = []

    def step(
        self, state: State, x: np.ndarray, optimizer: OptimizerState, policy: Policy
    ) -> tuple[np.ndarray, OptimizerState]:
        """The server step on the buffer: its mean, or its robust rule's Δ̄ (which notes on the
        decision taking the step what it left out: `State.note_step`)."""
        buffer = state.buffer
        if buffer.rule is None:
            total = buffer.total
            if policy.private:  # Gaussian noise of std z·C on the sum of the K contributions
                total = total + state.private_step(policy, buffer.count)
            return server_step(x, total, buffer.weight, optimizer, policy)
        taken = robust.step(buffer.kept, buffer.rule)
        state.note_step(taken.excluded, taken.detail)
        return server_step(x, taken.total, taken.count, optimizer, policy)


def _private_scale(state: State, taking: Taking, scale: float) -> float:
    """w·s(τ), lowered where it would take the clipped delta's norm past C: each device's
    contribution to a step's sum has norm at most C, the sensitivity its noise is set for.
    Counts the contribution (shared/privacy/spent.py)."""
    bound = state.privacy.clip_norm(taking.policy)
    if scale * taking.delta_norm > bound:
        scale = bound / taking.delta_norm
    state.privacy.contribute(str(taking.update.client_id), bound, taking.within)
    return scale
