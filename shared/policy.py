"""The mixing policy in force: an immutable, versioned value, and the one schema of its fields.

Every change of the policy is a new value with a higher version, and every decision records the
version that made it, so a ledger can say which settings decided any update.

Each field is declared here once, with its default, range, description and scope (`param()`);
`SCHEMA` reads them back. The settings (FEDASYNC_POLICY__*), the simulator's algorithm tables,
the `fedasync up` flags, the control API and the docs table are all derived from it, and a mode
(`fedbuff`) means the same thing in each of them through `apply_mode_preset`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum
from typing import Any

from fedasync.shared import staleness
from fedasync.shared.params import (
    MEMORY_CLIENTS_LIMIT,
    NORM_MIN_HISTORY,
    NORM_WINDOW_LIMIT,
    PARAM_KEY,
    TAU_MAX_LIMIT,
    Conflict,
    Param,
    ParamError,
    Range,
    Scope,
    param,
)
from fedasync.shared.staleness import Decay


class Mode(StrEnum):
    """How accepted updates reach the model (shared/modes/ has each rule's formula)."""

    #: mix each update into the model at once: x ← (1 − α)x + α·x_new
    FEDASYNC = "fedasync"
    #: buffer K staleness-weighted deltas, then take one server step (Nguyen et al. 2022)
    FEDBUFF = "fedbuff"
    #: keep every client's latest delta; every K updates step with their average over all
    #: clients, so a slow client's contribution stays until it sends a new one (MIFA, Gu et al.
    #: 2021)
    MEMORY = "memory"
    #: clients ranked into latency tiers, FedAvg within a tier (K updates a round), the global
    #: model a weighted average of the tiers' latest models, slower tiers weighted up (FedAT,
    #: Chai et al. 2021)
    TIERED = "tiered"
    #: FedBuff whose deltas are weighted by the inverse of their client's share of all updates
    FEDBUFF_FAIR = "fedbuff-fair"


class ServerOptimizer(StrEnum):
    """The rule a FedBuff server step applies the buffer's mean delta with
    (shared/server_optimizer.py has each rule's formula; declared here, with the policy's other
    choices, so that reading the schema needs no numpy)."""

    SGD = "sgd"
    MOMENTUM = "momentum"
    ADAM = "adam"


class PrivacyModel(StrEnum):
    """Which ε the privacy budget counts (shared/privacy/accounting.py states both models)."""

    #: no amplification: each device's own contributions composed, up to the participation cap
    CONSERVATIVE = "conservative"
    #: each server step a Poisson sample of K of the N enrolled devices (q = K/N), amplified
    SAMPLED = "sampled"


#: the modes differential privacy applies to: those that take in one clipped delta per update
DP_MODES = frozenset({Mode.FEDASYNC, Mode.FEDBUFF, Mode.FEDBUFF_FAIR})
#: the fields that may not change once a run has started with DP (its accounting assumes them)
_DP_FIXED = ("mode", "dp_quantile", "dp_population", "privacy_model")


class NormAction(StrEnum):
    """What the poisoning bound does with an update whose delta norm exceeds it."""

    #: refuse it (a rejection with reason `norm_bound`)
    REJECT = "reject"
    #: scale its delta down to the bound and apply it
    CLIP = "clip"


class RobustRule(StrEnum):
    """What a buffered server step (fedbuff, fedbuff-fair) takes of its K deltas
    (shared/robust.py has each rule's formula)."""

    #: their weighted mean: FedBuff as published
    MEAN = "mean"
    #: the coordinate-wise median
    MEDIAN = "median"
    #: the coordinate-wise mean once the β·K lowest and highest values are left out
    TRIMMED_MEAN = "trimmed_mean"
    #: the one delta nearest to its n − f − 2 nearest others (Blanchard et al. 2017)
    KRUM = "krum"
    #: the mean of the m deltas Krum scores best
    MULTI_KRUM = "multi_krum"


#: the modes whose server step a robust rule replaces the mean of
BUFFERED = frozenset({"fedbuff", "fedbuff-fair"})


# Bounds are chosen so that α = α0·s(τ) stays a positive float64 for every τ ≤ TAU_MAX_LIMIT (no
# underflow to zero), which the property tests check.
@dataclass(frozen=True, slots=True, order=True)
class Policy:
    """Mixing settings. Ordered by version first, so `max(policies)` is the newest."""

    version: int = param(
        0,
        "raised by one with every change; each decision records the version that made it",
        Range(0, 2**63 - 1, integer=True),
        Scope.VERSION,
    )
    mode: Mode = param(
        Mode.FEDASYNC,
        "how accepted updates reach the model: at once (fedasync), K buffered per step "
        "(fedbuff), a step with every client's latest delta every K (memory), latency tiers "
        "(tiered), or FedBuff weighted by each client's inverse contribution rate (fedbuff-fair)",
    )
    decay: Decay = param(Decay.POLYNOMIAL, "the staleness rule s(τ) that discounts α0")
    alpha0: float = param(0.6, "α0, the mixing weight at τ = 0", Range(0.001, 1.0))
    gamma: float = param(
        0.6, "γ of the polynomial and progress rules", Range(0.0, 10.0, low_open=True)
    )
    lam: float = param(0.9, "λ of the exponential rule", Range(0.5, 1.0))
    hinge_a: float = param(10.0, "a of the hinge rule", Range(0.0, 1000.0, low_open=True))
    hinge_b: int = param(4, "b of the hinge rule", Range(0, TAU_MAX_LIMIT, integer=True))
    tau_max: int = param(
        10,
        "updates with τ above this are dropped (τ counts model versions: applied updates in "
        "FedAsync, server steps in the other modes)",
        Range(0, TAU_MAX_LIMIT, integer=True),
    )
    buffer_size: int = param(
        10,
        "K: updates per server step (fedbuff, fedbuff-fair, memory), per tier round (tiered)",
        Range(1, 10_000, integer=True),
    )
    memory_clients: int = param(
        1000,
        "clients the server remembers in the memory, tiered and fedbuff-fair modes (memory: "
        "each one's latest delta, 4 bytes a parameter); beyond it the least recently heard is "
        "forgotten",
        Range(1, MEMORY_CLIENTS_LIMIT, integer=True),
    )
    memory_idle: int = param(
        1000,
        "a client whose latest update was decided more than this many server steps ago is "
        "forgotten (memory: its delta leaves the average)",
        Range(1, 10**9, integer=True),
    )
    tiers: int = param(
        4,
        "tiered mode: latency tiers, equal numbers of clients ranked by the τ of their latest "
        "update",
        Range(1, 64, integer=True),
    )
    server_optimizer: ServerOptimizer = param(
        ServerOptimizer.SGD,
        "how a server step (fedbuff, fedbuff-fair, memory) applies its mean delta: plain, with "
        "momentum, or Adam (FedOpt, Reddi et al. 2021)",
    )
    server_lr: float = param(
        1.0,
        "server learning rate η of a server step (tiered: how far the model moves towards the "
        "tiers' average)",
        Range(0.0, 10.0, low_open=True),
    )
    server_momentum: float = param(
        0.9, "β of FedBuff's server momentum", Range(0.0, 1.0, high_open=True)
    )
    server_beta1: float = param(
        0.9, "β₁ of FedBuff's server Adam (first moment)", Range(0.0, 1.0, high_open=True)
    )
    server_beta2: float = param(
        0.999, "β₂ of FedBuff's server Adam (second moment)", Range(0.0, 1.0, high_open=True)
    )
    server_eps: float = param(1e-8, "ε of FedBuff's server Adam", Range(0.0, 1.0, low_open=True))
    # k < 1 would refuse or shrink most ordinary updates, so the smallest factor is 1
    norm_bound: float | None = param(
        None,
        "poisoning bound k: an update whose delta norm exceeds k × the median of the last "
        "norm_window applied ones is rejected or clipped; null: off",
        Range(1.0, 1000.0, optional=True),
    )
    norm_action: NormAction = param(
        NormAction.REJECT, "what the poisoning bound does with an update beyond it"
    )
    norm_window: int = param(
        20,
        "applied updates the poisoning bound's median is taken over",
        Range(NORM_MIN_HISTORY, NORM_WINDOW_LIMIT, integer=True),
    )
    robust: RobustRule = param(
        RobustRule.MEAN,
        "what a buffered server step (fedbuff, fedbuff-fair) takes of its K deltas: their mean, "
        "the coordinate-wise median or trimmed mean, Krum's one delta or multi-Krum's mean of "
        "the m best (defences against malicious devices)",
        quiet=True,
    )
    robust_trim: float = param(
        0.1,
        "β of the trimmed mean: the fraction of the K values left out at each end, per coordinate",
        Range(0.0, 0.5, high_open=True),
        quiet=True,
    )
    robust_byzantine: int = param(
        1,
        "f, the malicious devices Krum and multi-Krum assume among a buffer's K (K > 2f + 2)",
        Range(0, 4999, integer=True),
        quiet=True,
    )
    robust_select: int | None = param(
        None,
        "m, the deltas multi-Krum averages (at most K); null: K − f",
        Range(1, 10_000, integer=True, optional=True),
        quiet=True,
    )
    zeno_margin: float | None = param(
        None,
        "Zeno++ ε (fedasync only): an update is rejected when its descent score on the "
        "server's held-out set, γ⟨v, g̃⟩ − ρ‖g̃‖², is below −γε; null: off",
        Range(0.0, 1e6, optional=True),
        quiet=True,
    )
    zeno_rho: float = param(
        0.001,
        "Zeno++ ρ, the weight of the candidate's squared norm in its score",
        Range(0.0, 1e6),
        quiet=True,
    )
    zeno_lr: float = param(
        0.1,
        "Zeno++ γ, the step size the score assumes",
        Range(0.0, 1e6, low_open=True),
        quiet=True,
    )
    zeno_every: int = param(
        10,
        "Zeno++: server steps between two refreshes of the validation gradient v",
        Range(1, 10**9, integer=True),
        quiet=True,
    )
    paused: bool = param(
        False,
        "the aggregator decides nothing; updates wait in the stream, none is lost",
        scope=Scope.RUNTIME,
    )
    ingest_paused: bool = param(
        False,
        "the ingest service answers 503 (retry later); what it took is still decided; devices "
        "publishing straight to Redis are not affected",
        scope=Scope.RUNTIME,
    )
    max_updates: int | None = param(
        None,
        "budget set at runtime: applied updates; null: the configured budget holds",
        Range(1, 2**63 - 1, integer=True, optional=True),
        Scope.RUNTIME,
    )
    max_seconds: float | None = param(
        None,
        "budget set at runtime: wall-clock seconds; null: the configured budget holds",
        Range(0.0, 1e12, low_open=True, optional=True),
        Scope.RUNTIME,
    )
    stopped: bool = param(
        False,
        "the run is stopped for good: the aggregator closes it (training_done reason stopped); "
        "one-way, a stopped run cannot be started again",
        scope=Scope.RUNTIME,
        quiet=True,
    )

    # user-level differential privacy (shared/privacy/): every field quiet, so that a run
    # without DP records the policy it always has
    dp_clip: float | None = param(
        None,
        "C, the user-level clip norm of a device's delta (x_new − x_base), the start of the "
        "adaptive clip; null: differential privacy off",
        Range(0.0, 1e6, low_open=True, optional=True),
        quiet=True,
    )
    dp_noise: float = param(
        1.0,
        "z, the noise multiplier: Gaussian noise of std z·C is added per server step",
        Range(0.0, 1e3, low_open=True),
        quiet=True,
    )
    dp_quantile: float | None = param(
        None,
        "γ, the target quantile of update norms the adaptive clip tracks (Andrew et al. 2021); "
        "null: the clip stays C",
        Range(0.0, 1.0, optional=True),
        quiet=True,
    )
    dp_clip_lr: float = param(
        0.2,
        "η_C of the adaptive clip's geometric update C ← C·exp(−η_C·(b̃ − γ))",
        Range(0.0, 10.0, low_open=True),
        quiet=True,
    )
    dp_count_noise: float | None = param(
        None,
        "σ_b, the std of the noise on the count of unclipped updates (adaptive clip); null: "
        "K/20, the paper's choice (K = 1 in FedAsync)",
        Range(0.0, 1e6, low_open=True, optional=True),
        quiet=True,
    )
    dp_delta: float = param(
        1e-5, "δ at which ε is reported", Range(0.0, 1.0, low_open=True, high_open=True), quiet=True
    )
    dp_population: int | None = param(
        None,
        "N, the enrolled devices, for the sampled model (q = K/N; FedAsync q = 1/N); null: the "
        "sampled ε is not reported",
        Range(1, 10**12, integer=True, optional=True),
        quiet=True,
    )
    dp_participation: int | None = param(
        None,
        "the most contributions a device may make (conservative model); updates past it are "
        "dropped (participation_cap); null: no cap",
        Range(1, 10**12, integer=True, optional=True),
        quiet=True,
    )
    privacy_budget: float | None = param(
        None,
        "target ε: training closes (privacy_budget) before a step that would take ε under "
        "privacy_model past it; may be lowered at runtime, never raised or unset",
        Range(0.0, 1e6, low_open=True, optional=True),
        quiet=True,
    )
    privacy_model: PrivacyModel = param(
        PrivacyModel.CONSERVATIVE,
        "which ε the privacy budget counts: conservative (no amplification) or sampled",
        quiet=True,
    )

    def __post_init__(self) -> None:
        for spec in SCHEMA:
            object.__setattr__(self, spec.name, spec.normalise(getattr(self, spec.name)))
        _check_robust(self)
        if self.zeno_margin is not None and self.mode is not Mode.FEDASYNC:
            raise Conflict(
                "zeno_margin",
                self.zeno_margin,
                "null unless mode is fedasync (Zeno++ scores updates one at a time; the "
                "buffered modes have their robust rules)",
            )
        if self.zeno_margin is not None and self.dp_clip is not None:
            raise Conflict(
                "zeno_margin",
                self.zeno_margin,
                "null while DP is on (dp_clip set): Zeno++ reads each update's own delta to "
                "accept or refuse it, which DP's accounting does not cover",
            )
        if self.dp_clip is not None:
            _check_private(self)
        elif self.privacy_budget is not None:
            raise Conflict(
                "privacy_budget",
                self.privacy_budget,
                "null without dp_clip: a privacy budget counts the ε of differential privacy",
            )

    @property
    def private(self) -> bool:
        """Differential privacy is on (`dp_clip` set)."""
        return self.dp_clip is not None

    @property
    def count_noise(self) -> float:
        """σ_b of the adaptive clip's noised count: `dp_count_noise`, else K/20 (Andrew et
        al. 2021, section 3), K the updates per server step (1 in FedAsync)."""
        if self.dp_count_noise is not None:
            return self.dp_count_noise
        return self.step_size / 20.0

    @property
    def step_size(self) -> int:
        """Updates per server step: K in the buffered modes, 1 in FedAsync."""
        return 1 if self.mode is Mode.FEDASYNC else self.buffer_size

    def staleness(self, tau: int, t: int) -> float:
        """s(τ) under this policy's rule; t is the current version (used by the progress rule)."""
        return staleness.factor(
            self.decay,
            tau,
            t=t,
            gamma=self.gamma,
            lam=self.lam,
            hinge_a=self.hinge_a,
            hinge_b=self.hinge_b,
        )

    def alpha(self, tau: int, t: int) -> float:
        """α = α0·s(τ), computed afresh from α0 for every update."""
        return self.alpha0 * self.staleness(tau, t)

    def is_stale(self, tau: int) -> bool:
        """Updates staler than τ_max are dropped, never applied with a tiny α."""
        return staleness.clamp_tau(tau) > self.tau_max

    def evolve(self, **changes: Any) -> Policy:
        """A new policy with `changes` applied and the version raised by one."""
        if "version" in changes:
            raise ParamError("version", changes["version"], "set by evolve(), not by the caller")
        _known(changes, CHANGEABLE)
        if self.stopped and changes.get("stopped", True) is not True:
            raise Conflict("stopped", changes["stopped"], "true: a stopped run stays stopped")
        if self.private or changes.get("dp_clip") is not None:
            _check_private_change(self, changes)
        return replace(self, version=self.version + 1, **changes)

    def to_dict(self, *, complete: bool = False) -> dict[str, Any]:
        """Plain JSON/msgpack-safe form (enums as their string values), as recorded: quiet
        fields (`Param.quiet`) at their default are left out (`from_dict` gives them their
        default back), so policy logs and simulator outputs of runs that do not use them are as
        they were; `complete` keeps every field (what the control API shows)."""
        out = asdict(self)
        if not complete:
            for name in QUIET:
                if out[name] == FIELDS[name].default:
                    del out[name]
        for name, value in out.items():
            if isinstance(value, StrEnum):
                out[name] = value.value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Policy:
        """Strict inverse of to_dict: unknown keys are refused, missing keys take defaults."""
        _known(data, tuple(spec.name for spec in SCHEMA))
        return cls(**dict(data))

    @classmethod
    def configured(cls, explicit: Mapping[str, Any], version: int = 0) -> Policy:
        """The policy a user asked for before a run: their values, the rest from their mode."""
        _known(explicit, START)
        return cls(version=version, **apply_mode_preset(explicit))

    @classmethod
    def fedbuff(cls, **explicit: Any) -> Policy:
        """FedBuff as `mode = fedbuff` means everywhere (MODE_PRESETS), with `explicit` on top."""
        return cls.configured({"mode": Mode.FEDBUFF, **explicit})


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One policy field as the schema declares it: the single source every other form reads."""

    name: str
    #: bool, int, float or an enum
    kind: type
    #: None is a value too (a feature that is off, a budget left to the configuration)
    optional: bool
    default: Any
    description: str
    #: the range of a number; None for enums and flags
    allowed: Range | None
    scope: Scope
    #: left out of `Policy.to_dict()` at its default
    quiet: bool = False

    @property
    def choices(self) -> tuple[str, ...]:
        """The values an enum field takes, as written in settings and configs; () otherwise."""
        if issubclass(self.kind, StrEnum):
            return tuple(member.value for member in self.kind)
        return ()

    def normalise(self, value: object) -> Any:
        """`value` as the policy holds it (an enum, a float), or ParamError naming the range."""
        if value is None and self.optional:
            return None
        if issubclass(self.kind, StrEnum):
            return _enum(self.kind, self.name, value)
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ParamError(self.name, value, "true or false")
            return value
        if self.allowed is None:  # pragma: no cover - _schema() refuses such a field
            raise TypeError(f"policy field {self.name} has no range")
        self.allowed.check(self.name, value)  # type: ignore[arg-type]  # check() says if not
        return float(value) if self.kind is float else value  # type: ignore[arg-type]


def _schema() -> tuple[FieldSpec, ...]:
    """Every field of `Policy` with its type and `param()` metadata, in declaration order."""
    hints = typing.get_type_hints(Policy)
    out = []
    for f in fields(Policy):
        meta = f.metadata.get(PARAM_KEY)
        if not isinstance(meta, Param):
            raise TypeError(f"policy field {f.name} is not declared with param()")
        kind, optional = _unwrap(hints[f.name])
        numeric = kind in (int, float)
        if numeric != (meta.allowed is not None) or (
            meta.allowed is not None and meta.allowed.optional != optional
        ):
            raise TypeError(f"policy field {f.name}: a number needs a range, optional iff it is")
        out.append(
            FieldSpec(
                f.name,
                kind,
                optional,
                f.default,
                meta.description,
                meta.allowed,
                meta.scope,
                meta.quiet,
            )
        )
    return tuple(out)


def _unwrap(hint: Any) -> tuple[type, bool]:
    """(the type, whether None is allowed) of `T` or `T | None`."""
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:  # pragma: no cover - no such field
            raise TypeError(f"unsupported policy field type {hint}")
        return args[0], True
    return hint, False


#: every policy field, in declaration order
SCHEMA: tuple[FieldSpec, ...] = _schema()
FIELDS: Mapping[str, FieldSpec] = types.MappingProxyType({s.name: s for s in SCHEMA})
#: the fields `Policy.to_dict()` leaves out at their default
QUIET: tuple[str, ...] = tuple(s.name for s in SCHEMA if s.quiet)
#: the fields chosen before a run: settings, `fedasync up` flags, simulator keys
START: tuple[str, ...] = tuple(s.name for s in SCHEMA if s.scope is Scope.START)
#: the fields a runtime change (`evolve`, PATCH /v1/policy) may name
CHANGEABLE: tuple[str, ...] = tuple(s.name for s in SCHEMA if s.scope is not Scope.VERSION)
#: ranges of the numeric fields other than the runtime budgets (the control API lists them)
POLICY_RANGES: Mapping[str, Range] = types.MappingProxyType(
    {s.name: s.allowed for s in SCHEMA if s.allowed is not None and s.scope is not Scope.RUNTIME}
)

#: What naming a mode means, wherever it is named (FEDASYNC_POLICY__MODE, `fedasync up --mode`, a
#: simulator algorithm's `kind`, `Policy.fedbuff()`): defaults for the fields the user leaves
#: unset. FedBuff as published (Nguyen et al. 2022) weighs each delta by 1/√(1 + τ) (polynomial,
#: γ = 0.5), τ counting server steps as FedAsync's τ counts its one-update steps; so τ_max keeps
#: the schema's 10: ten server steps, the 100 applied updates it meant at K = 10 when τ counted
#: applied updates.
MODE_PRESETS: Mapping[Mode, Mapping[str, Any]] = types.MappingProxyType(
    {
        Mode.FEDASYNC: types.MappingProxyType({}),
        Mode.FEDBUFF: types.MappingProxyType({"decay": Decay.POLYNOMIAL, "gamma": 0.5}),
        # MIFA applies a memorised update whatever its age: no staleness discount; η 0.2 is
        # stable on the write-up's fleet where 1.0 diverged (docs/experiments.md, section 7);
        # τ_max 300 server steps keeps a 10-minute device of that fleet (τ up to 291 at K = 10
        # over five seeds) and bounds the base models kept (τ_max + 1 of them, as in FedBuff)
        Mode.MEMORY: types.MappingProxyType(
            {"decay": Decay.CONSTANT, "buffer_size": 10, "server_lr": 0.2, "tau_max": 300}
        ),
        # tiered keeps no base models, so a large τ_max costs nothing
        Mode.TIERED: types.MappingProxyType({"buffer_size": 10, "tau_max": 1000}),
        Mode.FEDBUFF_FAIR: types.MappingProxyType(
            {"decay": Decay.POLYNOMIAL, "gamma": 0.5, "buffer_size": 100, "tau_max": 100}
        ),
    }
)


def apply_mode_preset(explicit: Mapping[str, Any]) -> dict[str, Any]:
    """Every start field's value: `explicit` as given, the rest from its mode's preset, else the
    schema default. Values are not checked here (an unknown mode has no preset); whoever builds
    the policy from them checks them and names the key the user wrote."""
    values = {name: FIELDS[name].default for name in START}
    try:
        mode = Mode(explicit.get("mode", values["mode"]))
    except ValueError:
        mode = None
    if mode is not None:
        values.update(MODE_PRESETS[mode])
    values.update(explicit)
    return values


def _check_robust(policy: Policy) -> None:
    """The robust rule's limits that depend on other fields: a clear error, never a step the
    rule cannot take (shared/robust.py)."""
    rule = policy.robust
    if rule is RobustRule.MEAN:
        return
    if policy.mode.value not in BUFFERED:
        raise Conflict(
            "robust",
            rule.value,
            f"mean unless mode is one of {sorted(BUFFERED)} (mode = "
            f"{policy.mode.value}; set robust = mean with the mode)",
        )
    # DP's sensitivity analysis assumes the mean of clipped deltas
    if policy.dp_clip is not None:
        raise Conflict(
            "robust",
            rule.value,
            "mean while DP is on (dp_clip set): DP's noise is calibrated "
            "to the mean of clipped deltas",
        )
    k, f = policy.buffer_size, policy.robust_byzantine
    if rule in (RobustRule.KRUM, RobustRule.MULTI_KRUM) and k <= 2 * f + 2:
        most = f"at most {(k - 3) // 2}" if k >= 3 else "none"
        raise Conflict(
            "robust_byzantine", f, f"{most} with buffer_size {k} (Krum needs K > 2f + 2)"
        )
    select = policy.robust_select
    if rule is RobustRule.MULTI_KRUM and select is not None and select > k:
        raise Conflict("robust_select", select, f"at most buffer_size = {k}, or null")


def _check_private(policy: Policy) -> None:
    """The combinations differential privacy cannot be stated for, refused by name."""
    if policy.mode not in DP_MODES:
        raise Conflict(
            "dp_clip",
            policy.dp_clip,
            f"null in mode {policy.mode.value}: differential privacy applies to modes "
            f"{sorted(m.value for m in DP_MODES)} (memory and tiered keep and reuse each "
            "client's delta across server steps, which the accountant does not cover)",
        )
    if policy.norm_bound is not None:
        raise Conflict(
            "norm_bound",
            policy.norm_bound,
            "null with dp_clip set: DP clips every delta to C already, and the poisoning "
            "bound's median of other devices' norms is not private",
        )
    if policy.privacy_model is PrivacyModel.SAMPLED and policy.dp_population is None:
        raise Conflict(
            "dp_population",
            None,
            "a number of devices when privacy_model = sampled (q = K/N needs N)",
        )
    if policy.dp_population is not None and policy.step_size > policy.dp_population:
        raise Conflict(
            "dp_population",
            policy.dp_population,
            f"at least K = {policy.step_size} (a step samples K of the N devices)",
        )
    if policy.dp_quantile is not None and not policy.dp_noise < 2 * policy.count_noise:
        raise Conflict(
            "dp_noise",
            policy.dp_noise,
            f"below 2·σ_b = {2 * policy.count_noise:g} with adaptive clipping (Andrew et al. "
            "2021: the delta's noise multiplier (z⁻² − (2σ_b)⁻²)^(-1/2) must exist); raise "
            "dp_count_noise or lower dp_noise",
        )


def _check_private_change(policy: Policy, changes: Mapping[str, Any]) -> None:
    """What a runtime change may not do to a run with DP: what has been spent is accounted
    under the settings it was spent with."""
    if not policy.private:
        raise Conflict(
            "dp_clip", changes["dp_clip"], "null: differential privacy is chosen before a run"
        )
    if "dp_clip" in changes and changes["dp_clip"] is None:
        raise Conflict("dp_clip", None, "a clip norm: DP cannot be turned off during a run")
    for name in _DP_FIXED:
        if name in changes and changes[name] != getattr(policy, name):
            raise Conflict(
                name, changes[name], f"{getattr(policy, name)!s}: fixed during a run with DP"
            )
    if "privacy_budget" in changes and policy.privacy_budget is not None:
        new = changes["privacy_budget"]
        if new is None or (
            isinstance(new, (int, float))
            and not isinstance(new, bool)
            and new > policy.privacy_budget
        ):
            raise Conflict(
                "privacy_budget",
                new,
                f"at most {policy.privacy_budget:g}: a privacy budget may be lowered, never "
                "raised or unset",
            )


def _known(data: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise ParamError(str(key), data[key], f"one of {sorted(allowed)}")


def _enum(kind: type[StrEnum], param: str, value: object) -> Any:
    try:
        return kind(value)  # type: ignore[arg-type]  # any value may be tried; ValueError if bad
    except ValueError:
        raise ParamError(param, value, f"one of {[m.value for m in kind]}") from None
