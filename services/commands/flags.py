"""Command-line flags that are shortcuts for settings, derived from the settings' own fields.

A flag takes its type, choices and help from the setting it stands for: from the plain
declaration its pydantic field is built from (services/runtime/setting_specs.py; for the policy,
the core's schema), so building the flags, which `--help` and a typo do, imports neither pydantic
nor numpy. An invalid value is reported with the flag and the value the user typed
(`--tau-max -1: allowed integer in [0, 1000]`), through the same validation as the setting.
"""

from __future__ import annotations

import argparse
import enum
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fedasync.services.runtime.setting_specs import SPECS, SettingPath, env_name
from fedasync.shared.policy import FIELDS, START
from fedasync.shared.policy_text import describe, shown

if TYPE_CHECKING:
    from fedasync.services.runtime.settings import Settings, SettingsError


@dataclass(frozen=True, slots=True)
class Flag:
    """`option` sets the setting `section`.`name`; `help` replaces the setting's description;
    `parse` turns the text typed into the value (JSON for a table), `metavar` then says what."""

    option: str
    section: str
    name: str
    help: str | None = None
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None

    @property
    def path(self) -> SettingPath:
        return (self.section, self.name)

    @property
    def dest(self) -> str:
        return self.option.removeprefix("--").replace("-", "_")


def policy_flags(names: Iterable[str] = START) -> tuple[Flag, ...]:
    """A flag per policy field: `--tau-max` for `tau_max`."""
    return tuple(Flag("--" + name.replace("_", "-"), "policy", name) for name in names)


@dataclass(frozen=True, slots=True)
class Declared:
    """What a setting's declaration says that its flag shows: type, default, description."""

    annotation: Any
    default: Any
    description: str


def declared(path: SettingPath) -> Declared:
    """The declaration the setting at `path` is built from (its settings field is built from the
    same: shared/policy_schema.py, services/runtime/settings.py)."""
    section, name = path
    if section == "policy":
        spec = FIELDS[name]
        kind = spec.kind | None if spec.optional else spec.kind
        return Declared(kind, spec.default, describe(spec))
    if path not in SPECS:
        raise KeyError(f"no setting {section}.{name} in services/runtime/setting_specs.py")
    setting = SPECS[path]
    return Declared(setting.kind, setting.default_value(), setting.description)


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flags: Iterable[Flag],
    defaults: Mapping[SettingPath, Any] | None = None,
) -> None:
    """Add each flag, its default None (not given: the setting decides); the help shows the
    default in force, `defaults` where the command has its own.

    A flag's value is kept as typed: the setting converts and checks it, so a bad value gets the
    same one-line message, naming the flag and the text typed, whatever is wrong with it.
    """
    for flag in flags:
        field = declared(flag.path)
        default = (defaults or {}).get(flag.path, field.default)
        text = flag.help or field.description
        text += f" (default: {shown(default)}; {env_name(*flag.path)})"
        parser.add_argument(
            flag.option,
            dest=flag.dest,
            default=None,
            metavar=flag.metavar or _metavar(field.annotation),
            help=text.replace("%", "%%"),
        )


@dataclass(frozen=True, slots=True)
class Given:
    """What the flags the user gave set: overrides by section, and the flag and text of each."""

    overrides: dict[str, dict[str, Any]]
    flags: dict[SettingPath, str]
    typed: dict[SettingPath, str]

    def named(self, error: SettingsError) -> SettingsError:
        """`error` with what a flag gave named by the flag and the text typed."""
        return error.naming(self.flags, self.typed)

    def load(self, defaults: Mapping[SettingPath, Any] | None = None) -> Settings:
        """The settings with these flags over the FEDASYNC_ variables; `defaults` under both."""
        from fedasync.services.runtime.settings import SettingsError, load_settings

        overrides = {section: dict(values) for section, values in self.overrides.items()}
        for (section, name), value in (defaults or {}).items():
            overrides.setdefault(section, {}).setdefault(name, value)
        try:
            return load_settings(**overrides)
        except SettingsError as exc:
            raise self.named(exc) from None


def given(args: argparse.Namespace, flags: Iterable[Flag]) -> Given:
    """The flags of `flags` the user gave. Raises SettingsError naming the flag when its `parse`
    refuses the text typed."""
    from fedasync.services.runtime.settings import Problem, SettingsError

    chosen = Given({}, {}, {})
    for flag in flags:
        text = getattr(args, flag.dest)
        if text is None:
            continue
        chosen.flags[flag.path] = flag.option
        chosen.typed[flag.path] = text
        value = text
        if flag.parse is not None:
            try:
                value = flag.parse(text)
            except ValueError as exc:
                problem = Problem(flag.path, text, str(exc))
                line = problem.describe(chosen.flags)
                raise SettingsError(f"invalid settings: {line}", (problem,)) from None
        chosen.overrides.setdefault(flag.section, {})[flag.name] = value
    return chosen


def _metavar(annotation: Any) -> str:
    """What the help shows a flag takes: its choices, or N (an integer), X (a number), TEXT."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            annotation = args[0]
    if typing.get_origin(annotation) is typing.Annotated:
        return _metavar(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is Literal:
        return "{" + ",".join(str(c) for c in typing.get_args(annotation)) + "}"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "{" + ",".join(str(member.value) for member in annotation) + "}"
    names = {int: "N", float: "X", str: "TEXT"}
    if annotation in names:
        return names[annotation]
    raise TypeError(f"no flag for a setting of type {annotation!r}")
