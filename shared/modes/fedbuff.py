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
        update, tau, s, _, policy = taking
        weight = self.weight(state, update, tau, policy)
        buffer = state.buffer
        contribution = (weight * s) * taken if weight != 1.0 else s * taken
        buffer.total += contribution
        if buffer.count == 0:
            buffer.rule = RuleSpec.of(policy)
        if buffer.rule is not None:
            buffer.kept.append(Kept(str(update.update_id), weight, frozen(contribution)))
        buffer.count += 1
        buffer.weight += weight
        alpha = policy.server_lr * weight * s / policy.buffer_size
        if buffer.count < policy.buffer_size:
            return alpha, x, optimizer, False
        x, optimizer = self._step(state, x, optimizer, policy)
        self.empty(state)
        state.counters["server_steps"] += 1
        return alpha, x, optimizer, True

    def held(self, state: State, incoming: Strategy, policy: Policy) -> bool:
        buffer = state.buffer
        return buffer.count > 0 and (
            incoming.holding != self.holding or buffer.rule != RuleSpec.of(policy)
        )

    def settled(
        self, state: State, x: np.ndarray, optimizer: OptimizerState, policy: Policy
    ) -> tuple[np.ndarray, OptimizerState, int]:
        weights, optimizer = self._step(state, x, optimizer, policy)
        return frozen(weights), optimizer, 1

    def empty(self, state: State) -> None:
        buffer = state.buffer
        buffer.total[:] = 0.0
        buffer.count = 0
        buffer.weight = 0.0
        buffer.rule = None
        buffer.kept = []

    def _step(
        self, state: State, x: np.ndarray, optimizer: OptimizerState, policy: Policy
    ) -> tuple[np.ndarray, OptimizerState]:
        """The server step on the buffer: its mean, or its robust rule's Δ̄ (which notes on the
        decision taking the step what it left out: `State.note_step`)."""
        buffer = state.buffer
        if buffer.rule is None:
            return server_step(x, buffer.total, buffer.weight, optimizer, policy)
        taken = robust.step(buffer.kept, buffer.rule)
        state.note_step(taken.excluded, taken.detail)
        return server_step(x, taken.total, taken.count, optimizer, policy)
