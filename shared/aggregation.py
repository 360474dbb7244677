"""The aggregation state machine: one update in, one decision out, strictly one at a time.

This is the only implementation of FedAsync mixing, FedBuff buffering, stale dropping and dedup.
The aggregator service, the simulator and `ledger verify` all drive this class, so a setting tuned
in simulation decides exactly as it will in production. No I/O, no clock, no randomness: the same
initial state and the same updates give bit-identical weights and decisions in any process.

The model version counts server steps, the moments the weights change: in FedAsync every applied
update is one (Xie et al. 2019), in FedBuff one step takes K buffered updates (Nguyen et al. 2022).
So τ = version − base version counts server steps in both, as both papers (and FLSim) count it,
and every version number names exactly one model.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from fedasync.shared.decision import Decision, DropReason, Outcome, RejectReason
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.layout import Layout
from fedasync.shared.params import NORM_MIN_HISTORY, NORM_WINDOW_LIMIT
from fedasync.shared.policy import Mode, NormAction, Policy
from fedasync.shared.server_optimizer import OptimizerState, server_step
from fedasync.shared.update import MAX_ID_LENGTH, Update

_ACCEPTED_DTYPES = (np.dtype("<f4"), np.dtype("<f2"))


@dataclass(frozen=True, slots=True, eq=False)
class ModelSnapshot:
    """A version and a private copy of its weights: what a device may train from."""

    version: int
    weights: np.ndarray
    layout: Layout


@dataclass(slots=True)
class FedBuffBuffer:
    """Σ s(τ_i)·Δ_i over the updates buffered since the last server step, in float64."""

    total: np.ndarray
    count: int = 0


class AggregationState:
    """Model version, weights, dedup memory, FedBuff buffer, history and server optimizer, and
    decision counters."""

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
        base_ok = _is_count(update.base_version)
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
        problem = self._validate(update)
        if problem is not None:
            reason, detail = problem
            return self._decide(update, policy, Outcome.REJECTED, reason=reason, detail=detail)

        tau = self.version - update.base_version
        if policy.is_stale(tau):
            return self._decide(update, policy, Outcome.DROPPED, tau=tau, reason=DropReason.STALE)

        new = update.weights.astype(np.float32, copy=False)
        if policy.mode is Mode.FEDASYNC:
            return self._mix(update, new, tau, policy)
        return self._buffer(update, new, tau, policy)

    def _validate(self, update: Update) -> tuple[RejectReason, str] | None:
        if not _is_count(update.base_version):
            return RejectReason.BAD_BASE_VERSION, f"base version {update.base_version!r}"
        if update.base_version > self.version:
            return (
                RejectReason.FUTURE_BASE_VERSION,
                f"base version {update.base_version} > model version {self.version}",
            )
        if not _is_count(update.num_samples) or update.num_samples < 1:
            return RejectReason.BAD_NUM_SAMPLES, f"num_samples {update.num_samples!r} < 1"
        w = update.weights
        if not isinstance(w, np.ndarray) or w.dtype not in _ACCEPTED_DTYPES:
            dtype = getattr(w, "dtype", type(w).__name__)
            return RejectReason.BAD_DTYPE, f"dtype {dtype}, expected float32 or float16"
        if w.ndim != 1 or w.size != self.layout.size:
            return RejectReason.SHAPE_MISMATCH, f"shape {w.shape}, expected ({self.layout.size},)"
        return None

    def _reject_non_finite(self, update: Update, policy: Policy) -> Decision:
        return self._decide(
            update,
            policy,
            Outcome.REJECTED,
            reason=RejectReason.NON_FINITE,
            detail="weights contain NaN or Inf",
        )

    def _mix(self, update: Update, new: np.ndarray, tau: int, policy: Policy) -> Decision:
        """x ← (1 − α)·x + α·x_new, with α = α0·s(τ) computed afresh.

        Evaluated as x + α·(x_new − x): the same rule with one rounding fewer, and the delta
        x_new − x is at hand for its norm. NaN or Inf in x_new shows up in that norm, so
        finiteness costs no pass of its own; nothing is committed until it is known.
        """
        x = self._weights
        flushed_optimizer = self.optimizer
        flush = self.buffer.count > 0
        if flush:  # leftovers of a FedBuff period are applied first, never lost
            if not np.isfinite(new).all():
                return self._reject_non_finite(update, policy)
            x, flushed_optimizer = self._flushed(policy)
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
        if flush:  # the flushed weights are x, from which `mixed` was formed
            self.optimizer = flushed_optimizer
            self._clear_buffer()
        self._weights = _frozen(mixed)
        self.history.clear()
        self.counters["server_steps"] += 1
        return self._advance(
            update, policy, tau, alpha, alpha * delta, delta, clipped, server_step=True
        )

    def _buffer(self, update: Update, new: np.ndarray, tau: int, policy: Policy) -> Decision:
        """FedBuff: add s(τ)·(x_new − x_base) to the buffer; step once K are in.

        τ is the number of server steps since the model the device trained from (Nguyen et al.
        2022, Algorithm 1), for the weight s(τ) and for τ_max alike. The update counts as applied
        when it enters the buffer; its decision records the version in force, which the K-th
        update's server step then raises by one: the buffered updates are part of that next
        version. A partial buffer is stepped when the mode returns to FedAsync.
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
        self.buffer.total += s * delta
        self.buffer.count += 1
        alpha = policy.server_lr * s / policy.buffer_size
        norm = 0.0
        stepped = self.buffer.count >= policy.buffer_size
        if stepped:
            before = self._weights
            self._flush_buffer(policy)
            norm = math.sqrt(_sum_of_squares(self._weights - before))
        decision = self._advance(
            update, policy, tau, alpha, norm, norm_of_delta, clipped, server_step=stepped
        )
        if stepped:
            self.history.append((self.version, self._weights))
        self._prune_history(policy.tau_max)
        return decision

    def _flush_buffer(self, policy: Policy) -> None:
        """One FedBuff server step on Δ̄ = (Σ s(τ_i)Δ_i)/K, K being the updates buffered, with
        the policy's server optimizer (shared/server_optimizer.py)."""
        if self.buffer.count == 0:
            return
        self._weights, self.optimizer = self._flushed(policy)
        self._clear_buffer()

    def _flushed(self, policy: Policy) -> tuple[np.ndarray, OptimizerState]:
        """The weights and optimizer state a FedBuff server step would give, not committed."""
        weights, optimizer = server_step(
            self._weights, self.buffer.total, self.buffer.count, self.optimizer, policy
        )
        return _frozen(weights), optimizer

    def _clear_buffer(self) -> None:
        self.buffer.total[:] = 0.0
        self.buffer.count = 0
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


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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
