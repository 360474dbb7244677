"""The policy schema (shared/policy.py) as pydantic fields, for the models that hold a policy.

The settings (FEDASYNC_POLICY__*) and the simulator's algorithm tables are pydantic models whose
policy fields are built here from `SCHEMA`, with the core's ranges as their validators; their
descriptions, the command-line flags and the docs' tables come from shared/policy_text.py. No
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

from fedasync.shared.params import ParamError
from fedasync.shared.policy import FIELDS, FieldSpec
from fedasync.shared.policy_text import describe

M = TypeVar("M", bound=BaseModel)


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
