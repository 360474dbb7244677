"""The `fedasync` command."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedasync.services.commands.cli import COMMANDS, build_parser, main
from fedasync.services.commands.flags import declared
from fedasync.services.commands.redis_launch.server import free_port
from fedasync.services.commands.up.options import FLAGS, run_settings
from fedasync.services.runtime.setting_specs import SPECS
from fedasync.services.runtime.settings import Settings, setting_names
from fedasync.shared.policy import START


def test_alpha_table_shows_every_rule_and_drops(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alpha", "--max-tau", "12", "--tau-max", "10"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("tau"))
    assert header.split() == ["tau", "constant", "polynomial", "progress", "exponential", "hinge"]
    row5 = next(line.split() for line in out.splitlines() if line.split()[:1] == ["5"])
    assert row5 == ["5", "0.6000", "0.2048", "0.2048", "0.3543", "0.0545"]  # hinge 0.6/11
    row11 = next(line.split() for line in out.splitlines() if line.split()[:1] == ["11"])
    assert row11 == ["11"] + ["dropped"] * 5


def test_alpha_refuses_out_of_range_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["alpha", "--gamma", "-1"]) == 2
    assert "gamma" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "fedasync"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, check=True)
    assert "alpha" in result.stdout
    assert "settings" in result.stdout


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help at the terminal's width
    return monkeypatch


def test_up_names_the_flag_and_the_value_typed_in_one_line(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    clean_env.chdir(tmp_path)
    assert main(["up", "--tau-max", "-1"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        "fedasync: invalid settings: --tau-max -1: allowed integer in [0, 1000]"
    ]
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []  # refused before anything was started or written
    assert main(["up", "--tau-max", "ten"]) == 2  # a type error is reported the same way
    assert "--tau-max ten: Input should be a valid integer" in capsys.readouterr().err
    clean_env.setenv("FEDASYNC_POLICY__GAMMA", "-2")  # no flag gave it: the variable is named
    assert main(["up", "--tau-max", "5"]) == 2
    assert "invalid settings: FEDASYNC_POLICY__GAMMA: allowed (0, 10]" in capsys.readouterr().err
    clean_env.delenv("FEDASYNC_POLICY__GAMMA")
    assert main(["up", "--task", "bogus", "--task-params", "{nope"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("fedasync: invalid settings: --task-params {nope: ")
    assert main(["up", "--task", "bogus"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("fedasync: invalid settings: --task bogus: task 'bogus': not a built-in")
    assert list(tmp_path.iterdir()) == []


def test_alpha_names_the_flag_too(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["alpha", "--gamma", "-1"]) == 2
    assert capsys.readouterr().err == "fedasync: invalid settings: --gamma -1: allowed (0, 10]\n"


def test_up_help_shows_the_defaults_up_uses_and_why_its_budget_differs(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["up", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--devices N device workers (processes), one data share each (default: 10;" in text
    assert "--max-updates N applied updates before training is done (default: 400;" in text
    assert "--max-seconds X wall-clock seconds before training is done (default: 120.0;" in text
    assert "it stops at 400 updates / 120 s unless a flag or its FEDASYNC_BUDGET__" in text
    assert "(`fedasync settings`, docker compose) budget 1000 updates / 600 s" in text
    assert (
        "under mode fedbuff: 0.5, mode fedbuff-fair: 0.5 (default: 0.6; FEDASYNC_POLICY__GAMMA)"
        in (text)
    )


def test_up_budget_is_the_demo_one_unless_a_flag_or_a_variable_sets_it(
    clean_env: pytest.MonkeyPatch,
) -> None:
    def budget(*argv: str) -> tuple[int, float]:
        settings = run_settings(build_parser().parse_args(["up", *argv]))
        return settings.budget.max_updates, settings.budget.max_seconds

    assert budget() == (400, 120.0)
    clean_env.setenv("FEDASYNC_BUDGET__MAX_UPDATES", "1000")
    assert budget() == (1000, 120.0)
    assert budget("--max-updates", "50", "--max-seconds", "9") == (50, 9.0)


def test_up_dpsgd_flags_set_every_workers_dpsgd_settings(clean_env: pytest.MonkeyPatch) -> None:
    def worker(*argv: str) -> tuple[float | None, float, float]:
        w = run_settings(build_parser().parse_args(["up", *argv])).worker
        return w.dpsgd_noise_multiplier, w.dpsgd_max_grad_norm, w.dpsgd_delta

    assert worker() == (None, 1.0, 1e-5)  # off unless asked for
    flags = ("--dpsgd-noise", "1.1", "--dpsgd-clip", "0.5", "--dpsgd-delta", "1e-6")
    assert worker(*flags) == (1.1, 0.5, 1e-6)


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's shell: no FEDASYNC_ variable, so no Redis is configured."""
    for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
        monkeypatch.delenv(name)


NEED_REDIS = [
    ["ledger", "verify"],
    ["ledger", "export"],
    ["devices", "add", "phone-17"],
    ["devices", "list"],
    ["devices", "revoke", "phone-17"],
]


@pytest.mark.usefixtures("no_settings")
@pytest.mark.parametrize("argv", NEED_REDIS, ids=" ".join)
def test_without_a_redis_one_line_says_what_to_set_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()  # one line, no traceback
    assert line.startswith(f"fedasync {argv[0]} {argv[1]}: no Redis configured")
    assert "set FEDASYNC_REDIS__URL" in line
    if argv[0] == "ledger":  # what a user has after `fedasync up` is a run folder
        assert "--run runs/up-" in line


@pytest.mark.usefixtures("no_settings")
@pytest.mark.parametrize("argv", NEED_REDIS, ids=" ".join)
def test_a_redis_that_cannot_be_reached_is_one_line_and_exit_1_or_3_for_verify(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ledger verify` keeps exit 1 for a ledger that did not reproduce the model: a script
    watching it must not stop production because Redis was briefly away."""
    port = free_port()  # nothing listens there: the connection is refused at once
    monkeypatch.setenv("FEDASYNC_REDIS__URL", f"redis://:secret@127.0.0.1:{port}/0")
    assert main(argv) == (3 if argv == ["ledger", "verify"] else 1)
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"fedasync {argv[0]} {argv[1]}: Redis at 127.0.0.1:{port}/0: ")
    assert "secret" not in line


@pytest.mark.usefixtures("no_settings")
def test_a_run_folder_that_is_not_one_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ledger", "verify", "--run", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err.endswith("missing: no such folder\n")
    assert main(["ledger", "verify", "--run", str(tmp_path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "no redis/ in it: not a `fedasync up` run folder" in line


@pytest.mark.usefixtures("no_settings")
def test_an_export_file_that_cannot_be_written_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # the file is opened first: Redis is never asked
    monkeypatch.setenv("FEDASYNC_REDIS__URL", f"redis://127.0.0.1:{port}/0")
    out = tmp_path / "no-such-folder" / "ledger.jsonl"
    assert main(["ledger", "export", "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"fedasync ledger export: --out {out}: No such file or directory"


@pytest.mark.parametrize(
    ("argv", "usage", "hint"),
    [
        (["up", "--devcies", "3"], "usage: fedasync up ", "did you mean --devices?"),
        (["up", "--max-update", "5"], "usage: fedasync up ", "did you mean --max-updates?"),
        (["ledger", "verify", "--rnu", "x"], "usage: fedasync ledger verify ", "--run?"),
    ],
    ids=["typo", "prefix-is-not-the-option", "nested-command"],
)
def test_an_unknown_option_is_reported_by_its_own_command_with_the_nearest_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, hint: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert f"unrecognized arguments: {' '.join(argv[-2:])}" in err
    assert hint in err


def test_the_help_shows_the_default_of_a_setting_made_by_a_factory(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["up", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: {}; FEDASYNC_TASK__PARAMS)" in text
    assert "PydanticUndefined" not in text


def test_settings_prints_no_secret(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What operators paste into a ticket: the Redis password and the control token hidden."""
    clean_env.setenv("FEDASYNC_REDIS__URL", "redis://admin:S3CRETpassword42@redis:6379/0")
    clean_env.setenv("FEDASYNC_CONTROL__TOKEN", "operator-token-0123456789")
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    assert "S3CRETpassword42" not in out
    assert "operator-token-0123456789" not in out
    assert '"url": "redis://admin:**********@redis:6379/0"' in out
    assert '"token": "**********"' in out


def test_a_reader_that_went_away_is_no_traceback_and_not_a_meaningful_exit_code() -> None:
    """`fedasync ledger verify | head -1`: exit 1 would read as "not reproduced"; 141 is what a
    shell shows for a process that SIGPIPE ended."""
    script = Path(sys.executable).parent / "fedasync"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        result = subprocess.run(
            [str(script), "acl"], stdout=write_end, stderr=subprocess.PIPE, text=True
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141
    assert "Traceback" not in result.stderr


#: what reading the arguments of `fedasync` may not import: each costs a share of the ~2 s of CPU
#: that running a command takes, which `--help` or a typo never needs
HEAVY = ("numpy", "torch", "redis", "aiohttp", "pydantic", "asyncio", "rich", "matplotlib")


def modules_imported_by(argv: list[str]) -> set[str]:
    """The heavy modules a fresh interpreter has imported once `fedasync ARGV` parsed its
    arguments (and exited, as `--help` and a typo do)."""
    code = (
        "import sys\n"
        "from fedasync.services.commands.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print('IMPORTED', *sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True
    )
    line = next(line for line in result.stderr.splitlines() if line.startswith("IMPORTED"))
    return set(line.split()[1:])


def _command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[list[str]]:
    """Every command and nested command of `parser` (`ledger verify`), as the words typed."""
    out = [list(path)] if path else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _command_paths(sub, (*path, name))
    return out


EVERY_COMMAND = _command_paths(build_parser())


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["--version"],
        ["frobnicate"],
        *([*words, "--help"] for words in EVERY_COMMAND),
        *([command.name, "--frobnicate"] for command in COMMANDS),
        ["up", "--devcies", "3"],
    ],
    ids=" ".join,
)
def test_help_and_a_typo_import_no_heavy_library(argv: list[str]) -> None:
    """Every command's `--help` and a wrong option of it, `up` and `simulate` too: their flags
    are built from the plain declarations their settings are built from, never from pydantic."""
    assert modules_imported_by(argv) == set()


def test_every_command_and_nested_command_is_among_those_checked() -> None:
    assert {"up", "simulate", "alpha", "chaos"} <= {words[0] for words in EVERY_COMMAND}
    assert ["ledger", "verify"] in EVERY_COMMAND
    assert ["devices", "add"] in EVERY_COMMAND


@pytest.mark.parametrize(
    "path",
    [flag.path for flag in FLAGS],
    ids=lambda path: ".".join(path),
)
def test_a_flag_shows_the_type_default_and_description_of_its_setting(
    path: tuple[str, str],
) -> None:
    """What `declared` reads without pydantic is what the pydantic field holds: for the policy
    the core's schema, for the others services/runtime/setting_specs.py."""
    section, name = path
    model = Settings.model_fields[section].annotation
    assert isinstance(model, type)
    field = model.model_fields[name]
    shown = declared(path)
    assert shown.annotation == field.annotation
    assert shown.default == field.get_default(call_default_factory=True)
    assert shown.description == field.description


def test_up_offers_a_flag_for_every_start_field_of_the_policy_and_every_plain_setting() -> None:
    """So the test above checks every plain declaration (services/runtime/setting_specs.py)."""
    offered = {flag.name for flag in FLAGS if flag.section == "policy"}
    assert offered == set(START)
    assert {flag.path for flag in FLAGS if flag.section != "policy"} == set(SPECS)


def test_every_command_is_listed_and_only_the_one_typed_is_built() -> None:
    full = build_parser()
    lean = build_parser(["ledger", "export"])
    for parser in (full, lean):
        commands = next(a for a in parser._actions if a.dest == "command")
        assert set(commands.choices) >= {"up", "simulate", "advise", "devices", "chaos", "acl"}
    assert lean.parse_args(["ledger", "export"]).ledger_command == "export"
    assert full.parse_args(["simulate", "--preset", "iid-longtail"]).preset == "iid-longtail"
