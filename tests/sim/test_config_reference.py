"""docs/simulation-config.md documents every key of the simulation config (sim/config.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from fedasync.sim import config as cfg
from fedasync.sim.config_reference import SECTIONS, fields, reference, tables_of

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_docs_reference_is_the_generated_one() -> None:
    assert reference() in (DOCS / "simulation-config.md").read_text()


def _reachable(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    seen.add(model)
    for field in model.model_fields.values():
        for inner in tables_of(field.annotation):
            if inner not in seen:
                _reachable(inner, seen)
        for arg in getattr(field.annotation, "__args__", ()):  # list[...] of tables
            for inner in tables_of(arg):
                if inner not in seen:
                    _reachable(inner, seen)
    return seen


def test_every_table_a_config_can_write_has_a_section_and_every_key_a_meaning() -> None:
    documented = {model for _, model, _ in SECTIONS}
    tables = _reachable(cfg.SimConfig, set())
    # the asynchronous kinds share one section: their keys are the same but for the kind,
    # and fedbuff's own section lists the one it adds (its tree)
    shared = {cfg.FairModeConfig}
    assert fields(cfg.FedBuffConfig) == [*fields(cfg.FedAsyncConfig), "tree"]
    assert tables - documented - shared == set()
    for model in tables - shared:
        for name in fields(model):
            assert model.model_fields[name].description, f"{model.__name__}.{name} has no meaning"
    for model in shared:
        assert fields(model) == fields(cfg.FedAsyncConfig)


def test_the_policy_keys_of_an_algorithm_are_in_the_policy_table() -> None:
    table = (DOCS / "configuration.md").read_text()
    for name in cfg.POLICY_KEYS:
        assert f"| `{name}` |" in table
