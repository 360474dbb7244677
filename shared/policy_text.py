"""The policy schema (shared/policy.py) as text: values, descriptions and the docs' table.

The one wording of each field that the settings' and the simulator's pydantic fields
(shared/policy_schema.py), the command-line flags' help and docs/configuration.md all show. It
imports no pydantic, so `fedasync alpha --help` and `fedasync up --help` need none.
"""

from __future__ import annotations

from typing import Any

from fedasync.shared.params import Scope
from fedasync.shared.policy import MODE_PRESETS, SCHEMA, FieldSpec


def shown(value: Any) -> str:
    """A value as a user writes it in a setting, a flag or a config (enums by their value)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(getattr(value, "value", value))


def preset_note(spec: FieldSpec) -> str:
    """What each mode's preset sets this field to, e.g. "mode fedbuff: 0.5"; "" if none does."""
    notes = [
        f"mode {mode.value}: {shown(preset[spec.name])}"
        for mode, preset in MODE_PRESETS.items()
        if spec.name in preset and preset[spec.name] != spec.default
    ]
    return ", ".join(notes)


def describe(spec: FieldSpec) -> str:
    """The field's description with its range and its mode presets: the text every form shows."""
    parts = [spec.description]
    if spec.allowed is not None:
        parts.append(f"allowed {spec.allowed}")
    elif spec.choices:
        parts.append("one of " + ", ".join(spec.choices))
    note = preset_note(spec)
    if note:
        parts.append(f"under {note}")
    return "; ".join(parts)


def reference_table() -> str:
    """Markdown table of every policy field: default, allowed values, when it may be set."""
    when = {
        Scope.START: "start, runtime",
        Scope.RUNTIME: "runtime",
        Scope.VERSION: "never (each change raises it)",
    }
    rows = [
        "| field | default | allowed | mode presets | set | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for spec in SCHEMA:
        if spec.allowed is not None:
            allowed = str(spec.allowed)
        elif spec.choices:
            allowed = ", ".join(f"`{c}`" for c in spec.choices)
        else:
            allowed = "true, false"
        rows.append(
            f"| `{spec.name}` | `{shown(spec.default)}` | {allowed} | {preset_note(spec)} | "
            f"{when[spec.scope]} | {spec.description} |"
        )
    return "\n".join(rows) + "\n"
