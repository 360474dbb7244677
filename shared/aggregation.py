"""The aggregation state machine: one update in, one decision out, strictly one at a time.

This is the only implementation of FedAsync mixing, FedBuff buffering, stale dropping and dedup.
The aggregator service, the simulator and `ledger verify` all drive this class, so a setting tuned
in simulation decides exactly as it will in production. No I/O, no clock, no randomness: the same
initial state and the same updates give bit-identical weights and decisions in any process.

The model version counts server steps, the moments the weights change: in FedAsync every applied
update is one (Xie et al. 2019), in FedBuff one step takes K buffered updates (Nguyen et al. 2022).
So τ = version − base version counts server steps in every mode, as both papers (and FLSim) count
it, and every version number names exactly one model.

Five modes (`Policy.mode`), each one rule, with the formula it implements in its method's
docstring: `fedasync` (`_mix`), `fedbuff` and `fedbuff-fair` (`_buffer`, `_fair_weight`),
`memory` (`_remember`, stepped in `_buffer`) and `tiered` (`_tiered`). The last three keep
something per client between its updates (shared/clients.py), so that a slow client's data is
not forgotten between its rare updates (docs/experiments.md, "rare-class-fair").

A mode may change at runtime. What the previous mode left pending is then applied first, as part
of the first update the new mode applies (`_settled`): a partial FedBuff buffer is stepped, the
memory's updates since its last step are stepped and the memory emptied, partial tier rounds are
completed and the tiers averaged, then emptied. That update's decision is a server step whenever
the settling changed the weights, so a version still names exactly one model.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from fedasync.shared.clients import ClientBook
from fedasync.shared.decision import Decision, DropReason, Outcome, RejectReason
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.half import to_float32
from fedasync.shared.layout import Layout
from fedasync.shared.params import NORM_MIN_HISTORY, NORM_WINDOW_LIMIT
from fedasync.shared.policy import Mode, NormAction, Policy
from fedasync.shared.server_optimizer import OptimizerState, server_step
from fedasync.shared.update import MAX_ID_LENGTH, Update
from fedasync.shared.validation import NON_FINITE_DETAIL, is_count, update_problem


@dataclass(frozen=True, slots=True, eq=False)
class ModelSnapshot:
    """A version and a private copy of its weights: what a device may train from."""

    version: int
    weights: np.ndarray
    layout: Layout


#: the modes whose updates go through the FedBuff buffer
_BUFFERED = (Mode.FEDBUFF, Mode.FEDBUFF_FAIR)


@dataclass(slots=True)
class FedBuffBuffer:
    """Σ w_i·s(τ_i)·Δ_i over the updates buffered since the last server step, in float64, and
    Σ w_i (K in FedBuff, where every w_i is 1; the inverse-rate weights in fedbuff-fair)."""

    total: np.ndarray
    count: int = 0
    weight: float = 0.0


@dataclass(slots=True)
class Memory:
    """Memory mode: S = Σ n_i·m_i over the deltas the client book holds (float64), W = Σ n_i,
    and the updates remembered since the last server step."""

    total: np.ndarray
    weight: int = 0
    pending: int = 0


@dataclass(slots=True, eq=False)
class Tier:
    """Tiered mode: one latency tier's round in progress and its latest completed model."""

    #: Σ n_i·x_i over the round's updates so far, float64
    total: np.ndarray
    #: Σ n_i over them
    weight: int = 0
    #: updates in the round so far (a round completes at K)
    count: int = 0
    #: rounds completed (FedAT's T_m)
    rounds: int = 0
    #: the model of its latest completed round, float32; None before its first
    model: np.ndarray | None = None


class AggregationState:
    """Model version, weights, dedup memory, FedBuff buffer, history and server optimizer, the
    client book, memory and tiers, and decision counters."""

    def __init__(
        self,
        weights: np.ndarray,
        layout: Layout,
        *,
        version: int = 0,
        dedup: DedupMemory | None = None,
    ) -> None:
        weights = np.asarray(weights)
        if weights.dtype != np.float32 or weights.ndim != 1 or weights.size != layout.size:
            raise ValueError(
                f"initial weights must be float32 of shape ({layout.size},), "
                f"got {weights.dtype} {weights.shape}"
            )
        if not np.isfinite(weights).all():
            raise ValueError("initial weights must be finite")
        self.layout = layout
        #: the layout's size, summed once: every update's shape is checked against it
        self._size = layout.size
        self.version = version
        self.dedup = dedup if dedup is not None else DedupMemory()
        self.counters: dict[str, int] = {o.value: 0 for o in Outcome} | {"server_steps": 0}
        self.buffer = FedBuffBuffer(np.zeros(layout.size, dtype=np.float64))
        #: FedBuff's server optimizer (momentum, Adam moments), stepped with the buffer
        self.optimizer = OptimizerState()
        #: FedBuff only: (version, weights) of the models a base version may still name, oldest
        #: first (the lookup also takes the newest model at or before a version, which matters
        #: only for checkpoints of the build that numbered FedBuff versions per update)
        self.history: list[tuple[int, np.ndarray]] = []
        #: why training ended (e.g. "max_updates"), or None while it runs
        self.closed: str | None = None
        #: delta norms of the last applied updates (after clipping), newest last; kept whether or
        #: not a bound is on, so turning one on at runtime finds a history ready
        self.norms: deque[float] = deque(maxlen=NORM_WINDOW_LIMIT)
        #: memory, tiered and fedbuff-fair: what the server remembers per client
        self.clients = ClientBook()
        #: memory mode: the running sum of the book's deltas
        self.memory = Memory(np.zeros(layout.size, dtype=np.float64))
        #: tiered mode: one entry per tier, fastest first; empty outside tiered mode
        self.tiers: list[Tier] = []
        self._weights = _frozen(weights.copy())
        self._scratch_buffer: np.ndarray | None = None

    # ----------------------------------------------------------------------------- reading
    @property
    def applied(self) -> int:
        """Updates applied so far: what a budget of updates counts (in FedBuff, K per version)."""
        return self.counters[Outcome.APPLIED.value]

    def snapshot(self) -> ModelSnapshot:
        """The current model as a copy: a device must never hold a reference to server memory."""
        return ModelSnapshot(self.version, self._weights.copy(), self.layout)

    def weights_view(self) -> np.ndarray:
        """Read-only view of the current weights, for code that only reads (evaluation, commit).

        Weights are replaced, never written in place, so the view stays the model of this version.
        """
        return self._weights

    # ----------------------------------------------------------------------------- deciding
    def close(self, reason: str) -> None:
        """End training: every later update is decided as dropped (closed), none applied.

        A budget ends training between two updates; closing is part of the state, so a restored
        aggregator and a ledger replay agree on where it happened.
        """
        if self.closed is None:
            self.closed = reason

    def drops_unread(self, base_version: int, policy: Policy) -> bool:
        """True when an update trained from `base_version`, decided now under `policy`, is
        certain to be decided without `apply` reading its weights' values.

        Either its base is below the dedup floor or τ = version − base is stale; `apply` checks
        both (with the id, closing and dtype/shape checks that may come first, none of which
        reads a value) before it looks at the weights. A caller that knows this can skip the
        work of producing the weights: the simulator does not train an update the core drops
        for staleness, and decides it with the same outcome, τ and counters. False says
        nothing: such an update may still be dropped, rejected or applied.
        """
        return base_version < self.dedup.floor or policy.is_stale(self.version - base_version)

    def apply(self, update: Update, policy: Policy) -> Decision:
        """Decide one update under `policy` and, if accepted, fold it into the model."""
        if not _valid_id(update.update_id) or not _valid_id(update.client_id):
            return self._decide(
                update,
                policy,
                Outcome.REJECTED,
                reason=RejectReason.BAD_ID,
                detail=f"update_id and client_id must be 1..{MAX_ID_LENGTH} characters",
            )
        if update.update_id in self.dedup:
            return self._decide(update, policy, Outcome.DUPLICATE)
        if self.closed is not None:
            self.dedup.remember(update.update_id, self.version)
            return self._decide(
                update, policy, Outcome.DROPPED, reason=DropReason.CLOSED, detail=self.closed
            )
        base_ok = is_count(update.base_version)
        if base_ok and update.base_version < self.dedup.floor:
            return self._decide(
                update,
                policy,
                Outcome.DROPPED,
                tau=self.version - update.base_version,
                reason=DropReason.BEYOND_DEDUP_HORIZON,
            )

        key = min(update.base_version, self.version) if base_ok else self.version
        self.dedup.remember(update.update_id, key)
        problem = update_problem(update, self.version, self._size)
        if problem is not None:
            reason, detail = problem
            return self._decide(update, policy, Outcome.REJECTED, reason=reason, detail=detail)

        tau = self.version - update.base_version
        if policy.is_stale(tau):
            return self._decide(update, policy, Outcome.DROPPED, tau=tau, reason=DropReason.STALE)

        new = to_float32(update.weights)
        if policy.mode is Mode.FEDASYNC:
            return self._mix(update, new, tau, policy)
        if policy.mode is Mode.TIERED:
            return self._tiered(update, new, tau, policy)
        return self._buffer(update, new, tau, policy)

    def _reject_non_finite(self, update: Update, policy: Policy) -> Decision:
        return self._decide(
            update,
            policy,
            Outcome.REJECTED,
            reason=RejectReason.NON_FINITE,
            detail=NON_FINITE_DETAIL,
        )

    def _mix(self, update: Update, new: np.ndarray, tau: int, policy: Policy) -> Decision:
        """x ← (1 − α)·x + α·x_new, with α = α0·s(τ) computed afresh.

        Evaluated as x + α·(x_new − x): the same rule with one rounding fewer, and the delta
        x_new − x is at hand for its norm. NaN or Inf in x_new shows up in that norm, so
        finiteness costs no pass of its own; nothing is committed until it is known.
        """
        x = self._weights
        flushed_optimizer = self.optimizer
        flush = self._settles(policy)
        if flush:  # leftovers of another mode are applied first, never lost
            if not np.isfinite(new).all():
                return self._reject_non_finite(update, policy)
            x, flushed_optimizer, settled = self._settled(policy)
        alpha = policy.alpha(tau, self.version)
        exact: np.ndarray | None = None
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected just below
            step = np.subtract(new, x, out=self._scratch())
            mixed = step * np.float32(alpha)
            mixed += x
            squares = _sum_of_squares(step)
        if not math.isfinite(squares):
            if not np.isfinite(new).all():
                return self._reject_non_finite(update, policy)
            # finite weights so far apart that their float32 difference overflowed: use float64
            exact = new.astype(np.float64) - x
            squares = float(np.sum(exact * exact))
            mixed = (x + alpha * exact).astype(np.float32)
        delta = math.sqrt(squares)
        bound = self.norm_bound(policy)
        clipped = bound is not None and delta > bound
        if bound is not None and clipped:
            if policy.norm_action is NormAction.REJECT:
                return self._reject_norm(update, policy, tau, delta, bound)
            scale = alpha * (bound / delta)
            if exact is None:
                with np.errstate(over="ignore"):  # finite: new − x was finite above
                    mixed = np.subtract(new, x) * np.float32(scale)
                    mixed += x
            else:
                mixed = (x + scale * exact).astype(np.float32)
            delta = bound
        if flush:  # the settled weights are x, from which `mixed` was formed
            self._commit_settle(policy, flushed_optimizer, settled)
        self._weights = _frozen(mixed)
        self.history.clear()
        self.counters["server_steps"] += 1
        return self._advance(
            update, policy, tau, alpha, alpha * delta, delta, clipped, server_step=True
        )

    def _buffer(self, update: Update, new: np.ndarray, tau: int, policy: Policy) -> Decision:
        """The modes that form a delta against the model the device trained from:
        Δ_i = x_i − x_base(i), τ the server steps since that model (Nguyen et al. 2022,
        Algorithm 1), weighted by s(τ) (the policy's decay) for τ_max alike.

        fedbuff: buffer w·s(τ)·Δ with w = 1 and take one server step once K are in (FedBuff).
        fedbuff-fair: the same with w the client's inverse contribution rate (`_fair_weight`).
        memory: replace the client's delta in the memory and step every K updates with the
        average over every client's latest (`_remember`, MIFA).

        The update counts as applied when it is taken in; its decision records the version in
        force, which the step then raises by one: the updates taken in since the last step are
        part of that next version. A partial buffer is stepped when the mode changes
        (`_settled`).
        """
        if not self.history:
            self.history.append((self.version, self._weights))
        base = self._base_weights(update.base_version)
        if base is None:
            return self._decide(
                update, policy, Outcome.DROPPED, tau=tau, reason=DropReason.BASE_UNAVAILABLE
            )
        if not np.isfinite(new).all():
            return self._reject_non_finite(update, policy)
        delta = new.astype(np.float64) - base
        norm_of_delta = math.sqrt(float(np.sum(delta * delta)))
        bound = self.norm_bound(policy)
        clipped = bound is not None and norm_of_delta > bound
        if bound is not None and clipped:
            if policy.norm_action is NormAction.REJECT:
                return self._reject_norm(update, policy, tau, norm_of_delta, bound)
            delta *= bound / norm_of_delta
            norm_of_delta = bound
        s = policy.staleness(tau, self.version)
        remembered = None
        if policy.mode is Mode.MEMORY:
            with np.errstate(over="ignore"):
                remembered = _frozen((s * delta).astype(np.float32))
            if not np.isfinite(remembered).all():  # finite weights, a delta beyond float32
                return self._decide(
                    update,
                    policy,
                    Outcome.REJECTED,
                    tau=tau,
                    delta_norm=norm_of_delta,
                    reason=RejectReason.NON_FINITE,
                    detail="its delta overflows float32 (the memory keeps float32)",
                )
        # nothing below can refuse the update: the state may change from here on
        before = self._weights
        x, optimizer, settled = self._weights, self.optimizer, 0
        if self._settles(policy):
            x, optimizer, settled = self._settled(policy)
            self._commit_settle(policy, optimizer, settled)
        step = False
        if remembered is not None:
            alpha = self._remember(update, remembered, tau, s, policy)
            memory = self.memory
            if memory.pending >= policy.buffer_size:
                memory.pending = 0
                if memory.weight > 0:  # 0 once every remembered client was forgotten
                    x, optimizer = server_step(x, memory.total, memory.weight, optimizer, policy)
                    step = True
        else:
            weight = 1.0
            if policy.mode is Mode.FEDBUFF_FAIR:
                weight = self._fair_weight(update, tau, policy)
            self.buffer.total += (weight * s) * delta if weight != 1.0 else s * delta
            self.buffer.count += 1
            self.buffer.weight += weight
            alpha = policy.server_lr * weight * s / policy.buffer_size
            if self.buffer.count >= policy.buffer_size:
                x, optimizer = server_step(
                    x, self.buffer.total, self.buffer.weight, optimizer, policy
                )
                self._clear_buffer()
                step = True
        if step and policy.mode is Mode.MEMORY:
            self.counters["server_steps"] += 1
        stepped = step or settled > 0
        norm = 0.0
        if stepped:
            self._weights, self.optimizer = _frozen(x), optimizer
            norm = math.sqrt(_sum_of_squares(self._weights - before))
        decision = self._advance(
            update, policy, tau, alpha, norm, norm_of_delta, clipped, server_step=stepped
        )
        if stepped:
            self.history.append((self.version, self._weights))
        self._prune_history(policy.tau_max)
        self._forget_idle(policy)
        return decision

    def _remember(
        self, update: Update, remembered: np.ndarray, tau: int, s: float, policy: Policy
    ) -> float:
        """Memory mode: the client's delta replaces the one remembered for it.

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
        Returns α, the update's weight in each step it takes part in: η·s(τ)·n_i/W.
        `remembered` is m_i, already checked to be finite.
        """
        client = str(update.client_id)
        memory = self.memory
        entry = self.clients.get(client)
        if entry is not None and entry.delta is not None:
            memory.total -= entry.delta.astype(np.float64) * entry.samples
            memory.weight -= entry.samples
        elif entry is None:
            self._make_room(policy)
        samples = int(update.num_samples)
        self.clients.heard(client, samples=samples, seen=self.version, tau=tau)
        self.clients.set_delta(client, remembered)
        memory.total += remembered.astype(np.float64) * samples
        memory.weight += samples
        memory.pending += 1
        return policy.server_lr * s * samples / memory.weight

    def _fair_weight(self, update: Update, tau: int, policy: Policy) -> float:
        """fedbuff-fair: the client's inverse contribution rate, capped at K.

        A client that sent c_i of the C updates the book has counted, among N clients, has a
        contribution rate c_i/C; equal rates would be 1/N. Its delta is weighted by
        w_i = C / (N·c_i), so every client's deltas weigh about the same per unit of time
        whatever its speed (inverse-probability weighting), and the buffer steps with
        Σ w_i·s(τ_i)·Δ_i / Σ w_i (FedBuff's mean, Nguyen et al. 2022, with these weights).
        Capped at K, so one update never outweighs a whole buffer of others.
        """
        client = str(update.client_id)
        if client not in self.clients:
            self._make_room(policy)
        entry = self.clients.heard(
            client, samples=int(update.num_samples), seen=self.version, tau=tau
        )
        rate = self.clients.arrivals / (len(self.clients) * entry.arrivals)
        return min(rate, float(policy.buffer_size))

    def _tiered(self, update: Update, new: np.ndarray, tau: int, policy: Policy) -> Decision:
        """Tiered mode, in the spirit of FedAT (Chai et al. 2021, "FedAT: a high-performance
        and communication-efficient federated learning system with asynchronous tiers").

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
        """
        if not np.isfinite(new).all():
            return self._reject_non_finite(update, policy)
        x = self._weights
        pull = new.astype(np.float64) - x
        delta = math.sqrt(float(np.sum(pull * pull)))
        bound = self.norm_bound(policy)
        clipped = bound is not None and delta > bound
        taken = new.astype(np.float64)
        if bound is not None and clipped:
            if policy.norm_action is NormAction.REJECT:
                return self._reject_norm(update, policy, tau, delta, bound)
            taken = x + pull * (bound / delta)
            delta = bound
        optimizer, settled = self.optimizer, 0
        if self._settles(policy):
            x, optimizer, settled = self._settled(policy)
            self._commit_settle(policy, optimizer, settled)
        if not self.tiers:
            self.tiers = [
                Tier(np.zeros(self.layout.size, dtype=np.float64)) for _ in range(policy.tiers)
            ]
        client = str(update.client_id)
        if client not in self.clients:
            self._make_room(policy)
        samples = int(update.num_samples)
        self.clients.heard(client, samples=samples, seen=self.version, tau=tau)
        index = self.clients.tier(client, policy.tiers)
        tier = self.tiers[index]
        tier.total += taken * samples
        tier.weight += samples
        tier.count += 1
        alpha = policy.server_lr * _tier_weights(self.tiers, tier)[index] * samples / tier.weight
        step = tier.count >= policy.buffer_size
        if step:
            _finish_round(tier)
            x = self._tier_average(x, policy)
            self.counters["server_steps"] += 1
        stepped = step or settled > 0
        norm = 0.0
        if stepped:
            before = self._weights
            self._weights = _frozen(x)
            norm = math.sqrt(_sum_of_squares(self._weights - before))
            self.history.clear()
        decision = self._advance(
            update, policy, tau, alpha, norm, delta, clipped, server_step=stepped
        )
        self._forget_idle(policy)
        return decision

    def _tier_average(self, x: np.ndarray, policy: Policy) -> np.ndarray:
        """x + η·(Σ_m ω_m·w_m − x) over the tiers with a model (see `_tiered`)."""
        weights = _tier_weights(self.tiers)
        average = np.zeros(self.layout.size, dtype=np.float64)
        for omega, tier in zip(weights, self.tiers, strict=True):
            if tier.model is not None:
                average += omega * tier.model.astype(np.float64)
        start = x.astype(np.float64)
        moved: np.ndarray = (start + policy.server_lr * (average - start)).astype(np.float32)
        return moved

    # ----------------------------------------------------------------------------- the book
    def _make_room(self, policy: Policy) -> None:
        """Before a new client enters the book: forget the least recently heard ones beyond
        `memory_clients` (which may have been lowered at runtime)."""
        while len(self.clients) >= policy.memory_clients:
            oldest = self.clients.oldest()
            assert oldest is not None
            self._forget(oldest[0])

    def _forget_idle(self, policy: Policy) -> None:
        """Forget every client silent for more than `memory_idle` server steps."""
        while True:
            oldest = self.clients.oldest()
            if oldest is None or self.version - oldest[1].seen <= policy.memory_idle:
                return
            self._forget(oldest[0])

    def _forget(self, client: str) -> None:
        entry = self.clients.forget(client)
        if entry.delta is not None:
            self.memory.total -= entry.delta.astype(np.float64) * entry.samples
            self.memory.weight -= entry.samples
            if self.memory.weight == 0:  # nothing remembered: no rounding residue either
                self.memory.total[:] = 0.0

    # ----------------------------------------------------------------------------- mode changes
    def _settles(self, policy: Policy) -> bool:
        """Whether another mode left state that must be applied before `policy.mode` decides."""
        mode = policy.mode
        return (
            (self.buffer.count > 0 and mode not in _BUFFERED)
            or (self.memory.weight > 0 and mode is not Mode.MEMORY)
            or (bool(self.tiers) and (mode is not Mode.TIERED or len(self.tiers) != policy.tiers))
        )

    def _settled(self, policy: Policy) -> tuple[np.ndarray, OptimizerState, int]:
        """The weights and optimizer once what other modes left is applied, and the server
        steps that took (0 when the weights did not change). Nothing is committed.

        A partial FedBuff buffer is stepped; the memory's updates since its last step are
        stepped; partial tier rounds are completed and the tiers averaged (each with the
        policy now in force, as a FedBuff leftover always was).
        """
        x, optimizer, steps = self._weights, self.optimizer, 0
        mode = policy.mode
        if self.buffer.count > 0 and mode not in _BUFFERED:
            weights, optimizer = server_step(
                x, self.buffer.total, self.buffer.weight, optimizer, policy
            )
            x, steps = _frozen(weights), steps + 1
        memory = self.memory
        if memory.weight > 0 and mode is not Mode.MEMORY and memory.pending > 0:
            weights, optimizer = server_step(x, memory.total, memory.weight, optimizer, policy)
            x, steps = _frozen(weights), steps + 1
        if self.tiers and (mode is not Mode.TIERED or len(self.tiers) != policy.tiers):
            partial = [tier for tier in self.tiers if tier.count > 0]
            if partial:
                rounds = [_copy_tier(tier) for tier in self.tiers]
                for tier in rounds:
                    if tier.count > 0:
                        _finish_round(tier)
                x = _frozen(_with_tiers(self, rounds, x, policy))
                steps += 1
        return x, optimizer, steps

    def _commit_settle(self, policy: Policy, optimizer: OptimizerState, steps: int) -> None:
        """Empty what `_settled` applied, under the same conditions (the weights are the
        caller's to commit)."""
        mode = policy.mode
        self.optimizer = optimizer
        if self.buffer.count > 0 and mode not in _BUFFERED:
            self._clear_buffer()  # counts its server step
            steps -= 1
        if self.memory.weight > 0 and mode is not Mode.MEMORY:
            for client, entry in self.clients.items():
                if entry.delta is not None:
                    self.clients.set_delta(client, None)
            self.memory.total[:] = 0.0
            self.memory.weight = self.memory.pending = 0
        if self.tiers and (mode is not Mode.TIERED or len(self.tiers) != policy.tiers):
            self.tiers = []
        self.counters["server_steps"] += steps

    def _clear_buffer(self) -> None:
        self.buffer.total[:] = 0.0
        self.buffer.count = 0
        self.buffer.weight = 0.0
        self.counters["server_steps"] += 1

    # ----------------------------------------------------------------------------- poisoning bound
    def norm_bound(self, policy: Policy) -> float | None:
        """k × the median delta norm of the last `norm_window` applied updates, or None.

        The delta norm measures how far an update would move the model before α scales it:
        ‖x_new − x‖ in FedAsync, where the update is mixed with the current model x (FedAsync
        forms no delta from the device's base, so x_new − x is the pull it exerts), and
        ‖x_new − x_base‖ in FedBuff, the very delta the buffer takes in. A poisoned update that
        drags the model far away has a large delta norm whatever its staleness; an honest update
        is comparable to its recent peers, whose median a few outliers cannot move.

        None (no bound) when the policy sets none, or while fewer than NORM_MIN_HISTORY updates
        have been applied: a median of two norms says nothing about what is normal.
        """
        if policy.norm_bound is None:
            return None
        window = min(policy.norm_window, len(self.norms))
        if window < NORM_MIN_HISTORY:
            return None
        recent = sorted(self.norms[i] for i in range(len(self.norms) - window, len(self.norms)))
        middle = window // 2
        median = recent[middle] if window % 2 else (recent[middle - 1] + recent[middle]) / 2
        return policy.norm_bound * median

    def _reject_norm(
        self, update: Update, policy: Policy, tau: int, delta: float, bound: float
    ) -> Decision:
        return self._decide(
            update,
            policy,
            Outcome.REJECTED,
            tau=tau,
            delta_norm=delta,
            reason=RejectReason.NORM_BOUND,
            detail=f"delta norm {delta:.6g} > bound {bound:.6g} "
            f"({policy.norm_bound:g} × median of the last {policy.norm_window} applied)",
        )

    def _scratch(self) -> np.ndarray:
        """A float32 work buffer reused across updates: no fresh pages to fault in each time."""
        if self._scratch_buffer is None:
            self._scratch_buffer = np.empty(self.layout.size, np.float32)
        return self._scratch_buffer

    def _base_weights(self, base_version: int) -> np.ndarray | None:
        for version, weights in reversed(self.history):
            if version <= base_version:
                found: np.ndarray = weights
                return found
        return None

    def _prune_history(self, tau_max: int) -> None:
        oldest_needed = self.version - tau_max
        while len(self.history) > 1 and self.history[1][0] <= oldest_needed:
            self.history.pop(0)

    def _advance(
        self,
        update: Update,
        policy: Policy,
        tau: int,
        alpha: float,
        norm: float,
        delta_norm: float,
        clipped: bool,
        *,
        server_step: bool,
    ) -> Decision:
        if server_step:  # the weights changed: a new version (every applied update in FedAsync)
            self.version += 1
            self.dedup.advance(self.version)
        self.norms.append(delta_norm)
        return self._decide(
            update,
            policy,
            Outcome.APPLIED,
            tau=tau,
            alpha=alpha,
            step_norm=norm,
            server_step=server_step,
            delta_norm=delta_norm,
            clipped=clipped,
        )

    def _decide(
        self,
        update: Update,
        policy: Policy,
        outcome: Outcome,
        *,
        tau: int | None = None,
        alpha: float | None = None,
        step_norm: float | None = None,
        server_step: bool = False,
        reason: str | None = None,
        detail: str = "",
        delta_norm: float | None = None,
        clipped: bool = False,
    ) -> Decision:
        self.counters[outcome.value] += 1
        return Decision(
            outcome=outcome,
            update_id=str(update.update_id),
            client_id=str(update.client_id),
            base_version=int(update.base_version),
            version=self.version,
            policy_version=policy.version,
            tau=tau,
            alpha=alpha,
            step_norm=step_norm,
            server_step=server_step,
            reason=None if reason is None else str(reason),
            detail=detail,
            delta_norm=delta_norm,
            clipped=clipped,
        )


def _valid_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _sum_of_squares(scratch: np.ndarray) -> float:
    """Σv² with numpy's pairwise sum, overwriting `scratch` (a temporary of the caller's).

    Not BLAS dot: its threads may split the sum differently on another machine, and decisions
    must be bit-identical everywhere. Infinite or NaN if v holds one, or if a square overflows.
    """
    np.square(scratch, out=scratch)
    return float(np.sum(scratch))


def _finish_round(tier: Tier) -> None:
    """A tier's round is complete: its model is the sample-weighted mean of the round."""
    tier.model = _frozen((tier.total / tier.weight).astype(np.float32))
    tier.rounds += 1
    tier.total[:] = 0.0
    tier.weight = tier.count = 0


def _copy_tier(tier: Tier) -> Tier:
    return Tier(tier.total.copy(), tier.weight, tier.count, tier.rounds, tier.model)


def _with_tiers(
    state: AggregationState, tiers: list[Tier], x: np.ndarray, policy: Policy
) -> np.ndarray:
    """`_tier_average` over `tiers` (a settled copy) instead of the state's own."""
    kept, state.tiers = state.tiers, tiers
    try:
        return state._tier_average(x, policy)
    finally:
        state.tiers = kept


def _tier_weights(tiers: list[Tier], including: Tier | None = None) -> list[float]:
    """FedAT's ω_m with add-one counts over the tiers that have a model (or are `including`,
    the tier of the update being decided); 0 for the others. See `AggregationState._tiered`."""
    count = len(tiers)
    raw = [
        float(tiers[count - 1 - m].rounds + 1)
        if tier.model is not None or tier is including
        else 0.0
        for m, tier in enumerate(tiers)
    ]
    total = sum(raw)
    return [w / total for w in raw] if total else raw
