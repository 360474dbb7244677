"""Lua scripts by name: a `.lua` file beside its one caller, named arguments, named outcomes.

A script positional in ARGV (20 entries, and an offset into them written once in Lua and once
in Python) breaks silently when one side moves a field. Here both sides name everything:

- Arguments (`ScriptArgs`): ARGV[1] is one JSON object the script decodes with cjson. It holds
  the named fields (numbers, flags, short text) and says where everything else is: values that
  may be binary or large (a model, msgpack records, payloads) are never put through JSON (cjson
  carries text only) but follow as their own ARGV entries, byte for byte, and the object names
  their indexes. `value("model", b)` adds one entry and sets `at.model` to its index (the script
  reads `ARGV[f.at.model]`); `section("ledger", record=[...], receipt=[...])` adds columns of
  one length and sets `ledger = {n = rows, record = index of the first record, receipt = ...}`
  (row k's record is `ARGV[f.ledger.record + k]`, k from 0). Nobody counts positions by hand.
- Outcomes: a script that can end in more than one way returns the value of a `StrEnum` member
  of its caller's, and reads it from a table generated from that enum and prepended to the script
  at load (`Outcome.FENCED` in Lua is `CommitOutcome.FENCED` in Python), so the one list of
  outcomes is the enum. A name the enum lacks is an error in the script, never a nil reply.
- Loading: `load` reads the file with importlib.resources, so it works from the installed wheel
  (pyproject.toml ships the `.lua` files as package data) as from the checkout, once per process.
  The script runs with EVALSHA, and SCRIPT LOAD when the server does not know it yet (redis-py's
  own way, and the commands the services' Redis users are granted: stores/acl.py). On a Redis
  Cluster the SCRIPT LOAD goes to the primary of the script's first key only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from enum import StrEnum
from importlib import resources
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from fedasync.services.runtime.redis_cluster import is_cluster, on_node_of

#: what one ARGV entry after the fields may be: redis-py encodes them as it does any argument
Value = bytes | str | int

E = TypeVar("E", bound=StrEnum)

#: the fields' JSON, compact: one encoder made once (json.dumps with options makes one per call)
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

#: a named field: what JSON carries exactly (no None: cjson reads null as a value that is true)
Field = str | int | float | bool


class ScriptArgs:
    """A script's ARGV: the named fields in ARGV[1], the values after it, named by index."""

    def __init__(self, **fields: Field) -> None:
        if None in fields.values() or "at" in fields:
            raise TypeError(f"fields {sorted(fields)}: none may be None or named `at`")
        self._fields: dict[str, Any] = fields
        self._at: dict[str, int] = {}
        self._values: list[Value] = []

    def field(self, name: str, value: Field) -> None:
        """A named field of the JSON object: the script reads `f.<name>`."""
        if value is None:
            raise TypeError(f"field {name!r} is None: leave it out instead")
        self._claim(name)
        self._fields[name] = value

    def value(self, name: str, value: Value) -> None:
        """One ARGV entry, bytes passed unchanged: the script reads `ARGV[f.at.<name>]`."""
        if name in self._at:
            raise ValueError(f"value {name!r} given twice")
        self._at[name] = self._next()
        self._values.append(value)

    def section(self, name: str, **columns: Sequence[Value]) -> None:
        """Rows of values, one ARGV run per column: the script reads `f.<name>.n` (the rows) and
        `ARGV[f.<name>.<column> + k]`, row k from 0."""
        rows = len(next(iter(columns.values()), ()))
        if any(len(column) != rows for column in columns.values()):
            lengths = sorted({len(column) for column in columns.values()})
            raise ValueError(f"section {name!r}: columns of unequal lengths {lengths}")
        self._claim(name)
        section: dict[str, int] = {"n": rows}
        for column, values in columns.items():
            section[column] = self._next()
            self._values.extend(values)
        self._fields[name] = section

    def argv(self) -> list[Value]:
        """ARGV as sent: the JSON object, then the values in the order they were added."""
        fields = {**self._fields, "at": self._at} if self._at else self._fields
        return [_encode(fields), *self._values]

    def _claim(self, name: str) -> None:
        if name in self._fields or name == "at":
            raise ValueError(f"field {name!r} given twice (or named `at`, kept for the values)")

    def _next(self) -> int:
        return len(self._values) + 2  # Lua counts from 1, and ARGV[1] is the JSON object


class LuaScript:
    """One script, its text as loaded (outcomes prelude included) and its SHA1; runs on any
    client or connection, and is made once per process, not once per call."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    async def __call__(
        self, client: aioredis.Redis, keys: Sequence[str], args: Sequence[Value]
    ) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            if is_cluster(client):
                # the node that refused it, not every primary (redis-py's SCRIPT LOAD): while
                # another primary is down, that would fail this run's reload too. Scripts are
                # not replicated, so a replica promoted by a failover starts without them
                await on_node_of(client, keys[0], "SCRIPT LOAD", self.source)
            else:
                await client.script_load(self.source)
            return await client.evalsha(self.sha, len(keys), *keys, *args)


def prelude(outcomes: type[StrEnum]) -> str:
    """`local Outcome = {NAME = 'value', ...}` for the enum, refusing names it does not hold."""
    names = ", ".join(f"{member.name} = {_lua_string(member.value)}" for member in outcomes)
    return (
        f"local Outcome = setmetatable({{{names}}}, {{__index = function(_, name)\n"
        f"  error('{outcomes.__name__} has no outcome ' .. tostring(name))\n"
        "end})\n"
    )


def load(package: str | None, name: str, outcomes: type[StrEnum] | None = None) -> LuaScript:
    """The script `name` of `package` (a file beside its caller: pass `__package__`), with
    `outcomes`' prelude."""
    if not package:
        raise ValueError(f"{name}: load it from a module of a package (`__package__`)")
    text = resources.files(package).joinpath(name).read_text(encoding="utf-8")
    return LuaScript(f"{package}/{name}", (prelude(outcomes) if outcomes else "") + text)


def outcome(outcomes: type[E], reply: bytes | str) -> E:
    """The member of `outcomes` a script returned (ValueError for a value the enum lacks)."""
    return outcomes(reply.decode() if isinstance(reply, bytes) else reply)


def _lua_string(text: str) -> str:
    if not all(c.isalnum() or c in "-_" for c in text):
        raise ValueError(f"outcome {text!r}: letters, digits, - and _ only")
    return f"'{text}'"
