"""Settings given as text: JSON settings, `null`, the token's length, all named by their variable.

Each bad value is one SettingsError line naming the variable (exit code 2 in every process), never
an error of pydantic-settings about a whole section.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import fedasync.services.runtime.settings as settings_module
from fedasync.services.runtime.settings import SettingsError, load_settings, settings_reference

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith(settings_module.ENV_PREFIX):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [
        ("FEDASYNC_TASK__PARAMS", "hidden=64", "object"),
        ("FEDASYNC_TASK__PARAMS", "{hidden: 64}", "object"),
        ("FEDASYNC_CONTROL__DISABLED_RULES", "lag", "list"),
        ("FEDASYNC_CONTROL__DISABLED_RULES", "lag,drops", "list"),
    ],
)
def test_a_json_setting_that_is_not_json_is_named_by_its_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, kind: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert message.startswith(f"invalid settings: {name}: not JSON: ")
    assert message.endswith(f"give a JSON {kind}")
    assert "\n" not in message
    assert [p.path for p in info.value.problems] == [tuple(name[9:].lower().split("__"))]


def test_a_json_setting_is_named_among_the_other_bad_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """All problems at once, as for any other setting: the JSON one does not hide the rest."""
    monkeypatch.setenv("FEDASYNC_TASK__PARAMS", "hidden=64")
    monkeypatch.setenv("FEDASYNC_POLICY__ALPHA0", "2")
    with pytest.raises(SettingsError) as info:
        load_settings()
    text = str(info.value)
    assert "FEDASYNC_TASK__PARAMS: not JSON" in text
    assert "FEDASYNC_POLICY__ALPHA0: allowed [0.001, 1]" in text


def test_json_settings_still_read_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDASYNC_TASK__PARAMS", '{"hidden": 64}')
    monkeypatch.setenv("FEDASYNC_CONTROL__DISABLED_RULES", '["lag", "drops"]')
    settings = load_settings()
    assert settings.task.params == {"hidden": 64}
    assert settings.control.disabled_rules == ["lag", "drops"]
    # JSON of the wrong shape, and unknown rules, are refused by the fields' own checks
    monkeypatch.setenv("FEDASYNC_TASK__PARAMS", "[64]")
    with pytest.raises(SettingsError, match="FEDASYNC_TASK__PARAMS: Input should be a valid dict"):
        load_settings()
    monkeypatch.setenv("FEDASYNC_TASK__PARAMS", "{}")
    monkeypatch.setenv("FEDASYNC_CONTROL__DISABLED_RULES", '["rate"]')
    with pytest.raises(SettingsError, match="FEDASYNC_CONTROL__DISABLED_RULES: unknown rules"):
        load_settings()


@pytest.mark.parametrize("command", [["settings"], ["up", "--max-updates", "5"]])
def test_the_cli_says_which_json_variable_is_wrong_in_one_line(
    command: list[str], tmp_path: Path
) -> None:
    """`fedasync settings` and `fedasync up` (before it starts anything): exit 2, one line."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "FEDASYNC_TASK__PARAMS": "hidden=64",
    }
    script = Path(sys.executable).parent / "fedasync"
    result = subprocess.run(
        [str(script), *command],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        "fedasync: invalid settings: FEDASYNC_TASK__PARAMS: not JSON: "
        "Expecting value: line 1 column 1 (char 0); give a JSON object"
    ]
    assert list(cwd.iterdir()) == []  # `up` made no run folder


@pytest.mark.parametrize("value", ["null", "NULL", " null ", ""])
def test_null_or_nothing_unsets_a_setting_that_may_be_unset(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """docs: FEDASYNC_POLICY__NORM_BOUND is "[1, 1000] or null"; null is what turns it off."""
    monkeypatch.setenv("FEDASYNC_POLICY__NORM_BOUND", value)
    monkeypatch.setenv("FEDASYNC_WORKER__EPOCHS", value)
    monkeypatch.setenv("FEDASYNC_AGGREGATOR__ARCHIVE_DIR", value)
    monkeypatch.setenv("FEDASYNC_REDIS__URL", value)
    settings = load_settings()
    assert settings.policy.to_policy().norm_bound is None
    assert settings.worker.epochs is None
    assert settings.aggregator.archive_dir is None  # not Path(""), the working directory
    assert settings.redis.url is None
    assert not settings.redis.configured


def test_null_keeps_every_other_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDASYNC_POLICY__NORM_BOUND", "5")
    assert load_settings().policy.to_policy().norm_bound == 5.0
    monkeypatch.setenv("FEDASYNC_POLICY__NORM_BOUND", "0.5")
    with pytest.raises(SettingsError, match=r"FEDASYNC_POLICY__NORM_BOUND: allowed \[1, 1000\]"):
        load_settings()
    # a setting that cannot be unset is not unset by null: refused, not defaulted
    monkeypatch.delenv("FEDASYNC_POLICY__NORM_BOUND")
    monkeypatch.setenv("FEDASYNC_POLICY__ALPHA0", "null")
    with pytest.raises(SettingsError, match="FEDASYNC_POLICY__ALPHA0: Input should be a valid"):
        load_settings()
    monkeypatch.delenv("FEDASYNC_POLICY__ALPHA0")
    monkeypatch.setenv("FEDASYNC_REDIS__KEY_PREFIX", "")
    with pytest.raises(SettingsError, match="FEDASYNC_REDIS__KEY_PREFIX"):
        load_settings()


def test_the_token_reference_says_how_long_it_must_be(monkeypatch: pytest.MonkeyPatch) -> None:
    row = next(
        line
        for line in settings_reference().splitlines()
        if line.startswith("| `FEDASYNC_CONTROL__TOKEN` |")
    )
    assert "at least 16 characters" in row
    assert row in DOC.read_text()
    monkeypatch.setenv("FEDASYNC_CONTROL__TOKEN", "x" * 15)
    with pytest.raises(SettingsError, match=r"FEDASYNC_CONTROL__TOKEN: .*at least 16 characters"):
        load_settings()
    monkeypatch.setenv("FEDASYNC_CONTROL__TOKEN", "x" * 16)
    assert load_settings().control.token == "x" * 16
