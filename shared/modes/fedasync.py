"""FedAsync (Xie et al. 2019): every applied update is mixed into the model at once."""

from __future__ import annotations

import math

import numpy as np

from fedasync.shared.decision import Decision
from fedasync.shared.modes.base import State, Strategy, sum_of_squares
from fedasync.shared.modes.delta import delta_from_base, private_clip, prune_history
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.update import Update


class FedAsync(Strategy):
    """x ← (1 − α)·x + α·x_new, with α = α0·s(τ) computed afresh; every update a server step.

    Holds nothing between updates, so a switch away from it has nothing to settle.

    With differential privacy (`dp_clip`) the rule is DP-FedAsync: the device's own delta
    against the model it trained from is clipped to C and noised, then mixed,

        x ← x + α·(clip_C(x_new − x_base) + N(0, z²C²I))

    so a step's sensitivity α·C meets noise of std α·z·C: every applied update is one Gaussian
    mechanism of multiplier z. It needs the base models, kept as the delta modes keep them.
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
        if policy.private:
            return self._take_private(state, update, new, tau, policy)
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

    def _take_private(
        self, state: State, update: Update, new: np.ndarray, tau: int, policy: Policy
    ) -> Decision:
        """DP-FedAsync (the class docstring): clip the delta against the base, noise, mix."""
        delta = delta_from_base(state, update, new, tau, policy)
        if isinstance(delta, Decision):
            return delta
        clip = private_clip(state, policy, delta)
        # nothing below can refuse the update: the state may change from here on
        settlement = state.settle(policy)  # nothing is held during a DP run (its mode is fixed)
        settlement.commit()
        x = settlement.weights
        alpha = policy.alpha(tau, state.version)
        bound = state.privacy.clip_norm(policy)
        state.privacy.contribute(str(update.client_id), bound, not clip.clipped)
        delta += state.private_step(policy, 1)
        mixed = (x + alpha * delta).astype(np.float32)
        step_norm = math.sqrt(sum_of_squares(np.subtract(mixed, x, out=state.scratch())))
        state.replace_weights(mixed)
        state.counters["server_steps"] += settlement.steps + 1
        decision = state.advance(update, policy, tau, alpha, step_norm, clip, server_step=True)
        state.history.append((state.version, state.weights_view()))
        prune_history(state, policy.tau_max)
        return decision
