"""One policy schema: a policy tuned in the simulator is the policy `fedasync up` and the services
run, field for field, and every policy field can be tuned in the simulator.

The `fedasync up` side parses real flags with the real parser and builds the run's settings with
the same function `up` calls; the services' side reads FEDASYNC_POLICY__* variables with the same
`load_settings` every service's main() calls. No process is started.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fedasync.services.commands.cli import build_parser
from fedasync.services.commands.up.options import run_settings
from fedasync.services.runtime.settings import (
    env_name,
    load_settings,
    setting_names,
    settings_env,
)
from fedasync.shared.policy import BUFFERED, DP_MODES, FIELDS, MODE_PRESETS, START, Mode, Policy
from fedasync.shared.staleness import Decay
from fedasync.sim.config import AsyncAlgorithmConfig, ConfigError, SimConfig, build, load_config
from fedasync.sim.presets import PRESETS, preset_data
from fedasync.sim.runner import fleet_advice, simulate
from fedasync.sim.world import build_world
from tests.sim.helpers import LINEAR, config, preset_for_tests

#: a value other than the default and any preset's for every start field but the mode
CHANGED: dict[str, Any] = {
    "decay": "hinge",
    "alpha0": 0.35,
    "gamma": 0.8,
    "lam": 0.85,
    "hinge_a": 3.5,
    "hinge_b": 2,
    "tau_max": 7,
    "buffer_size": 4,
    "memory_clients": 77,
    "memory_idle": 33,
    "tiers": 3,
    "server_optimizer": "adam",
    "server_lr": 0.7,
    "server_momentum": 0.5,
    "server_beta1": 0.8,
    "server_beta2": 0.99,
    "server_eps": 1e-6,
    "norm_bound": 2.5,
    "norm_action": "clip",
    "norm_window": 12,
    "robust_trim": 0.25,
    "robust_byzantine": 0,
    "robust_select": 3,
    "zeno_rho": 0.01,
    "zeno_lr": 0.5,
    "zeno_every": 4,
}
#: fields whose other values only some modes take (a robust rule: the buffered modes)
FOR_MODES: dict[str, tuple[Any, frozenset[str]]] = {"robust": ("trimmed_mean", BUFFERED)}
#: the differential privacy fields, changed together: they combine under rules of their own
#: (DP modes only, no poisoning bound; tests/unit/test_privacy_core.py)
DP_CHANGED: dict[str, Any] = {
    "dp_clip": 0.7,
    "dp_noise": 0.4,
    "dp_quantile": 0.6,
    "dp_clip_lr": 0.3,
    "dp_count_noise": 2.0,
    "dp_delta": 1e-6,
    "dp_population": 500,
    "dp_participation": 9,
    "privacy_budget": 8.0,
    "privacy_model": "sampled",
}
#: start fields only FedAsync takes: set alone in another mode, a config error
FEDASYNC_ONLY: dict[str, Any] = {"zeno_margin": 0.05}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)


def preset_algorithms() -> Iterator[tuple[str, int, dict[str, Any]]]:
    """(preset, index, the algorithm's table as the preset writes it) for every async algorithm."""
    for name in sorted(PRESETS):
        for index, table in enumerate(preset_data(name)["algorithms"]):
            if table["kind"] != "fedavg":
                yield name, index, table


def explicit_policy(table: dict[str, Any], advised_tau_max: int) -> dict[str, Any]:
    """What the table sets of the policy, as a user would type it elsewhere (mode = kind)."""
    chosen = {"mode": table["kind"]} | {k: v for k, v in table.items() if k in START}
    if chosen.get("tau_max") == "auto":
        chosen["tau_max"] = advised_tau_max
    return chosen


def up_policy(chosen: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Policy:
    """`fedasync up --mode … --tau-max …`, parsed and settled as `up` does it, and as the
    aggregator it starts reads it back from the environment `up` hands it (`settings_env`)."""
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in chosen.items()]
    args = build_parser().parse_args(["up", *flags])
    parent = run_settings(args).policy.to_policy()
    with monkeypatch.context() as env:
        for name, value in settings_env(run_settings(args)).items():
            env.setenv(name, value)
        child = load_settings().policy.to_policy()
    assert child == parent
    return parent


def env_policy(chosen: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Policy:
    """The same choices as FEDASYNC_POLICY__* variables, read as every service reads them."""
    with monkeypatch.context() as env:
        for key, value in chosen.items():
            env.setenv(env_name("policy", key), str(value))
        return load_settings().policy.to_policy()


@pytest.mark.parametrize(
    ("preset", "index", "table"),
    list(preset_algorithms()),
    ids=[f"{p}-{t.get('name', i)}" for p, i, t in preset_algorithms()],
)
def test_every_preset_algorithm_is_the_same_policy_in_up_and_in_the_services(
    preset: str, index: int, table: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(preset=preset)
    algorithm = cfg.algorithms[index]
    assert isinstance(algorithm, AsyncAlgorithmConfig)
    advised = 10
    if table.get("tau_max") == "auto":  # the simulator's own advice for this fleet
        advised = fleet_advice(build_world(build(preset_for_tests(preset)))).recommended_tau_max
    simulated = algorithm.policy(advised_tau_max=advised)
    chosen = explicit_policy(table, advised)
    assert up_policy(chosen, monkeypatch) == simulated
    assert env_policy(chosen, monkeypatch) == simulated


def test_the_presets_include_fedbuff_with_its_preset_values() -> None:
    """The parity above covers FedBuff, where up and the simulator used to disagree."""
    fedbuff = [t for _, _, t in preset_algorithms() if t["kind"] == "fedbuff"]
    assert fedbuff
    assert all("gamma" not in t for t in fedbuff)  # γ comes from the mode's preset
    assert MODE_PRESETS[Mode.FEDBUFF]["gamma"] == 0.5


@pytest.mark.parametrize("mode", list(Mode))
@pytest.mark.parametrize("how", ["bare", "every-field"])
def test_a_mode_means_the_same_everywhere(
    mode: Mode, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Naming only the mode gives its preset; naming every field gives those fields, in the
    simulator, `fedasync up`, the services' settings and `Policy.configured` alike."""
    chosen: dict[str, Any] = {"mode": mode.value} | (CHANGED if how == "every-field" else {})
    if how == "every-field":
        chosen |= {k: v for k, (v, modes) in FOR_MODES.items() if mode.value in modes}
    table = {"kind": mode.value} | {k: v for k, v in chosen.items() if k != "mode"}
    simulated = config(algorithms=[table]).algorithms[0]
    assert isinstance(simulated, AsyncAlgorithmConfig)
    expected = Policy.configured(chosen)
    assert simulated.policy(advised_tau_max=10) == expected
    assert up_policy(chosen, monkeypatch) == expected
    assert env_policy(chosen, monkeypatch) == expected
    if how == "bare":
        for name, value in MODE_PRESETS[mode].items():
            assert getattr(expected, name) == value
    else:
        assert {k: expected.to_dict()[k] for k in CHANGED} == CHANGED


def test_every_policy_field_is_settable_in_the_simulator() -> None:
    """Each start field of the schema, set alone in a simulator algorithm, reaches its policy."""
    assert set(CHANGED) | set(FOR_MODES) | set(DP_CHANGED) | set(FEDASYNC_ONLY) | {"mode"} == set(
        START
    )  # a new field: add it here too
    for name, value in FEDASYNC_ONLY.items():
        assert getattr(config(algorithms=[{"kind": "fedasync", name: value}]).algorithms[0], name)
        for kind in [m.value for m in Mode if m is not Mode.FEDASYNC]:
            with pytest.raises(ConfigError, match=name):
                config(algorithms=[{"kind": kind, name: value}])
    for name in sorted(set(START) - set(DP_CHANGED) - set(FEDASYNC_ONLY)):
        value, modes = FOR_MODES.get(name, (CHANGED.get(name), frozenset(m.value for m in Mode)))
        for kind in [m.value for m in Mode if m.value in modes]:
            if name == "mode":  # the algorithm's kind is its mode
                table: dict[str, Any] = {"kind": kind}
                want: Any = Mode(kind)
            else:
                table = {"kind": kind, name: value}
                want = FIELDS[name].normalise(value)
            algorithm = config(algorithms=[table]).algorithms[0]
            assert isinstance(algorithm, AsyncAlgorithmConfig)
            policy = algorithm.policy(advised_tau_max=10)
            assert getattr(policy, name) == want, (name, kind)
            default = Policy.configured({"mode": kind})
            if name != "mode":
                assert getattr(default, name) != want, (name, kind)  # the key changed something


@pytest.mark.parametrize("mode", sorted(DP_MODES))
def test_the_dp_fields_mean_the_same_everywhere(
    mode: Mode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every DP field reaches the policy alike in the simulator, `fedasync up` and the
    services' settings, and changes it from the default."""
    chosen: dict[str, Any] = {"mode": mode.value} | DP_CHANGED
    simulated = config(algorithms=[{"kind": mode.value} | DP_CHANGED]).algorithms[0]
    assert isinstance(simulated, AsyncAlgorithmConfig)
    expected = Policy.configured(chosen)
    assert simulated.policy(advised_tau_max=10) == expected
    assert up_policy(chosen, monkeypatch) == expected
    assert env_policy(chosen, monkeypatch) == expected
    default = Policy.configured({"mode": mode.value})
    for name, value in DP_CHANGED.items():
        assert expected.to_dict()[name] == value
        assert getattr(default, name) != getattr(expected, name), name


def test_the_simulator_applies_the_poisoning_bound() -> None:
    """norm_bound in a simulation decides as in the aggregator: updates beyond it are refused."""
    algorithms = [
        {"kind": "fedasync", "tau_max": 100, "name": "bounded", "norm_bound": 1.0},
        {"kind": "fedasync", "tau_max": 100, "name": "free"},
    ]
    cfg = build(LINEAR | {"algorithms": algorithms, "budget": {"max_updates": 60}})
    bounded, free = simulate(cfg).results
    reasons = {d.reason for d in bounded.recorder.decisions}
    assert "norm_bound" in reasons
    assert "norm_bound" not in {d.reason for d in free.recorder.decisions}
    assert bounded.settings["norm_bound"] == 1.0


def test_unset_fields_of_a_simulation_take_the_mode_preset() -> None:
    """A FedBuff table without γ or τ_max runs FedBuff's, not FedAsync's (γ 0.6, τ_max 10)."""
    cfg: SimConfig = config(algorithms=[{"kind": "fedbuff"}, {"kind": "fedasync"}])
    fedbuff, fedasync = (a.policy(advised_tau_max=10) for a in cfg.algorithms)  # type: ignore[union-attr]
    assert (fedbuff.gamma, fedbuff.tau_max, fedbuff.decay) == (0.5, 10, Decay.POLYNOMIAL)
    assert (fedasync.gamma, fedasync.tau_max) == (0.6, 10)
    assert fedbuff == Policy.fedbuff()
