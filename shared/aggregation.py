"""The aggregation state machine: one update in, one decision out, strictly one at a time.

This is the only implementation of FedAsync mixing, FedBuff buffering, stale dropping and dedup.
The aggregator service, the simulator and `ledger verify` all drive this class, so a setting tuned
in simulation decides exactly as it will in production. No I/O, no clock, no randomness: the same
initial state and the same updates give bit-identical weights and decisions in any process.

The model version counts server steps, the moments the weights change: in FedAsync every applied
update is one (Xie et al. 2019), in FedBuff one step takes K buffered updates (Nguyen et al. 2022).
So τ = version − base version counts server steps in every mode, as both papers (and FLSim) count
it, and every version number names exactly one model.

What every mode shares is here, written once: the checks an update passes before any mode sees it
(ids, dedup, closing, shape and values, staleness: `apply`), versioning, the poisoning bound
(`clip`), the decision record (`decide`, `advance`), the client book's bounds and the mode switch
(`settle`). Each mode's own rule is a strategy in shared/modes/, one module per mode, with its
formula in its docstring: `fedasync`, `fedbuff`, `fedbuff-fair`, `memory` and `tiered`. The last
three keep something per client between its updates (shared/clients.py), so that a slow client's
data is not forgotten between its rare updates (docs/experiments.md, "rare-class-fair").

A mode may change at runtime. What the previous mode left pending is then applied first, as part
of the first update the new mode applies (`settle`): a partial FedBuff buffer is stepped, the
memory's updates since its last step are stepped and the memory emptied, partial tier rounds are
completed and the tiers averaged, then emptied. That update's decision is a server step whenever
the settling changed the weights, so a version still names exactly one model.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedasync.shared.clients import ClientBook
from fedasync.shared.decision import Decision, DropReason, Outcome, RejectReason
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.half import to_float32
from fedasync.shared.layout import Layout
from fedasync.shared.modes import HOLDERS, STRATEGIES
from fedasync.shared.modes.base import Clip, Settlement, Strategy, frozen
from fedasync.shared.modes.holdings import FedBuffBuffer, Memory, Tier
from fedasync.shared.modes.memory import forget_delta
from fedasync.shared.params import NORM_MIN_HISTORY, NORM_WINDOW_LIMIT
from fedasync.shared.policy import Mode, NormAction, Policy
from fedasync.shared.privacy.clipping import delta_noise_multiplier, next_clip
from fedasync.shared.privacy.noise import count_draw, gaussian
from fedasync.shared.privacy.spent import PrivacyError, PrivacySpent
from fedasync.shared.server_optimizer import OptimizerState
from fedasync.shared.update import MAX_ID_LENGTH, Update
from fedasync.shared.validation import NON_FINITE_DETAIL, is_count, update_problem
from fedasync.shared.zeno import ValidationGradient, due, score

#: why the core itself closes training: a step would take ε past the policy's privacy budget
#: (the budgets of updates and time are the drivers' to close, between two updates)
PRIVACY_BUDGET = "privacy_budget"

__all__ = ["PRIVACY_BUDGET", "AggregationState", "FedBuffBuffer", "Memory", "ModelSnapshot", "Tier"]


@dataclass(frozen=True, slots=True, eq=False)
class ModelSnapshot:
    """A version and a private copy of its weights: what a device may train from."""

    version: int
    weights: np.ndarray
    layout: Layout


class AggregationState:
    """Model version, weights, dedup memory, FedBuff buffer, history and server optimizer, the
    client book, memory and tiers, and decision counters.

    The methods below `apply` are what the modes' strategies (shared/modes/base.py, `State`)
    use of it: the steps every mode shares.
    """

    def __init__(
        self,
        weights: np.ndarray,
        layout: Layout,
        *,
        version: int = 0,
        dedup: DedupMemory | None = None,
        dp_secret: bytes | None = None,
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
        #: differential privacy: what has been spent, and the adaptive clip (shared/privacy/)
        self.privacy = PrivacySpent()
        #: the per-run secret the DP noise is drawn from (shared/privacy/noise.py); never saved
        self.dp_secret = dp_secret
        #: Zeno++ (FedAsync, policy `zeno_margin`): the validation gradient v its driver
        #: computed at the weights of a version (`zeno_refresh`); None until the first refresh.
        #: Checkpointed (shared/checkpoint.py), so a restored state scores with the same v
        self.zeno_gradient: ValidationGradient | None = None
        self._weights = frozen(weights.copy())
        self._scratch_buffer: np.ndarray | None = None
        #: what a robust rule left out of a server step taken while deciding the current
        #: update (`note_step`), for that update's decision; None between updates
        self._step_note: tuple[tuple[str, ...], str] | None = None

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

    def epsilon(self, policy: Policy) -> tuple[float | None, float | None]:
        """(sampled, conservative) ε spent so far at `policy.dp_delta`; (None, None) without
        DP, sampled None without `dp_population` (shared/privacy/accounting.py)."""
        if not policy.private:
            return None, None
        return self.privacy.epsilon(policy)

    def adaptive_clip(self, policy: Policy) -> float | None:
        """The clip C in force when it adapts (policy `dp_quantile`); None with a fixed clip
        (the policy's `dp_clip` is the C then) or without DP."""
        if not policy.private or policy.dp_quantile is None:
            return None
        return self.privacy.clip_norm(policy)

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

    def decide_unread(
        self, update_id: str, client_id: str, base_version: int, num_samples: int, policy: Policy
    ) -> Decision | None:
        """The decision `apply` makes of an update it drops without reading its weights (stale,
        or beyond the dedup horizon: `drops_unread`), from what the update says of itself and
        with no weights at all; None, with nothing changed, for any update `apply` must decide.

        For a driver that would otherwise build an update only to have its weights ignored: in
        the simulator, with 100,000 devices training at once, almost every arrival is one
        (issue 29). The checks are `apply`'s, in its order, and so are the counting, the dedup
        memory and the record, so the decision, the state after it and every ledger are the
        same as through `apply`; what is skipped is only what reads or checks weights.
        """
        if (
            self.closed is not None
            or not _valid_id(update_id)
            or not _valid_id(client_id)
            or update_id in self.dedup
            or not is_count(base_version)
        ):
            return None  # rejected, a duplicate, closed or malformed: `apply` says which
        tau = self.version - base_version
        if base_version < self.dedup.floor:
            return self._decided(
                update_id, client_id, base_version, policy, Outcome.DROPPED, tau=tau,
                reason=DropReason.BEYOND_DEDUP_HORIZON,
            )  # fmt: skip
        if tau < 0 or not is_count(num_samples) or num_samples < 1 or not policy.is_stale(tau):
            return None  # a future base or a bad count is rejected; a fresh update is read
        self.dedup.remember(update_id, base_version)  # `apply`'s key: the base is not ahead
        return self._decided(
            update_id, client_id, base_version, policy, Outcome.DROPPED, tau=tau,
            reason=DropReason.STALE,
        )  # fmt: skip

    def apply(
        self, update: Update, policy: Policy, *, strategy: Strategy | None = None
    ) -> Decision:
        """Decide one update under `policy` and, if accepted, fold it into the model.

        `strategy` replaces the policy mode's own after every shared check: a tree's leaf
        (shared/tree.py) takes updates in as FedBuff does but never steps."""
        if not _valid_id(update.update_id) or not _valid_id(update.client_id):
            return self.decide(
                update,
                policy,
                Outcome.REJECTED,
                reason=RejectReason.BAD_ID,
                detail=f"update_id and client_id must be 1..{MAX_ID_LENGTH} characters",
            )
        if update.update_id in self.dedup:
            return self.decide(update, policy, Outcome.DUPLICATE)
        if self.closed is not None:
            self.dedup.remember(update.update_id, self.version)
            return self.decide(
                update, policy, Outcome.DROPPED, reason=DropReason.CLOSED, detail=self.closed
            )
        base_ok = is_count(update.base_version)
        if base_ok and update.base_version < self.dedup.floor:
            return self.decide(
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
            return self.decide(update, policy, Outcome.REJECTED, reason=reason, detail=detail)

        tau = self.version - update.base_version
        if policy.is_stale(tau):
            return self.decide(update, policy, Outcome.DROPPED, tau=tau, reason=DropReason.STALE)
        if policy.private:
            refused = self._private_gate(update, policy, tau)
            if refused is not None:
                return refused

        new = to_float32(update.weights)
        taker = STRATEGIES[policy.mode] if strategy is None else strategy
        return taker.take(self, update, new, tau, policy)

    def _private_gate(self, update: Update, policy: Policy, tau: int) -> Decision | None:
        """DP's own refusals, before any value is read: the participation cap, then the
        privacy budget, which closes training before a step that would take ε past it."""
        if self.dp_secret is None:
            raise PrivacyError("a policy with dp_clip needs the run's dp_secret to draw noise")
        client = str(update.client_id)
        if self.privacy.capped(client, policy):
            return self.decide(
                update,
                policy,
                Outcome.DROPPED,
                tau=tau,
                reason=DropReason.PARTICIPATION_CAP,
                detail=f"{policy.dp_participation} contributions of this device taken already",
            )
        budget = policy.privacy_budget
        if budget is not None:
            steps = policy.mode is Mode.FEDASYNC or self.buffer.count + 1 >= policy.buffer_size
            spent = self.privacy.prospective(policy, client, steps)
            if spent > budget:
                self.close(PRIVACY_BUDGET)
                return self.decide(
                    update,
                    policy,
                    Outcome.DROPPED,
                    reason=DropReason.CLOSED,
                    detail=str(self.closed),
                )
        return None

    def private_step(self, policy: Policy, count: int) -> np.ndarray:
        """The Gaussian noise of the server step about to be taken over `count` updates (std
        z·C, z raised for adaptive clipping, C the largest clip of the step's updates), and the
        step counted as spent, the adaptive clip moved (shared/privacy/clipping.py).

        Keyed by the version the step creates, from the run's secret: the same bits in the
        aggregator, the simulator and `ledger verify`. Changes the privacy state: called only
        once the step is certain to be taken.
        """
        assert self.dp_secret is not None  # `_private_gate` checked it
        step = self.version + 1
        privacy = self.privacy
        std = delta_noise_multiplier(policy) * privacy.step_clip
        noise = gaussian(self.dp_secret, step, self._size, std)
        clip = None
        if policy.dp_quantile is not None:
            draw = count_draw(self.dp_secret, step)
            clip = next_clip(privacy.clip_norm(policy), privacy.within, count, draw, policy)
        privacy.stepped(policy, clip)
        return noise

    # ----------------------------------------------------------------------------- mode switch
    def settle(self, policy: Policy) -> Settlement:
        """The mode switch: what other modes hold that `policy` cannot go on with, applied.

        Called by every mode before it changes the state for an update it takes in; a mode
        change takes effect there, with the first update the new mode takes in. Each holder
        (shared/modes, `HOLDERS`, in that order) that `policy.mode` cannot go on with is applied
        with the policy now in force, one server step each when it changes the weights:

        - FedBuff's buffer (fedbuff, fedbuff-fair), partial, to a mode that does not buffer:
          stepped through the server optimizer, then emptied;
        - the memory (memory mode), to any other mode: the updates remembered since its last
          step are stepped, then every remembered delta is forgotten (the book keeps its
          clients);
        - the tiers (tiered), to another mode or another number of tiers: partial rounds are
          completed and the tiers averaged once more, then dropped.

        Nothing changes here: the returned settlement has the weights and optimizer after
        it and the steps it took, and `commit()` makes it so (optimizer, emptied holdings,
        step count; the weights are the caller's to install, as the mode's own step starts
        from them). A mode that may still refuse the update after measuring it against the
        settled model (FedAsync's norm bound) commits only once it takes the update in.
        """
        incoming = STRATEGIES[policy.mode]
        holders = [holder for holder in HOLDERS if holder.held(self, incoming, policy)]
        if not holders:  # the common case, every update: nothing to settle, nothing to commit
            return Settlement(self._weights, self.optimizer, 0, False, _nothing)
        x, optimizer, steps = self._weights, self.optimizer, 0
        for holder in holders:
            x, optimizer, took = holder.settled(self, x, optimizer, policy)
            steps += took

        def commit() -> None:
            self.optimizer = optimizer
            for holder in holders:
                holder.empty(self)
            self.counters["server_steps"] += steps

        return Settlement(x, optimizer, steps, True, commit)

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

    def clip(self, update: Update, policy: Policy, tau: int, norm: float) -> Clip | Decision:
        """The poisoning bound on an update whose delta norm is `norm` (`norm_bound`): within
        it, or no bound yet, it counts with its norm; beyond it, it is clipped to the bound or
        rejected (the decision), as `policy.norm_action` says."""
        bound = self.norm_bound(policy)
        if bound is None or not norm > bound:
            return Clip(norm)
        if policy.norm_action is NormAction.REJECT:
            return self._reject_norm(update, policy, tau, norm, bound)
        return Clip(bound, bound / norm)

    def _reject_norm(
        self, update: Update, policy: Policy, tau: int, delta: float, bound: float
    ) -> Decision:
        return self.decide(
            update,
            policy,
            Outcome.REJECTED,
            tau=tau,
            delta_norm=delta,
            reason=RejectReason.NORM_BOUND,
            detail=f"delta norm {delta:.6g} > bound {bound:.6g} "
            f"({policy.norm_bound:g} × median of the last {policy.norm_window} applied)",
        )

    # ----------------------------------------------------------------------------- Zeno++
    def zeno_due(self, policy: Policy) -> bool:
        """True when the driver must hand in a fresh validation gradient (`zeno_refresh`) before
        it submits the next update: Zeno++ is on and v is missing or `zeno_every` steps old."""
        return due(self.zeno_gradient, self.version, policy)

    def zeno_prepare(self, policy: Policy, gradient_at: Callable[[np.ndarray], np.ndarray]) -> None:
        """What every driver calls before it submits an update under `policy`: when a refresh
        is due (`zeno_due`), v = `gradient_at(current weights)` is installed. The driver's
        function (the task's gradient on its held-out set: learning/held_out.py) is the only
        thing the core does not hold; the simulator, the aggregator and `ledger verify` call
        this at the same decisions, so they score with the same v."""
        if self.zeno_due(policy):
            self.zeno_refresh(gradient_at(self._weights))

    def zeno_refresh(self, gradient: np.ndarray) -> None:
        """Install v, the held-out set's mean loss gradient at the current weights, computed by
        the driver with its task (`Task.gradient`): the core has no data."""
        if gradient.shape != (self._size,):
            raise ValueError(
                f"validation gradient of shape {gradient.shape}, the model has {self._size}"
            )
        self.zeno_gradient = ValidationGradient.at(self.version, gradient)

    def zeno_check(
        self, update: Update, policy: Policy, tau: int, delta: np.ndarray, norm: float
    ) -> Decision | None:
        """Zeno++ on an update that pulls the model by `delta` (shared/zeno.py): None to go on,
        or its rejection (reason `zeno`, the score in the detail). With no validation gradient
        handed in, nothing is scored: a driver that does not refresh leaves the defence off."""
        v = self.zeno_gradient
        if policy.zeno_margin is None or v is None:
            return None
        verdict = score(v, delta, policy)
        if verdict.accepted:
            return None
        return self.decide(
            update,
            policy,
            Outcome.REJECTED,
            tau=tau,
            delta_norm=norm,
            reason=RejectReason.ZENO,
            detail=verdict.detail(v.version),
        )

    def reject_non_finite(self, update: Update, policy: Policy) -> Decision:
        return self.decide(
            update,
            policy,
            Outcome.REJECTED,
            reason=RejectReason.NON_FINITE,
            detail=NON_FINITE_DETAIL,
        )

    # ----------------------------------------------------------------------------- for the modes
    def note_step(self, excluded: tuple[str, ...], detail: str) -> None:
        """A robust rule's account of a server step (shared/robust.py): the update ids it left
        out and its detail, recorded on the decision of the update being decided if that
        decision takes the step (a refused update's decision drops it: nothing stepped)."""
        if self._step_note is not None:  # a settled buffer and the new one's step, both robust
            excluded = self._step_note[0] + excluded
            detail = f"{self._step_note[1]}; {detail}"
        self._step_note = (excluded, detail)

    def replace_weights(self, weights: np.ndarray) -> None:
        """Install the weights of a server step (made read-only: `weights_view` stays valid)."""
        self._weights = frozen(weights)

    def scratch(self) -> np.ndarray:
        """A float32 work buffer reused across updates: no fresh pages to fault in each time."""
        if self._scratch_buffer is None:
            self._scratch_buffer = np.empty(self.layout.size, np.float32)
        return self._scratch_buffer

    # ----------------------------------------------------------------------------- the book
    def make_room(self, policy: Policy) -> None:
        """Before a new client enters the book: forget the least recently heard ones beyond
        `memory_clients` (which may have been lowered at runtime)."""
        while len(self.clients) >= policy.memory_clients:
            oldest = self.clients.oldest()
            assert oldest is not None
            self._forget(oldest[0])

    def forget_idle(self, policy: Policy) -> None:
        """Forget every client silent for more than `memory_idle` server steps."""
        while True:
            oldest = self.clients.oldest()
            if oldest is None or self.version - oldest[1].seen <= policy.memory_idle:
                return
            self._forget(oldest[0])

    def _forget(self, client: str) -> None:
        entry = self.clients.forget(client)
        if entry.delta is not None:
            forget_delta(self.memory, entry)
            if self.memory.weight == 0:  # nothing remembered: no rounding residue either
                self.memory.total[:] = 0.0

    # ----------------------------------------------------------------------------- the record
    def advance(
        self,
        update: Update,
        policy: Policy,
        tau: int,
        alpha: float,
        step_norm: float,
        clip: Clip,
        *,
        server_step: bool,
    ) -> Decision:
        """Record an applied update: a new version when it made a server step, its delta norm
        (`clip.norm`) in the bound's history, and its decision."""
        if server_step:  # the weights changed: a new version (every applied update in FedAsync)
            self.version += 1
            self.dedup.advance(self.version)
        self.norms.append(clip.norm)
        return self.decide(
            update,
            policy,
            Outcome.APPLIED,
            tau=tau,
            alpha=alpha,
            step_norm=step_norm,
            server_step=server_step,
            delta_norm=clip.norm,
            clipped=clip.clipped,
        )

    def decide(
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
        """Count `outcome` and record it: every decision, of every mode, is made here."""
        return self._decided(
            update.update_id, update.client_id, update.base_version, policy, outcome,
            tau=tau, alpha=alpha, step_norm=step_norm, server_step=server_step, reason=reason,
            detail=detail, delta_norm=delta_norm, clipped=clipped,
        )  # fmt: skip

    def _decided(
        self,
        update_id: str,
        client_id: str,
        base_version: int,
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
        """`decide` from the update's ids and base alone (`decide_unread` has no `Update`)."""
        self.counters[outcome.value] += 1
        excluded: tuple[str, ...] = ()
        if self._step_note is not None:
            if server_step:
                excluded, noted = self._step_note
                detail = detail or noted
            self._step_note = None
        sampled, conservative = self.epsilon(policy)
        return Decision(
            outcome=outcome,
            update_id=str(update_id),
            client_id=str(client_id),
            base_version=int(base_version),
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
            excluded=excluded,
            epsilon_sampled=sampled,
            epsilon_conservative=conservative,
            adaptive_clip=self.adaptive_clip(policy),
        )


def _nothing() -> None:
    """Committing a settlement of nothing."""


def _valid_id(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH
