"""Configuration: files over presets, and clear errors that name the bad key."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedasync.sim.config import ConfigError, load_config
from fedasync.sim.presets import PRESETS, UnknownPresetError
from tests.sim.helpers import config


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_valid(name: str) -> None:
    cfg = load_config(preset=name)
    assert cfg.name == name
    assert cfg.description


def test_a_file_overrides_a_preset_table_by_table(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('preset = "iid-longtail"\nseed = 3\n[fleet]\ndevices = 12\n')
    cfg = load_config(path)
    assert cfg.seed == 3
    assert cfg.fleet.devices == 12
    assert cfg.fleet.latency.kind == "longtail"  # the rest of the table is the preset's
    assert cfg.eval.target == 0.9
    assert load_config(path, seed=9).seed == 9


def test_yaml_works_too(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("task: {name: linear}\nalgorithms:\n  - {kind: fedavg, clients_per_round: 2}\n")
    assert load_config(path).algorithms[0].kind == "fedavg"


@pytest.mark.parametrize(
    ("overrides", "where", "why"),
    [
        ({"fleet": {"devices": 0}}, "fleet.devices", "greater than or equal to 1"),
        ({"fleet": {"latency": {"kind": "weibull"}}}, "fleet.latency", "weibull"),
        ({"fleet": {"speed": 3}}, "fleet.speed", "Extra inputs"),
        ({"algorithms": [{"kind": "fedasync", "alpha0": 2.0}]}, "algorithms.0", "alpha0 = 2.0"),
        ({"algorithms": [{"kind": "fedbuff", "buffer_size": 0}]}, "algorithms.0", "buffer_size"),
        ({"algorithms": []}, "algorithms", "at least 1"),
        (
            {"algorithms": [{"kind": "fedasync"}, {"kind": "fedasync"}]},
            "(top level)",
            "unique",
        ),
        ({"budget": {"max_seconds": -1}}, "budget.max_seconds", "greater than 0"),
    ],
)
def test_invalid_settings_are_named(overrides: dict[str, object], where: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config(**overrides)
    assert where in str(caught.value)
    assert why in str(caught.value)


def test_file_problems_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[fleet\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    other = tmp_path / "x.json"
    other.write_text("{}")
    with pytest.raises(ConfigError, match=r"\.toml, \.yaml"):
        load_config(other)
    extends = tmp_path / "e.toml"
    extends.write_text('preset = "noniid-jitter"\n')
    with pytest.raises(ConfigError, match="--preset"):
        load_config(extends, preset="iid-longtail")
    with pytest.raises(UnknownPresetError, match="known"):
        load_config(preset="nope")
    with pytest.raises(ConfigError, match="config file, a preset"):
        load_config()
