"""Memory mode (MIFA, Gu et al. 2021): every client's latest delta stands in for it."""

from __future__ import annotations

import numpy as np

from fedasync.shared.clients import ClientEntry
from fedasync.shared.decision import Decision, Outcome, RejectReason
from fedasync.shared.modes.base import State, Strategy, frozen
from fedasync.shared.modes.delta import DeltaStrategy, Taking
from fedasync.shared.modes.holdings import Memory
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.server_optimizer import OptimizerState, server_step


class MemoryMode(DeltaStrategy):
    """The client's delta replaces the one remembered for it; every K updates a server step
    with the average over every client's latest.

    MIFA (Gu et al. 2021, "Fast Federated Learning in the Presence of Arbitrary Device
    Unavailability", Algorithm 1) keeps G_i, the latest update of every device i, and steps
    w ← w − η·(1/N)·Σ_i G_i, whether or not device i took part in this round; an absent
    device's memorised update stands in for it until it sends a new one. Here G_i is the
    client's latest s(τ_i)·Δ_i (float32, m_i), the average is weighted by sample count
    (p_i = n_i / Σ n, the weights FedAvg uses), and a "round" is K applied updates:

        m_i ← s(τ_i)·Δ_i;   every K updates:  x ← x + η·(Σ_i n_i·m_i) / (Σ_i n_i)

    over every client the book holds, with the server optimizer as in FedBuff. FedVARP
    (Jhunjhunwala et al. 2022) keeps the same per-client memory y_i and steps with
    ȳ + mean_S(Δ_i − y_i); with one update at a time that correction is the newest delta
    at full weight, which is FedAsync's forgetting again, so it is not this rule.
    S and W are running sums: a replaced or forgotten delta is subtracted, never summed
    anew, so a step costs one pass over the parameters whatever the number of clients.

    Holds the memory (and the book's deltas); a switch away steps the updates remembered
    since the last step, then forgets every delta.
    """

    mode = Mode.MEMORY
    holding = "memory"

    def prepare(self, state: State, taking: Taking, delta: np.ndarray) -> np.ndarray | Decision:
        """m_i = s(τ)·Δ as float32, refused when it does not fit."""
        with np.errstate(over="ignore"):
            remembered = frozen((taking.s * delta).astype(np.float32))
        if not np.isfinite(remembered).all():  # finite weights, a delta beyond float32
            return state.decide(
                taking.update,
                taking.policy,
                Outcome.REJECTED,
                tau=taking.tau,
                delta_norm=taking.delta_norm,
                reason=RejectReason.NON_FINITE,
                detail="its delta overflows float32 (the memory keeps float32)",
            )
        return remembered

    def fold(
        self,
        state: State,
        taking: Taking,
        taken: np.ndarray,
        x: np.ndarray,
        optimizer: OptimizerState,
    ) -> tuple[float, np.ndarray, OptimizerState, bool]:
        """Returns α, the update's weight in each step it takes part in: η·s(τ)·n_i/W."""
        update, tau, s, policy = taking.update, taking.tau, taking.s, taking.policy
        client = str(update.client_id)
        memory = state.memory
        entry = state.clients.get(client)
        if entry is not None and entry.delta is not None:
            forget_delta(memory, entry)
        elif entry is None:
            state.make_room(policy)
        samples = int(update.num_samples)
        state.clients.heard(client, samples=samples, seen=state.version, tau=tau)
        state.clients.set_delta(client, taken)
        memory.total += taken.astype(np.float64) * samples
        memory.weight += samples
        memory.pending += 1
        alpha = policy.server_lr * s * samples / memory.weight
        step = False
        if memory.pending >= policy.buffer_size:
            memory.pending = 0
            if memory.weight > 0:  # 0 once every remembered client was forgotten
                x, optimizer = server_step(x, memory.total, memory.weight, optimizer, policy)
                step = True
        if step:
            state.counters["server_steps"] += 1
        return alpha, x, optimizer, step

    def held(self, state: State, incoming: Strategy, policy: Policy) -> bool:
        return state.memory.weight > 0 and incoming.holding != self.holding

    def settled(
        self, state: State, x: np.ndarray, optimizer: OptimizerState, policy: Policy
    ) -> tuple[np.ndarray, OptimizerState, int]:
        memory = state.memory
        if memory.pending == 0:  # stepped already: forgetting the memory changes no weight
            return x, optimizer, 0
        weights, optimizer = server_step(x, memory.total, memory.weight, optimizer, policy)
        return frozen(weights), optimizer, 1

    def empty(self, state: State) -> None:
        for client, entry in state.clients.items():
            if entry.delta is not None:
                state.clients.set_delta(client, None)
        memory = state.memory
        memory.total[:] = 0.0
        memory.weight = memory.pending = 0


def forget_delta(memory: Memory, entry: ClientEntry) -> None:
    """Take a remembered delta (replaced, or its client forgotten) out of S and W."""
    assert entry.delta is not None
    memory.total -= entry.delta.astype(np.float64) * entry.samples
    memory.weight -= entry.samples
