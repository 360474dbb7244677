"""What a DP run has released: the state the accountant reads, checkpointed with the model.

Per server step the noised steps are counted by (q, z), the rate the sampled model assumes and
the stated noise multiplier; per device its contributions (the conservative model composes the
largest count; `dp_participation` caps it); the adaptive clip in force; and, for the step in
progress (a FedBuff buffer), how many of its updates were within the clip and the largest clip
any of them was clipped with (the noise must cover the largest sensitivity of the step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedasync.shared.policy import Policy, PrivacyModel
from fedasync.shared.privacy import accounting


class PrivacyError(ValueError):
    """A DP policy the state cannot decide under (no secret to draw the noise from)."""


@dataclass(slots=True, eq=False)
class PrivacySpent:
    """The privacy a run has spent so far (the accountant's input), and the adaptive clip."""

    #: (q, z) → noised server steps taken with them, in the order first seen
    steps: dict[tuple[float, float], int] = field(default_factory=dict)
    #: client id → updates of it taken in (contributions)
    contributions: dict[str, int] = field(default_factory=dict)
    #: the largest value in `contributions`
    most: int = 0
    #: the smallest noise multiplier z any step used; None before the first
    z_min: float | None = None
    #: the adaptive clip in force; None: `policy.dp_clip` (fixed clip, or before the first step)
    clip: float | None = None
    #: updates of the step in progress whose norm was within the clip (adaptive clip's count)
    within: int = 0
    #: the largest clip an update of the step in progress was clipped with (0: none yet)
    step_clip: float = 0.0

    @property
    def empty(self) -> bool:
        """Nothing spent and nothing adapted: a run without DP, whose checkpoint omits it."""
        return not self.steps and not self.contributions and self.clip is None

    def clip_norm(self, policy: Policy) -> float:
        """C, the clip an update is clipped to now."""
        assert policy.dp_clip is not None
        if policy.dp_quantile is not None and self.clip is not None:
            return self.clip
        return policy.dp_clip

    def capped(self, client: str, policy: Policy) -> bool:
        """`client` has made `dp_participation` contributions already."""
        cap = policy.dp_participation
        return cap is not None and self.contributions.get(client, 0) >= cap

    def contribute(self, client: str, bound: float, within: bool) -> None:
        """Count an update of `client` taken in, clipped to `bound` (`within`: not scaled)."""
        count = self.contributions.get(client, 0) + 1
        self.contributions[client] = count
        self.most = max(self.most, count)
        self.within += within
        self.step_clip = max(self.step_clip, bound)

    def stepped(self, policy: Policy, clip: float | None) -> None:
        """Count a noised server step under `policy`; `clip` is the adaptive clip after it."""
        key = (rate(policy), policy.dp_noise)
        self.steps[key] = self.steps.get(key, 0) + 1
        self.z_min = policy.dp_noise if self.z_min is None else min(self.z_min, policy.dp_noise)
        self.clip = clip
        self.within = 0
        self.step_clip = 0.0

    # ----------------------------------------------------------------------------- ε
    def epsilon(self, policy: Policy) -> tuple[float | None, float | None]:
        """(sampled ε, conservative ε) at `policy.dp_delta`; sampled None without N."""
        sampled = None
        if policy.dp_population is not None:
            sampled = accounting.rdp_epsilon(self.sampled_steps(), policy.dp_delta)
        conservative = accounting.rdp_epsilon(self.conservative_steps(policy), policy.dp_delta)
        return sampled, conservative

    def prospective(self, policy: Policy, client: str, steps: bool) -> float:
        """ε under `policy.privacy_model` once an update of `client` is taken in (and, when
        `steps`, the server step it completes is taken): what the budget is checked against."""
        if policy.privacy_model is PrivacyModel.SAMPLED:
            if not steps:
                return accounting.rdp_epsilon(self.sampled_steps(), policy.dp_delta)
            key = (rate(policy), policy.dp_noise)
            more = dict(self.steps)
            more[key] = more.get(key, 0) + 1
            return accounting.rdp_epsilon(_sampled(more), policy.dp_delta)
        most = max(self.most, self.contributions.get(client, 0) + 1)
        z = policy.dp_noise if self.z_min is None else min(self.z_min, policy.dp_noise)
        return accounting.rdp_epsilon(((1.0, z, most),), policy.dp_delta)

    def sampled_steps(self) -> accounting.Steps:
        """The steps as the sampled model composes them."""
        return _sampled(self.steps)

    def conservative_steps(self, policy: Policy) -> accounting.Steps:
        """The conservative model's composition: Gaussian(smallest z) × the largest count
        (z of `policy` for contributions whose step is still to come)."""
        if not self.most:
            return ()
        z = policy.dp_noise if self.z_min is None else min(self.z_min, policy.dp_noise)
        return ((1.0, z, self.most),)

    def pld(self, policy: Policy) -> tuple[float | None, float]:
        """(sampled, conservative) ε by PLD accounting: tighter, slower; for summaries."""
        sampled = None
        if policy.dp_population is not None:
            sampled = accounting.pld_epsilon(self.sampled_steps(), policy.dp_delta)
        return sampled, accounting.pld_epsilon(self.conservative_steps(policy), policy.dp_delta)

    def summary(self, policy: Policy) -> dict[str, Any]:
        """What a run spent, for summaries (the simulator's, `up`'s): ε under both models at
        δ by RDP (what the core counts live) and by PLD (tighter; computed here, once), and
        what the accountant composed."""
        sampled, conservative = self.epsilon(policy)
        pld_sampled, pld_conservative = self.pld(policy)
        return {
            "delta": policy.dp_delta,
            "model": policy.privacy_model.value,
            "budget": policy.privacy_budget,
            "epsilon_sampled": sampled,
            "epsilon_conservative": conservative,
            "pld_epsilon_sampled": pld_sampled,
            "pld_epsilon_conservative": pld_conservative,
            "noise_multiplier": policy.dp_noise,
            "clip": self.clip_norm(policy),
            "noised_steps": sum(self.steps.values()),
            "most_contributions": self.most,
            "devices_contributing": len(self.contributions),
        }

    # ----------------------------------------------------------------------------- checkpoint
    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": [[q, z, n] for (q, z), n in self.steps.items()],
            "contributions": sorted([c, n] for c, n in self.contributions.items()),
            "z_min": self.z_min,
            "clip": self.clip,
            "within": self.within,
            "step_clip": self.step_clip,
        }

    @classmethod
    def from_dict(cls, data: Any) -> PrivacySpent:
        contributions = {str(c): int(n) for c, n in data["contributions"]}
        z_min = data["z_min"]
        clip = data["clip"]
        return cls(
            {(float(q), float(z)): int(n) for q, z, n in data["steps"]},
            contributions,
            max(contributions.values(), default=0),
            None if z_min is None else float(z_min),
            None if clip is None else float(clip),
            int(data["within"]),
            float(data["step_clip"]),
        )


def rate(policy: Policy) -> float:
    """q of a server step under the sampled model: K/N (1/N in FedAsync); 1 without N."""
    if policy.dp_population is None:
        return 1.0
    return min(1.0, policy.step_size / policy.dp_population)


def _sampled(steps: dict[tuple[float, float], int]) -> accounting.Steps:
    return tuple((q, z, n) for (q, z), n in steps.items())
