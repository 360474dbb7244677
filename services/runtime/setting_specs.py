"""The settings a command-line flag offers, declared as plain data, and the variables' names.

A flag's help shows its setting's type, default and description, and `fedasync up --help` or a
typo must cost a fraction of what importing pydantic, pydantic-settings and numpy does (a
`--help` is read before any of them is needed). So each setting a flag stands for is declared
here once, importing nothing heavy, and services/runtime/settings.py builds its pydantic field
from it (`Field(**spec.constraints)` with this default and description); the policy's settings
come the same way from the core's schema (shared/policy.py). tests/unit/test_cli.py checks
that each annotation in settings.py is the type declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ENV_PREFIX = "FEDASYNC_"
ENV_NESTED_DELIMITER = "__"

#: a setting's place: (section, name), e.g. ("policy", "tau_max")
SettingPath = tuple[str, ...]


def env_name(*path: str) -> str:
    """The environment variable of a setting (or section): FEDASYNC_POLICY__TAU_MAX."""
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(p.upper() for p in path)


#: how the training data is split across devices (as in the simulator)
Partition = Literal["iid", "dirichlet", "shards", "rare_class_on_slow"]
#: the latency profile a device's training time follows
LatencyProfile = Literal["longtail", "lognormal", "pareto", "exponential", "none"]


@dataclass(frozen=True, slots=True)
class SettingSpec:
    """One setting: its type (the annotation settings.py gives it), default and description,
    and the bounds pydantic checks (`ge`, `gt`, `min_length`, ...)."""

    kind: Any
    default: Any
    description: str
    constraints: Mapping[str, Any] = field(default_factory=dict)
    #: makes the default afresh for each settings object (a mutable one, such as a table)
    factory: Callable[[], Any] | None = None

    def default_value(self) -> Any:
        """The default in force, made by the factory when there is one."""
        return self.factory() if self.factory is not None else self.default


SPECS: Mapping[SettingPath, SettingSpec] = {
    ("budget", "max_updates"): SettingSpec(
        int, 1000, "applied updates before training is done", {"ge": 1}
    ),
    ("budget", "max_seconds"): SettingSpec(
        float, 600.0, "wall-clock seconds before training is done", {"gt": 0}
    ),
    ("task", "name"): SettingSpec(
        str,
        "digits",
        "learning task: digits, linear, synthetic, or package.module:attribute "
        "(a fedasync.Task subclass or a function returning one)",
        {"min_length": 1},
    ),
    ("task", "params"): SettingSpec(
        dict[str, Any],
        None,
        'keyword arguments of the task, a JSON object, e.g. {"hidden": 64}',
        factory=dict,
    ),
    ("task", "seed"): SettingSpec(
        int, 0, "seed of the initial model and of the data split", {"ge": 0}
    ),
    ("task", "num_devices"): SettingSpec(
        int, 10, "devices the training data is split across", {"ge": 1}
    ),
    ("task", "partition"): SettingSpec(
        Partition, "iid", "how data is split across devices (as in the simulator)"
    ),
    ("task", "rare_class"): SettingSpec(
        int, 0, "rare_class_on_slow: the class only the slowest devices hold", {"ge": 0}
    ),
    ("worker", "profile"): SettingSpec(
        LatencyProfile, "longtail", "latency profile its training time follows"
    ),
    ("worker", "time_scale"): SettingSpec(
        float,
        0.01,
        "real seconds per profile second (0.01: 30 s runs take 0.3 s)",
        {"ge": 0},
    ),
    ("worker", "dpsgd_noise_multiplier"): SettingSpec(
        float | None,
        None,
        "train with DP-SGD (Opacus, in fedasync[worker]) at this noise multiplier σ; the device "
        "reports its sample-level ε in each update; unset: off",
        {"gt": 0},
    ),
    ("worker", "dpsgd_max_grad_norm"): SettingSpec(
        float, 1.0, "DP-SGD: each sample's gradient is clipped to this norm C", {"gt": 0}
    ),
    ("worker", "dpsgd_delta"): SettingSpec(
        float, 1e-5, "DP-SGD: the δ the device's ε is reported at", {"gt": 0, "lt": 1}
    ),
}
