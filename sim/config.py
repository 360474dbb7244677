"""A simulation's configuration: TOML or YAML, optionally on top of a named preset, validated.

Every field has a default, a file only states what differs, and unknown keys are errors, so a
misspelt setting is never silently ignored. An algorithm's policy fields are the core's schema
(shared/policy.py), with its defaults, ranges and mode presets, the same the services apply.
"""

from __future__ import annotations

import itertools
import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)

from fedasync.learning.tasks import TaskName
from fedasync.shared.params import ParamError
from fedasync.shared.policy import (
    FIELDS,
    QUIET,
    START,
    Mode,
    Policy,
    PrivacyModel,
    apply_mode_preset,
)
from fedasync.shared.policy_schema import policy_model
from fedasync.shared.tree import TreeShape, tree_problem


class ConfigError(ValueError):
    """A configuration that cannot be run; the message names each bad key and why."""


#: the meaning of every latency kind's `jitter`
_JITTER = "spread of one run's duration around the device's median (log-normal σ)"
#: the meaning of every algorithm's `name`
_NAME = "its name in the outputs (default: its kind); names must be unique"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskConfig(Strict):
    """A built-in name or `package.module:attribute`; only the form is checked here, the task is
    built (its module imported) by `build_world`, with the same resolver the services use."""

    name: TaskName = Field(
        "digits", description="a built-in task (digits, linear) or `package.module:attribute`"
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments of the task, e.g. `{hidden = 32}` for digits",
    )


class DataConfig(Strict):
    partition: Literal["iid", "dirichlet", "shards", "rare_class_on_slow"] = Field(
        "iid", description="how labels are spread over the devices"
    )
    beta: float = Field(0.5, gt=0, description="Dirichlet concentration")
    classes_per_device: int = Field(2, ge=1, description="classes each device holds (shards)")
    rare_class: int = Field(0, ge=0, description="the class only slow devices hold")
    rare_keep: float = Field(1.0, gt=0, le=1, description="share of the rare class kept")
    slow_share: float = Field(0.1, gt=0, le=1, description="the slowest devices by median")


class LongTailLatency(Strict):
    """The write-up's mixture; `tiers` are (share of devices, median seconds)."""

    kind: Literal["longtail"]
    tiers: list[tuple[float, float]] = Field(
        [(0.70, 30.0), (0.20, 90.0), (0.08, 180.0), (0.02, 600.0)],
        description="(share of devices, median seconds of a run) per tier",
    )
    jitter: float = Field(0.2, ge=0, description=_JITTER)

    @model_validator(mode="after")
    def _positive(self) -> LongTailLatency:
        if not self.tiers or any(s <= 0 or m <= 0 for s, m in self.tiers):
            raise ValueError("tiers must be non-empty (share > 0, median_s > 0) pairs")
        return self


class LogNormalLatency(Strict):
    kind: Literal["lognormal"]
    median_s: float = Field(60.0, gt=0, description="median over the fleet of a device's median")
    sigma: float = Field(0.8, ge=0, description="σ of the log of the devices' medians")
    jitter: float = Field(0.2, ge=0, description=_JITTER)


class ParetoLatency(Strict):
    kind: Literal["pareto"]
    scale_s: float = Field(30.0, gt=0, description="the smallest device median, seconds")
    shape: float = Field(1.5, gt=0, description="Pareto shape: smaller is a heavier tail")
    jitter: float = Field(0.2, ge=0, description=_JITTER)


class ExponentialLatency(Strict):
    kind: Literal["exponential"]
    mean_s: float = Field(60.0, gt=0, description="mean of the devices' medians, seconds")
    minimum_s: float = Field(1.0, gt=0, description="no device median below this, seconds")
    jitter: float = Field(0.2, ge=0, description=_JITTER)


class FixedLatency(Strict):
    """Exactly these medians per device (cycled), for closed-form checks."""

    kind: Literal["fixed"]
    medians_s: list[Annotated[float, Field(gt=0)]] = Field(
        min_length=1, description="each device's median seconds, cycled over the fleet"
    )
    jitter: float = Field(0.0, ge=0, description=_JITTER)


class TraceLatency(Strict):
    """A CSV with columns device,duration_s; each device replays its durations in order."""

    kind: Literal["trace"]
    path: str = Field(description="the CSV, relative to the config file's folder")


Latency = Annotated[
    LongTailLatency
    | LogNormalLatency
    | ParetoLatency
    | ExponentialLatency
    | FixedLatency
    | TraceLatency,
    Field(discriminator="kind"),
]


class AlwaysAvailable(Strict):
    kind: Literal["always"]


class IntermittentAvailability(Strict):
    """Alternating online/offline periods, exponential with these means."""

    kind: Literal["intermittent"]
    online_mean_s: float = Field(3600.0, gt=0, description="mean online period, seconds")
    offline_mean_s: float = Field(600.0, gt=0, description="mean offline period, seconds")


class TraceAvailability(Strict):
    """A CSV with columns device,online_from_s,online_until_s; offline outside the windows."""

    kind: Literal["trace"]
    path: str = Field(description="the CSV, relative to the config file's folder")


Availability = Annotated[
    AlwaysAvailable | IntermittentAvailability | TraceAvailability, Field(discriminator="kind")
]


class SpeedPhase(Strict):
    """A stretch of virtual time in which every run that starts takes `latency_factor` times as
    long as its drawn latency: below 1 the fleet speeds up (the update rate rises, as when many
    devices join or a network gets faster), above 1 it slows down. The latency draws themselves
    are unchanged, so a run is the same run with or without the phase, only shorter or longer."""

    from_s: float = Field(ge=0, description="simulated seconds at which the phase starts")
    until_s: float = Field(gt=0, description="simulated seconds at which it ends")
    latency_factor: float = Field(gt=0, description="multiplies the latency of runs started in it")

    @model_validator(mode="after")
    def _ordered(self) -> SpeedPhase:
        if self.until_s <= self.from_s:
            raise ValueError("until_s must be after from_s")
        return self


class FleetConfig(Strict):
    devices: int = Field(100, ge=1, description="devices in the fleet")
    latency: Latency = Field(
        LongTailLatency(kind="longtail"), description="how long each device's runs take"
    )
    availability: Availability = Field(
        AlwaysAvailable(kind="always"), description="when each device is online"
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="chance a run fails mid-training")
    max_concurrency: int | None = Field(None, ge=1, description="devices training at once")
    phases: list[SpeedPhase] = Field(
        default_factory=list,
        description="speed-ups or slow-downs (e.g. an update-rate spike), not overlapping",
    )

    @model_validator(mode="after")
    def _phases_apart(self) -> FleetConfig:
        ordered = sorted(self.phases, key=lambda p: p.from_s)
        for first, second in itertools.pairwise(ordered):
            if second.from_s < first.until_s:
                raise ValueError("fleet phases must not overlap")
        return self

    def latency_factor(self, now: float) -> float:
        """The factor for a run that starts at `now` (1 outside every phase)."""
        for phase in self.phases:
            if phase.from_s <= now < phase.until_s:
                return phase.latency_factor
        return 1.0


class DPSGDConfig(Strict):
    """DP-SGD on each device (Opacus; learning/dpsgd.py): sample-level ε, each device's own."""

    noise_multiplier: float = Field(gt=0, description="σ: noise std over the clip norm")
    max_grad_norm: float = Field(1.0, gt=0, description="C: each sample's gradient clip norm")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ each device's ε is reported at")


class TrainingConfig(Strict):
    """Local training; unset values take the task's suggestion."""

    epochs: int | None = Field(None, ge=1, description="local epochs per run")
    lr: float | None = Field(None, gt=0, description="local learning rate")
    batch_size: int | None = Field(None, ge=1, description="local batch size")
    dpsgd: DPSGDConfig | None = Field(
        None, description="train with DP-SGD on every device ([training.dpsgd]); unset: off"
    )


class BudgetConfig(Strict):
    max_updates: int = Field(2000, ge=1, description="applied updates")
    max_seconds: float = Field(3600.0, gt=0, description="simulated seconds")


class EvalConfig(Strict):
    interval_s: float = Field(60.0, gt=0, description="simulated seconds between evaluations")
    target: float | None = Field(None, description="accuracy (or R²) to time")
    jitter_window: int = Field(20, ge=2, description="last evaluations for the jitter measure")


class RulesConfig(Strict):
    """The control service's automatic rules (shared/rules.py), run on virtual time.

    Built by the same `build_rules` as the control service; a rule whose thresholds are left
    unset does not run. Figures come from the same `DecisionWindow`: decisions per second over
    `window_s`, drops, per-client acceptance, and the lag (updates that arrived but are not yet
    decided, which is only ever non-zero when the algorithm sets `decide_s`).
    """

    interval_s: float = Field(10.0, gt=0, description="virtual seconds between rule evaluations")
    window_s: float = Field(60.0, gt=0, description="window the figures are measured over")
    hold_s: float = Field(0.0, ge=0, description="how long a condition must last to act")
    cooldown_s: float = Field(0.0, ge=0, description="least time between two actions of a rule")
    rate_high: float | None = Field(None, gt=0, description="decisions/s that turn the switch on")
    rate_low: float | None = Field(None, ge=0, description="decisions/s below which it turns off")
    rate_switch: Literal["raise-gamma", "lower-alpha"] = Field(
        "raise-gamma", description="what the update-rate rule turns on above `rate_high`"
    )
    lag_high: float | None = Field(None, gt=0, description="undecided updates: freshest-only on")
    lag_low: float | None = Field(None, ge=0, description="undecided updates: freshest-only off")
    max_consecutive_drops: int | None = Field(None, ge=1, description="drops in a row: alert")
    max_drop_share: float | None = Field(None, gt=0, le=1, description="drop share: alert")
    fairness_min_rate: float | None = Field(
        None, ge=0, le=1, description="acceptance under which a client raises an alert"
    )
    fairness_decisions: int = Field(20, ge=1, description="decisions per client it is judged on")

    @model_validator(mode="after")
    def _levels(self) -> RulesConfig:
        for name in ("rate", "lag"):
            high, low = getattr(self, f"{name}_high"), getattr(self, f"{name}_low")
            if (high is None) != (low is None):
                raise ValueError(f"{name}_high and {name}_low go together")
            if high is not None and low > high:
                raise ValueError(f"{name}_low must not exceed {name}_high")
        return self

    def disabled(self) -> list[str]:
        """The rules this config leaves off: those whose thresholds are unset."""
        off = []
        if self.rate_high is None:
            off.append("update-rate")
        if self.lag_high is None:
            off.append("lag")
        if self.max_consecutive_drops is None and self.max_drop_share is None:
            off.append("drops")
        if self.fairness_min_rate is None:
            off.append("fairness")
        return off


class AttackConfig(Strict):
    """Malicious devices (sim/attacks.py): a share of the fleet, drawn once from the seed, sends
    a transformed delta x_base + T(x_new − x_base) instead of its honest one."""

    kind: Literal["sign_flip", "scale", "noise", "backdoor"] = Field(
        description="sign_flip: −Δ; scale: factor·Δ; noise: Gaussian noise instead of Δ; "
        "backdoor: trains on samples stamped with a trigger and relabelled to `target`"
    )
    share: float = Field(0.2, gt=0, le=1, description="share of the devices that are malicious")
    factor: float = Field(10.0, description="scale: the factor Δ is multiplied by")
    noise_std: float = Field(1.0, gt=0, description="noise: σ of each coordinate of the noise")
    target: int = Field(0, ge=0, description="backdoor: the class triggered inputs are given")
    poison_share: float = Field(
        0.5, gt=0, le=1, description="backdoor: share of a malicious device's samples poisoned"
    )
    trigger_size: int = Field(
        4, ge=1, description="backdoor: the trigger sets the last this many features"
    )
    trigger_value: float = Field(1.0, description="backdoor: the value the trigger sets them to")


class ValidationConfig(Strict):
    """The small held-out set the server keeps for Zeno++ (`zeno_margin`): samples drawn once
    from the training set with their own stream (devices may hold them too, as in the paper)."""

    samples: int = Field(100, ge=1, description="samples in the server's held-out set")


class AsyncAlgorithmConfig(Strict):
    """What FedAsync and FedBuff share: the aggregator's speed, the operator rules, and every
    start field of the policy (added from the core's schema by `policy_model` below).

    The algorithm's `kind` is the policy's mode, and naming it means what naming the mode means
    everywhere (`apply_mode_preset`): the fields a config leaves unset take that mode's preset.
    """

    decide_s: float = Field(
        0.0,
        ge=0,
        description="virtual seconds the aggregator takes per decision (0: at once); updates "
        "arriving meanwhile wait in arrival order, like entries in the stream",
    )
    rules: RulesConfig | None = Field(
        None, description="the control service's automatic rules, on virtual time"
    )
    if TYPE_CHECKING:
        kind: str  # each algorithm's own Literal

    @model_validator(mode="before")
    @classmethod
    def _mode_preset(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        chosen = {k: v for k, v in data.items() if k in POLICY_KEYS}
        values = apply_mode_preset({"mode": data.get("kind"), **chosen})
        return {**data, **{k: v for k, v in values.items() if k in POLICY_KEYS}}

    @model_serializer(mode="wrap")
    def _leave_out_quiet(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Quiet policy fields (DP) at their default are left out, as `Policy.to_dict` leaves
        them out: a config that does not use them dumps the bytes it always has."""
        out = handler(self)
        if isinstance(out, dict):
            for name in QUIET:
                if name in out and out[name] == FIELDS[name].default:
                    del out[name]
            if "tree" in out and out["tree"] is None:  # one aggregator: the bytes it always had
                del out["tree"]
        return out

    @model_validator(mode="after")
    def _core_rules(self) -> AsyncAlgorithmConfig:
        _check_policy(lambda: self.policy(_AUTO_PLACEHOLDER))
        return self

    def policy(self, advised_tau_max: int) -> Policy:
        """The policy this algorithm runs with; `advised_tau_max` replaces `tau_max = "auto"`."""
        values = {name: getattr(self, name) for name in POLICY_KEYS}
        if values["tau_max"] == "auto":
            values["tau_max"] = advised_tau_max
        return Policy.configured({"mode": self.kind, **values})


#: the policy's start fields an algorithm table holds: all but the mode, which is its `kind`
POLICY_KEYS = tuple(name for name in START if name != "mode")
#: checks a config whose `tau_max` is "auto" before the advisor has looked at the fleet
_AUTO_PLACEHOLDER = 10

if TYPE_CHECKING:

    class _AsyncPolicyConfig(AsyncAlgorithmConfig):
        def __getattr__(self, name: str) -> Any: ...

else:
    _AsyncPolicyConfig = policy_model(
        "AsyncPolicyConfig",
        AsyncAlgorithmConfig,
        POLICY_KEYS,
        doc=AsyncAlgorithmConfig.__doc__ or "",
        #: "auto": the advisor's recommendation for this fleet (see sim/advisor.py)
        words={"tau_max": ("auto",)},
    )


class FedAsyncConfig(_AsyncPolicyConfig):
    kind: Literal["fedasync"]
    name: str | None = Field(None, description=_NAME)


class TreeConfig(Strict):
    """Hierarchical FedBuff (shared/tree.py): the devices split over `shards` leaves by client
    id, each leaf summing its shard's weighted deltas and handing the root a partial when it
    holds `leaf_flush` of them or the root's version moves; the root steps at K."""

    shards: int = Field(1, ge=1, description="S: leaves, each taking the updates of its shard")
    leaf_flush: int = Field(
        1, ge=1, description="contributions a leaf holds before it hands the root its partial"
    )

    def shape(self) -> TreeShape:
        return TreeShape(self.shards, self.leaf_flush)


class FedBuffConfig(_AsyncPolicyConfig):
    kind: Literal["fedbuff"]
    name: str | None = Field(None, description=_NAME)
    tree: TreeConfig | None = Field(
        None, description="`[algorithms.tree]`: run as a tree of leaves and a root; unset: one"
    )

    @model_validator(mode="after")
    def _tree_runs(self) -> FedBuffConfig:
        if self.tree is not None:
            problem = tree_problem(self.policy(_AUTO_PLACEHOLDER))
            if problem is not None:
                raise ValueError(problem)
            if self.decide_s > 0:
                raise ValueError("a tree does not model decide_s yet: each leaf decides at once")
        return self


class FairModeConfig(_AsyncPolicyConfig):
    """The modes that keep a slow client's data in the model (shared/modes/)."""

    kind: Literal["memory", "tiered", "fedbuff-fair"]
    name: str | None = Field(None, description=_NAME)


class FedAvgConfig(Strict):
    """Synchronous rounds: select, wait, average by sample count."""

    kind: Literal["fedavg"]
    name: str | None = Field(None, description=_NAME)
    clients_per_round: int = Field(10, ge=1, description="m: results a round waits for")
    over_selection: float = Field(
        0.0, ge=0, description="select ceil(m·(1 + over_selection)), keep the first m to finish"
    )
    deadline_s: float | None = Field(
        None, gt=0, description="results later than this after the round's start are not awaited"
    )
    min_clients: int = Field(1, ge=1, description="fewer online devices: wait")
    dp_clip: float | None = Field(
        None,
        gt=0,
        description="DP-FedAvg (McMahan et al. 2018): C, the clip of each result's delta; "
        "null: plain FedAvg",
    )
    dp_noise: float = Field(1.0, gt=0, description="DP-FedAvg: z, noise of std z·C per round")
    dp_delta: float = Field(1e-5, gt=0, lt=1, description="DP-FedAvg: δ at which ε is reported")
    privacy_budget: float | None = Field(
        None, gt=0, description="DP-FedAvg: the run ends before a round that would pass this ε"
    )
    privacy_model: PrivacyModel = Field(
        PrivacyModel.CONSERVATIVE, description="DP-FedAvg: which ε the privacy budget counts"
    )

    @model_serializer(mode="wrap")
    def _leave_out_quiet(self, handler: SerializerFunctionWrapHandler) -> Any:
        """The DP keys at their default are left out: plain FedAvg dumps what it always has."""
        out = handler(self)
        if isinstance(out, dict):
            for name in _FEDAVG_DP:
                if name in out and out[name] == type(self).model_fields[name].default:
                    del out[name]
        return out

    def dp_policy(self, population: int) -> Policy:
        """The policy DP-FedAvg's rounds are accounted under (shared/privacy/): one noised
        step of m results among the N devices (q = m/N in the sampled model)."""
        return Policy.configured(
            {
                "mode": Mode.FEDBUFF,
                "buffer_size": min(self.clients_per_round, population),
                "dp_clip": self.dp_clip,
                "dp_noise": self.dp_noise,
                "dp_delta": self.dp_delta,
                "dp_population": population,
                "privacy_budget": self.privacy_budget,
                "privacy_model": self.privacy_model,
            }
        )


#: FedAvg's DP keys, left out of its dump at their default
_FEDAVG_DP = ("dp_clip", "dp_noise", "dp_delta", "privacy_budget", "privacy_model")


Algorithm = Annotated[
    FedAsyncConfig | FedBuffConfig | FairModeConfig | FedAvgConfig, Field(discriminator="kind")
]


class SimConfig(Strict):
    name: str = Field("custom", description="the run's name (default output folder, summary)")
    description: str = Field("", description="one line on what the config shows")
    seed: int = Field(0, ge=0, description="every random stream derives from it")
    task: TaskConfig = Field(TaskConfig(), description="`[task]`")
    data: DataConfig = Field(DataConfig(), description="`[data]`")
    fleet: FleetConfig = Field(FleetConfig(), description="`[fleet]`")
    training: TrainingConfig = Field(TrainingConfig(), description="`[training]`")
    budget: BudgetConfig = Field(BudgetConfig(), description="`[budget]`")
    eval: EvalConfig = Field(EvalConfig(), description="`[eval]`")
    algorithms: list[Algorithm] = Field(
        min_length=1, description="`[[algorithms]]`, each run on the same world, in order"
    )
    attack: AttackConfig | None = Field(None, description="`[attack]`: malicious devices")
    validation: ValidationConfig = Field(
        ValidationConfig(), description="`[validation]`: the server's held-out set (Zeno++)"
    )
    #: where relative trace paths are resolved from (the config file's folder)
    base_dir: str = "."

    @model_validator(mode="after")
    def _unique_names(self) -> SimConfig:
        names = [label(a) for a in self.algorithms]
        if len(set(names)) != len(names):
            raise ValueError(f"algorithm names must be unique, got {names}; set name = ...")
        return self

    def dump(self) -> dict[str, Any]:
        """The config as summary.json records it: the sections and policy keys added with
        issue 27 left out while at their default, so existing runs keep their bytes."""
        out = self.model_dump(mode="json", exclude={"base_dir"})
        for name in ("attack", "validation"):
            if getattr(self, name) == SimConfig.model_fields[name].default:
                del out[name]
        if self.training.dpsgd is None:
            del out["training"]["dpsgd"]
        for algorithm in out["algorithms"]:
            for name in QUIET:
                if name in algorithm and algorithm[name] == FIELDS[name].default:
                    del algorithm[name]
        return out


def label(algorithm: FedAsyncConfig | FedBuffConfig | FairModeConfig | FedAvgConfig) -> str:
    """The algorithm's name in outputs: its `name`, or its kind."""
    return algorithm.name or algorithm.kind


def _check_policy(build: Any) -> None:
    try:
        build()
    except ParamError as exc:
        raise ValueError(str(exc)) from None


# ------------------------------------------------------------------------------------ loading
def parse_file(path: Path) -> dict[str, Any]:
    """A TOML (.toml) or YAML (.yaml/.yml) file as a dict."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    if path.suffix == ".toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    elif path.suffix in (".yaml", ".yml"):
        data = _parse_yaml(path, text)
    else:
        raise ConfigError(f"{path}: config files are .toml, .yaml or .yml")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table of settings")
    return data


def _parse_yaml(path: Path, text: str) -> Any:
    """YAML is optional (the `sim` extra): services that never read a config don't need it."""
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            f"{path}: YAML configs need pyyaml (pip install 'fedasync[sim]')"
        ) from None
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, table by table; lists (algorithms) are replaced whole."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def build(data: Mapping[str, Any]) -> SimConfig:
    """Validate, or raise one ConfigError listing every problem with its dotted key, as the
    config wrote it (`algorithms.0.gamma = -1: allowed (0, 10]`)."""
    try:
        return SimConfig.model_validate(dict(data))
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            where = ".".join(_key_path(data, error["loc"])) or "(top level)"
            value = error.get("input")
            if isinstance(value, (str, int, float, bool)):
                where += f" = {json.dumps(value)}"
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"{where}: {message}")
        if len(lines) == 1:  # one problem, one line
            raise ConfigError(f"invalid simulation config: {lines[0]}") from None
        raise ConfigError(
            "invalid simulation config:\n" + "\n".join(f"  {line}" for line in lines)
        ) from None


def _key_path(data: Any, loc: tuple[int | str, ...]) -> list[str]:
    """The keys of `loc` that are in the config: pydantic also names the `kind` it tried."""
    keys = []
    for part in loc:
        if isinstance(data, Mapping) and part not in data and part == data.get("kind"):
            continue  # a discriminated union's tag, not a key the user wrote
        keys.append(str(part))
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        else:
            data = None
    return keys


def load_config(
    path: Path | None = None, preset: str | None = None, seed: int | None = None
) -> SimConfig:
    """A preset, a file, or a file on top of a preset (named by --preset or its `preset` key)."""
    from fedasync.sim.presets import preset_data  # presets are parsed with this module's rules

    data: dict[str, Any] = {}
    if path is not None:
        data = parse_file(path)
        named = data.pop("preset", None)
        if named is not None and preset is not None and named != preset:
            raise ConfigError(f"{path} extends preset {named!r} but --preset is {preset!r}")
        preset = preset if preset is not None else named
        data.setdefault("base_dir", str(path.parent))
    if preset is not None:
        data = merge(preset_data(preset), data)
    if not data:
        raise ConfigError("give a config file, a preset, or both")
    if seed is not None:
        data["seed"] = seed
    return build(data)
