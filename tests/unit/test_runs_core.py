"""The run id grammar, the run spec, and the run-scoped paths and keys (shared/runs.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedasync.services.runtime.settings import SettingsError, load_settings
from fedasync.shared.ingest_protocol import receipt_path, updates_path
from fedasync.shared.keys import REGISTRY, Keys
from fedasync.shared.runs import (
    DEFAULT_RUN,
    RunIdError,
    RunSpec,
    TaskSpec,
    check_run_id,
    is_run_id,
    run_base,
    run_path,
)
from fedasync.shared.snapshot_protocol import (
    LATEST_META_PATH,
    LATEST_PATH,
    latest_meta_path,
    latest_path,
    model_path,
)


@pytest.mark.parametrize("good", ["fedasync", "a", "0", "kb-2026_w48", "x" * 63])
def test_run_ids_in_the_grammar_pass(good: str) -> None:
    assert check_run_id(good) == good
    assert is_run_id(good)


@pytest.mark.parametrize(
    "bad", ["", "A", "-a", "_a", "a{b}", "a:b", "a/b", "a b", "a*", "a?", "x" * 64, "é", "a\n"]
)
def test_run_ids_outside_the_grammar_are_refused_with_the_wire_reason(bad: str) -> None:
    with pytest.raises(RunIdError, match="is not a run id") as refused:
        check_run_id(bad)
    assert refused.value.reason == "bad_run_id"
    assert not is_run_id(bad)


def test_a_run_id_that_is_not_text_is_refused() -> None:
    with pytest.raises(RunIdError, match="is text"):
        check_run_id(7)


@given(st.text(max_size=80))
def test_any_accepted_id_is_safe_as_a_hash_tag_an_acl_pattern_and_a_path_segment(
    text: str,
) -> None:
    if is_run_id(text):
        assert not set(text) & set("{}:*?[]/\\ \t\r\n")
        assert len(Keys(text).updates.split("}")[0]) == len(text) + 1


def test_the_default_run_is_the_default_prefix() -> None:
    assert DEFAULT_RUN == Keys().prefix == load_settings().redis.key_prefix


def test_paths_of_no_run_are_the_legacy_routes() -> None:
    assert run_base(None) == ""
    assert latest_path() == LATEST_PATH == "/v1/models/latest"
    assert latest_meta_path() == LATEST_META_PATH
    assert model_path(3) == "/v1/models/3"
    assert updates_path() == "/v1/updates"
    assert receipt_path("a/b") == "/v1/updates/a%2Fb"


def test_paths_of_a_run_are_its_twins_under_v1_runs() -> None:
    assert run_base("kb") == "/v1/runs/kb"
    assert latest_path("kb") == "/v1/runs/kb/models/latest"
    assert latest_meta_path("kb") == "/v1/runs/kb/models/latest/meta"
    assert model_path(3, "kb") == "/v1/runs/kb/models/3"
    assert updates_path("kb") == "/v1/runs/kb/updates"
    assert receipt_path("a/b", "kb") == "/v1/runs/kb/updates/a%2Fb"
    assert run_path("kb", "/v1/policy") == "/v1/runs/kb/policy"
    with pytest.raises(RunIdError):
        latest_path("Bad")
    with pytest.raises(ValueError, match="not a /v1/ route"):
        run_path("kb", "/metrics")


def test_the_registry_and_claim_keys_are_outside_every_runs_slot() -> None:
    assert ":" in REGISTRY.split("}")[0]  # no run id holds a ':'
    digest = "ab" * 32
    assert Keys("kb").claim(digest) == f"claim:kb:{{{digest}}}"


def test_a_spec_round_trips_through_json() -> None:
    spec = RunSpec(
        "kb",
        TaskSpec("digits", {"hidden": 32}, 3, num_devices=8, partition="iid"),
        {"mode": "fedbuff", "buffer_k": 4},
        {"max_updates": 300},
        1.5,
        "admin",
    )
    assert RunSpec.from_json(spec.to_json()) == spec
    assert RunSpec.from_dict({"id": "x"}) == RunSpec("x")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "needs an id"),
        ({"id": "Bad"}, "is not a run id"),
        ({"id": "x", "colour": 1}, "unknown run fields: colour"),
        ({"id": "x", "task": []}, "task must be an object"),
        ({"id": "x", "task": {"seed": -1}}, "seed must be a non-negative"),
        ({"id": "x", "task": {"name": ""}}, "task.name"),
        ({"id": "x", "task": {"num_devices": 0}}, "num_devices"),
        ({"id": "x", "task": {"depth": 0}}, "unknown task fields: depth"),
        ({"id": "x", "policy": 3}, "policy must be an object"),
        ({"id": "x", "created_at": "now"}, "created_at"),
    ],
)
def test_a_bad_spec_names_what_is_wrong(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RunSpec.from_dict(data)


def test_a_prefix_with_a_brace_is_refused() -> None:
    with pytest.raises(SettingsError, match="holds a brace"):
        load_settings(redis={"key_prefix": "a}b"})


def test_cluster_and_sentinels_are_exclusive_and_a_cluster_is_durable_by_default() -> None:
    with pytest.raises(SettingsError, match="exclusive"):
        load_settings(redis={"cluster": "h:1", "sentinels": "h:2"})
    clustered = load_settings(redis={"cluster": "h:7000, h:7001"})
    assert clustered.redis.cluster_list == [("h", 7000), ("h", 7001)]
    assert clustered.redis.configured
    assert clustered.redis.durability.replicas == 1
    assert load_settings().redis.durability.replicas == 0
    with pytest.raises(SettingsError, match="is not host:port"):
        load_settings(redis={"cluster": "h"})
