"""The policy schema: declared once in `Policy`, read back whole, and every other form derived."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fedasync.services.control.openapi import spec
from fedasync.services.runtime.settings import PolicySettings, Settings
from fedasync.shared.params import ParamError, Scope
from fedasync.shared.policy import (
    CHANGEABLE,
    FIELDS,
    MODE_PRESETS,
    SCHEMA,
    START,
    Mode,
    Policy,
    apply_mode_preset,
)
from fedasync.shared.policy_text import reference_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_docs_policy_table_is_the_generated_one() -> None:
    assert reference_table() in DOC.read_text()


def test_the_schema_is_every_field_of_policy_with_its_default() -> None:
    assert [s.name for s in SCHEMA] == [f.name for f in dataclasses.fields(Policy)]
    policy = Policy()
    for spec_ in SCHEMA:
        assert getattr(policy, spec_.name) == spec_.default
        assert spec_.description
        assert (spec_.allowed is not None) == (spec_.kind in (int, float))


def test_the_settings_hold_exactly_the_start_fields_with_the_schemas_defaults() -> None:
    assert Settings.model_fields["policy"].annotation is PolicySettings
    fields = PolicySettings.model_fields
    assert tuple(fields) == START
    for name, field in fields.items():
        assert field.default == FIELDS[name].default
        assert FIELDS[name].description in (field.description or "")


def test_the_control_api_documents_every_field_and_accepts_the_changeable_ones() -> None:
    document = spec()["paths"]["/v1/policy"]
    policy = document["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert list(policy["properties"]["policy"]["properties"]) == [s.name for s in SCHEMA]
    body = document["patch"]["requestBody"]["content"]["application/json"]["schema"]
    assert tuple(body["properties"]["changes"]["properties"]) == CHANGEABLE
    assert "version" not in CHANGEABLE
    assert {s.name for s in SCHEMA if s.scope is Scope.RUNTIME} < set(CHANGEABLE)


def test_evolve_refuses_a_field_the_schema_does_not_have() -> None:
    with pytest.raises(ParamError) as info:
        Policy().evolve(alpha=0.5)
    assert info.value.param == "alpha"
    assert "alpha0" in info.value.allowed


def test_a_mode_preset_fills_only_what_was_not_set() -> None:
    assert apply_mode_preset({})["gamma"] == 0.6
    fedbuff = apply_mode_preset({"mode": "fedbuff"})
    assert {k: fedbuff[k] for k in MODE_PRESETS[Mode.FEDBUFF]} == dict(MODE_PRESETS[Mode.FEDBUFF])
    assert apply_mode_preset({"mode": "fedbuff", "tau_max": 7})["tau_max"] == 7
    assert apply_mode_preset({"mode": "nonsense"})["gamma"] == 0.6  # checked by whoever builds
    assert Policy.configured({"mode": "fedbuff", "gamma": 0.9}).gamma == 0.9
    assert Policy.fedbuff(buffer_size=3) == Policy.configured({"mode": "fedbuff", "buffer_size": 3})


def test_configured_takes_start_fields_only() -> None:
    with pytest.raises(ParamError, match="paused"):
        Policy.configured({"paused": True})
    with pytest.raises(ParamError, match="mode"):
        Policy.configured({"mode": "sync"})


def test_runtime_budgets_are_checked_and_may_be_null() -> None:
    assert FIELDS["max_updates"].normalise(None) is None
    with pytest.raises(ParamError, match="max_updates"):
        FIELDS["max_updates"].normalise(0)


def test_every_mode_preset_names_start_fields_and_makes_a_valid_policy() -> None:
    assert set(MODE_PRESETS) == set(Mode)
    for mode, preset in MODE_PRESETS.items():
        assert set(preset) <= set(START)
        policy = Policy.configured({"mode": mode})
        assert {name: getattr(policy, name) for name in preset} == dict(preset)
