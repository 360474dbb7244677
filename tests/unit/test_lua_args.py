"""A script's named arguments: ARGV[1] names every field and says where each value is."""

from __future__ import annotations

import json
from enum import StrEnum

import pytest

from fedasync.services.runtime.lua import ScriptArgs, prelude


def test_the_fields_name_where_the_values_are() -> None:
    args = ScriptArgs(expected=4, epoch="2", announce=True)
    args.value("model", b"\x00\xff")
    args.section("ledger", record=[b"r0", b"r1"], receipt=["a", "b"])
    args.section("acks", id=[])
    fields, *values = args.argv()
    assert isinstance(fields, str)
    assert json.loads(fields) == {
        "expected": 4,
        "epoch": "2",
        "announce": True,
        "at": {"model": 2},
        "ledger": {"n": 2, "record": 3, "receipt": 5},
        "acks": {"n": 0, "id": 7},
    }
    # Lua's ARGV[i] is values[i - 2]: ARGV[1] is the fields
    assert values == [b"\x00\xff", b"r0", b"r1", "a", "b"]


def test_a_name_is_given_once_and_columns_are_of_one_length() -> None:
    args = ScriptArgs(version=1)
    with pytest.raises(ValueError, match="given twice"):
        args.field("version", 2)
    with pytest.raises(ValueError, match="given twice"):
        args.section("at", x=[])
    args.value("model", b"")
    with pytest.raises(ValueError, match="given twice"):
        args.value("model", b"")
    with pytest.raises(ValueError, match="unequal lengths"):
        args.section("ledger", record=[b"r"], receipt=[])
    with pytest.raises(TypeError, match="None"):
        args.field("switch", None)  # type: ignore[arg-type]


class Answer(StrEnum):
    YES = "yes"
    NOT_NOW = "not-now"


def test_the_prelude_names_every_member_of_the_enum() -> None:
    text = prelude(Answer)
    assert "YES = 'yes', NOT_NOW = 'not-now'" in text
    assert "Answer has no outcome" in text


def test_no_field_is_none_or_named_at() -> None:
    with pytest.raises(TypeError, match="None"):
        ScriptArgs(switch=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="named `at`"):
        ScriptArgs(at=1)
