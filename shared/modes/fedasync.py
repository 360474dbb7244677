"""FedAsync (Xie et al. 2019): every applied update is mixed into the model at once."""

from __future__ import annotations

import math

import numpy as np

from fedasync.shared.decision import Decision
from fedasync.shared.modes.base import State, Strategy, sum_of_squares
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.update import Update


class FedAsync(Strategy):
    """x ← (1 − α)·x + α·x_new, with α = α0·s(τ) computed afresh; every update a server step.

    Holds nothing between updates, so a switch away from it has nothing to settle.
    """

    mode = Mode.FEDASYNC

    def take(
        self, state: State, update: Update, new: np.ndarray, tau: int, policy: Policy
    ) -> Decision:
        """Evaluated as x + α·(x_new − x): the same rule with one rounding fewer, and the delta
        x_new − x is at hand for its norm. NaN or Inf in x_new shows up in that norm, so
        finiteness costs no pass of its own; nothing is committed until it is known.

        What a previous mode left is settled first and x is the settled model, committed only
        once the update is known to be taken in.
        """
        settlement = state.settle(policy)
        if settlement.settling and not np.isfinite(new).all():
            return state.reject_non_finite(update, policy)
        x = settlement.weights
        alpha = policy.alpha(tau, state.version)
        exact: np.ndarray | None = None
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected just below
            step = np.subtract(new, x, out=state.scratch())
            mixed = step * np.float32(alpha)
            mixed += x
            squares = sum_of_squares(step)
        if not math.isfinite(squares):
            if not np.isfinite(new).all():
                return state.reject_non_finite(update, policy)
            # finite weights so far apart that their float32 difference overflowed: use float64
            exact = new.astype(np.float64) - x
            squares = float(np.sum(exact * exact))
            mixed = (x + alpha * exact).astype(np.float32)
        if policy.zeno_margin is not None:  # Zeno++ (shared/zeno.py): scores x_new − x
            delta = exact if exact is not None else np.subtract(new, x, out=state.scratch())
            refused = state.zeno_check(update, policy, tau, delta, math.sqrt(squares))
            if refused is not None:
                return refused
        clip = state.clip(update, policy, tau, math.sqrt(squares))
        if isinstance(clip, Decision):
            return clip
        if clip.scale is not None:
            scale = alpha * clip.scale
            if exact is None:
                with np.errstate(over="ignore"):  # finite: new − x was finite above
                    mixed = np.subtract(new, x) * np.float32(scale)
                    mixed += x
            else:
                mixed = (x + scale * exact).astype(np.float32)
        if settlement.settling:  # the settled weights are x, from which `mixed` was formed
            settlement.commit()
        state.replace_weights(mixed)
        state.history.clear()
        state.counters["server_steps"] += 1
        return state.advance(update, policy, tau, alpha, alpha * clip.norm, clip, server_step=True)
