"""fedbuff-fair: FedBuff with each delta weighted by its client's inverse contribution rate."""

from __future__ import annotations

from fedasync.shared.modes.base import State
from fedasync.shared.modes.fedbuff import FedBuff
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.update import Update


class FedBuffFair(FedBuff):
    """FedBuff's buffer and step, with w the client's inverse contribution rate (`weight`).

    Shares FedBuff's buffer (`holding`): a switch between the two settles nothing.
    """

    mode = Mode.FEDBUFF_FAIR

    def weight(self, state: State, update: Update, tau: int, policy: Policy) -> float:
        """The client's inverse contribution rate, capped at K.

        A client that sent c_i of the C updates the book has counted, among N clients, has a
        contribution rate c_i/C; equal rates would be 1/N. Its delta is weighted by
        w_i = C / (N·c_i), so every client's deltas weigh about the same per unit of time
        whatever its speed (inverse-probability weighting), and the buffer steps with
        Σ w_i·s(τ_i)·Δ_i / Σ w_i (FedBuff's mean, Nguyen et al. 2022, with these weights).
        Capped at K, so one update never outweighs a whole buffer of others.
        """
        client = str(update.client_id)
        if client not in state.clients:
            state.make_room(policy)
        entry = state.clients.heard(
            client, samples=int(update.num_samples), seen=state.version, tau=tau
        )
        rate = state.clients.arrivals / (len(state.clients) * entry.arrivals)
        return min(rate, float(policy.buffer_size))
