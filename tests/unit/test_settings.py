"""Settings: environment parsing, validation with the core's ranges, docs kept in sync."""

from __future__ import annotations

from pathlib import Path

import pytest

import fedasync.services.runtime.settings as settings_module
from fedasync.services.runtime.settings import (
    Settings,
    SettingsError,
    load_settings,
    settings_env,
    settings_reference,
)
from fedasync.shared.policy import Policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in settings_module.setting_names():
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_the_core_defaults() -> None:
    settings = load_settings()
    assert settings.policy.to_policy() == Policy()
    assert settings.redis.url is None
    assert settings.budget.max_updates >= 1


def test_nested_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDASYNC_POLICY__ALPHA0", "0.4")
    monkeypatch.setenv("FEDASYNC_POLICY__DECAY", "hinge")
    monkeypatch.setenv("FEDASYNC_BUDGET__MAX_SECONDS", "30")
    monkeypatch.setenv("FEDASYNC_REDIS__URL", "redis://127.0.0.1:6390/0")
    settings = load_settings()
    policy = settings.policy.to_policy(version=3)
    assert (policy.alpha0, policy.decay.value, policy.version) == (0.4, "hinge", 3)
    assert settings.budget.max_seconds == 30.0
    assert settings.redis.url == "redis://127.0.0.1:6390/0"


def test_invalid_values_name_the_variable_and_the_core_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FEDASYNC_POLICY__ALPHA0", "2")
    monkeypatch.setenv("FEDASYNC_POLICY__TAU_MAX", "5000")
    monkeypatch.setenv("FEDASYNC_SNAPSHOT__PORT", "-1")
    with pytest.raises(SettingsError) as info:
        load_settings()
    text = str(info.value)
    assert "FEDASYNC_POLICY__ALPHA0" in text
    assert "[0.001, 1]" in text
    assert "FEDASYNC_POLICY__TAU_MAX" in text
    assert "integer in [0, 1000]" in text
    assert "FEDASYNC_SNAPSHOT__PORT" in text


@pytest.mark.parametrize(
    "name", ["FEDASYNC_POLICY__ALPHA", "FEDASYNC_POLCY__ALPHA0", "FEDASYNC_TYPO"]
)
def test_unknown_variables_are_errors_not_ignored(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "0.5")
    with pytest.raises(SettingsError, match=name):
        load_settings()


def test_settings_are_immutable() -> None:
    settings = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.policy.alpha0 = 0.1  # type: ignore[misc]


def test_nothing_is_built_at_import_time() -> None:
    built = [v for v in vars(settings_module).values() if isinstance(v, Settings)]
    assert built == []


def test_configuration_doc_lists_every_setting_with_its_default() -> None:
    reference = settings_reference()
    assert reference in DOC.read_text()
    for name in settings_module.setting_names():
        assert f"`{name}`" in reference


def test_socket_timeout_must_exceed_the_blocking_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDASYNC_REDIS__SOCKET_TIMEOUT_S", "1")
    monkeypatch.setenv("FEDASYNC_AGGREGATOR__BLOCK_MS", "2000")
    with pytest.raises(SettingsError, match="socket_timeout_s"):
        load_settings()


def test_settings_env_round_trips_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = load_settings(
        policy={"alpha0": 0.3, "decay": "hinge"},
        control={"token": "x" * 20, "disabled_rules": ["lag", "drops"]},
        worker={"time_scale": 0.5, "key": "ab" * 32},
    )
    env = settings_env(original)
    assert "FEDASYNC_REDIS__URL" not in env  # unset settings stay unset
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert load_settings() == original


@pytest.mark.parametrize(
    ("control", "message"),
    [
        ({"rate_low": 300.0, "rate_high": 200.0}, "RATE_LOW"),
        ({"lag_low": 2000.0}, "LAG_LOW"),
        ({"disabled_rules": ["rate"]}, "unknown rules"),
    ],
)
def test_rule_settings_that_could_never_work_are_refused(
    control: dict[str, object], message: str
) -> None:
    with pytest.raises(SettingsError, match="FEDASYNC_CONTROL"):
        load_settings(control=control)
    with pytest.raises(SettingsError, match=message.split("_")[0].lower()):
        load_settings(control=control)


def test_sentinels_are_host_port_pairs_and_empty_means_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FEDASYNC_REDIS__SENTINELS", "s1:26379, 10.0.0.2:26380,[::1]:26381")
    redis = load_settings().redis
    assert redis.sentinel_list == [("s1", 26379), ("10.0.0.2", 26380), ("::1", 26381)]
    assert redis.configured
    assert redis.url is None
    # compose passes ${FEDASYNC_REDIS__SENTINELS:-}: empty is no Sentinel at all
    monkeypatch.setenv("FEDASYNC_REDIS__SENTINELS", "")
    assert load_settings().redis.sentinels is None
    assert not load_settings().redis.configured


@pytest.mark.parametrize("value", ["s1", "s1:", ":26379", "s1:port", "s1:70000", "s1:1,s2"])
def test_a_sentinel_that_is_not_host_port_is_named(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("FEDASYNC_REDIS__SENTINELS", value)
    with pytest.raises(SettingsError, match=r"FEDASYNC_REDIS__SENTINELS: .* is not host:port"):
        load_settings()


def test_durable_mode_is_off_by_default_and_its_wait_ends_before_the_socket_gives_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().redis.durability.replicas == 0
    monkeypatch.setenv("FEDASYNC_REDIS__DURABLE_REPLICAS", "1")
    monkeypatch.setenv("FEDASYNC_REDIS__DURABLE_TIMEOUT_MS", "800")
    monkeypatch.setenv("FEDASYNC_REDIS__SOCKET_TIMEOUT_S", "2")
    durability = load_settings().redis.durability
    assert (durability.replicas, durability.timeout_ms) == (1, 800)
    monkeypatch.setenv("FEDASYNC_REDIS__SOCKET_TIMEOUT_S", "0.5")
    monkeypatch.setenv("FEDASYNC_AGGREGATOR__BLOCK_MS", "100")  # below that socket timeout
    with pytest.raises(SettingsError, match=r"durable_timeout_ms \(800\) must stay below"):
        load_settings()
    monkeypatch.setenv("FEDASYNC_REDIS__DURABLE_REPLICAS", "0")  # off: no WAIT, no limit
    assert load_settings().redis.durability.replicas == 0


def test_durable_mode_is_on_by_default_with_sentinels_and_off_without() -> None:
    """A replicated deployment is durable unless told otherwise (docs/operations.md)."""
    sentinels = {"sentinels": "s1:26379,s2:26379,s3:26379"}
    assert load_settings(redis=sentinels).redis.durability.replicas == 1
    assert (
        load_settings(redis={**sentinels, "durable_replicas": "0"}).redis.durability.replicas == 0
    )
    assert load_settings(redis={**sentinels, "durable_replicas": ""}).redis.durability.replicas == 1
    assert load_settings(redis={"url": "redis://h/0"}).redis.durability.replicas == 0
    assert load_settings(redis={"durable_replicas": 2}).redis.durability.replicas == 2
