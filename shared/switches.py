"""Named degrade switches: each one a documented, reversible change of the policy.

Flipping a switch on records the values it overrides; flipping it off puts exactly those values
back. Operators flip them by hand (control service) and the automatic rules flip them too; both
go through these functions, so a switch means the same thing whoever pulls it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fedasync.shared.policy import POLICY_RANGES, Policy

#: how much `raise-gamma` raises γ, and the factor `lower-alpha` applies to α0
GAMMA_STEP = 0.3
ALPHA_FACTOR = 0.5


@dataclass(frozen=True, slots=True)
class Switch:
    name: str
    description: str
    change: Callable[[Policy], dict[str, Any]]


#: decimal places a switch's result keeps: 0.6 + 0.3 is 0.8999999999999999 in binary, which
#: the policy would then carry and every view (status, history, dashboard, `up`) would show
DECIMALS = 10


def _raise_gamma(policy: Policy) -> dict[str, Any]:
    raised = round(policy.gamma + GAMMA_STEP, DECIMALS)
    return {"gamma": min(raised, POLICY_RANGES["gamma"].high)}


def _lower_alpha(policy: Policy) -> dict[str, Any]:
    lowered = round(policy.alpha0 * ALPHA_FACTOR, DECIMALS)
    return {"alpha0": max(lowered, POLICY_RANGES["alpha0"].low)}


def _freshest_only(policy: Policy) -> dict[str, Any]:
    return {"tau_max": 0}


def _pause_ingest(policy: Policy) -> dict[str, Any]:
    return {"ingest_paused": True}


SWITCHES: dict[str, Switch] = {
    s.name: s
    for s in (
        Switch(
            "raise-gamma",
            f"γ + {GAMMA_STEP}: stale updates count for less (update-rate spikes, non-IID jitter)",
            _raise_gamma,
        ),
        Switch(
            "lower-alpha",
            f"α0 × {ALPHA_FACTOR}: every update moves the model less (too many updates per second)",
            _lower_alpha,
        ),
        Switch(
            "freshest-only",
            "τ_max = 0: only updates trained from the newest version are applied, the rest are "
            "dropped cheaply (the aggregator lags behind the stream)",
            _freshest_only,
        ),
        Switch(
            "pause-ingest",
            "the ingest service answers 503 with Retry-After instead of taking updates (a flood, "
            "an attack, Redis near its memory limit); what was taken is still decided",
            _pause_ingest,
        ),
    )
}


class SwitchError(ValueError):
    """An unknown switch, or flipping one into the state it is already in."""


def switch_on(policy: Policy, name: str) -> tuple[Policy, dict[str, Any]]:
    """The policy with switch `name` on, and the values it replaced (to restore later)."""
    if name not in SWITCHES:
        raise SwitchError(f"unknown switch {name!r}; known: {sorted(SWITCHES)}")
    changes = SWITCHES[name].change(policy)
    saved = {param: getattr(policy, param) for param in changes}
    return policy.evolve(**changes), saved


def switch_off(policy: Policy, saved: Mapping[str, Any]) -> Policy:
    """The policy with the values a switch replaced put back."""
    return policy.evolve(**dict(saved))
