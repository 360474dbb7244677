"""The policy schema (shared/policy.py) in the forms the rest of the tree reads.

The settings (FEDASYNC_POLICY__*) and the simulator's algorithm tables are pydantic models whose
policy fields are built here from `SCHEMA`, with the core's ranges as their validators; the
command-line flags are built from those settings fields; the docs' tables from `SCHEMA` too. No
field, default, range or description is written anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    create_model,
)

from fedasync.shared.params import ParamError, Scope
from fedasync.shared.policy import FIELDS, MODE_PRESETS, SCHEMA, FieldSpec

M = TypeVar("M", bound=BaseModel)


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


def _checker(spec: FieldSpec, words: tuple[str, ...]) -> AfterValidator | WrapValidator:
    """The core's own check of the field, as a pydantic validator of that one key.

    With `words` the field is a union (`int | Literal["auto"]`): its failures become one message
    naming everything allowed instead of one per branch of the union.
    """

    def check(value: Any) -> Any:
        try:
            spec.normalise(value)
        except ParamError as exc:
            raise ValueError(f"allowed {exc.allowed}") from None
        return value

    if not words:
        return AfterValidator(check)
    allowed = " or ".join([str(spec.allowed), *(f'"{w}"' for w in words)])

    def check_union(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if isinstance(value, str) and value in words:
            return value
        try:
            return check(handler(value))
        except (ValidationError, ValueError):
            raise ValueError(f"allowed {allowed}") from None

    return WrapValidator(check_union)


def pydantic_fields(
    names: Iterable[str], words: Mapping[str, tuple[str, ...]] | None = None
) -> dict[str, Any]:
    """`create_model` definitions of these policy fields: type, default, description, range.

    `words`: strings a field also accepts besides its type (the simulator's `tau_max = "auto"`).
    """
    out: dict[str, Any] = {}
    for name in names:
        spec = FIELDS[name]
        extra = (words or {}).get(name, ())
        kind: Any = spec.kind | None if spec.optional else spec.kind
        if extra:
            kind = kind | Literal[extra]
        annotated = Annotated[kind, _checker(spec, extra)]
        out[name] = (annotated, Field(spec.default, description=describe(spec)))
    return out


def policy_model(
    name: str,
    base: type[M],
    names: Iterable[str],
    *,
    doc: str,
    words: Mapping[str, tuple[str, ...]] | None = None,
) -> type[M]:
    """A model with `base`'s own fields and methods plus these policy fields."""
    return create_model(
        name,
        __base__=base,
        __doc__=doc,
        __module__=base.__module__,
        **pydantic_fields(names, words),
    )


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
