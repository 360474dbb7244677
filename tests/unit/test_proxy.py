"""The fault proxy's reading of requests: whole commands only, named by command and key."""

from __future__ import annotations

import pytest

from fedasync.services.commands.chaos.proxy import Command, command_of, parse_request


def resp(*args: bytes) -> bytes:
    out = b"*%d\r\n" % len(args)
    for arg in args:
        out += b"$%d\r\n%s\r\n" % (len(arg), arg)
    return out


def test_a_pipeline_is_read_one_command_at_a_time() -> None:
    buf = bytearray(resp(b"HMGET", b"{p}:device-keys", b"a") + resp(b"GET", b"{p}:policy"))
    first = parse_request(buf, 0)
    assert first is not None
    args, end = first
    assert args == [b"HMGET", b"{p}:device-keys", b"a"]
    second = parse_request(buf, end)
    assert second is not None
    assert second[0] == [b"GET", b"{p}:policy"]
    assert second[1] == len(buf)
    assert parse_request(buf, len(buf)) is None


@pytest.mark.parametrize("cut", [1, 5, 12, 20])
def test_a_command_split_across_reads_waits_for_its_end(cut: int) -> None:
    whole = resp(b"SET", b"{p}:genesis", b"x" * 10)
    assert parse_request(bytearray(whole[:cut]), 0) is None
    assert parse_request(bytearray(whole), 0) is not None


def test_an_inline_command_is_read_too() -> None:
    parsed = parse_request(bytearray(b"PING\r\n"), 0)
    assert parsed == ([b"PING"], 6)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ([b"xinfo", b"GROUPS", b"{p}:updates"], Command("XINFO GROUPS", "{p}:updates")),
        (
            [b"XGROUP", b"CREATE", b"{p}:updates", b"g", b"0"],
            Command("XGROUP CREATE", "{p}:updates"),
        ),
        ([b"SCRIPT", b"LOAD", b"return 1"], Command("SCRIPT LOAD")),
        (
            [b"XREADGROUP", b"GROUP", b"g", b"c", b"COUNT", b"3", b"STREAMS", b"{p}:updates", b">"],
            Command("XREADGROUP", "{p}:updates"),
        ),
        (
            [b"EVALSHA", b"abc", b"2", b"{p}:commit-seq", b"{p}:epoch", b"1"],
            Command("EVALSHA", "{p}:commit-seq"),
        ),
        ([b"EVALSHA", b"abc", b"0"], Command("EVALSHA")),
        ([b"PING"], Command("PING")),
        ([b"INCRBY", b"{p}:aggregator-epoch", b"1"], Command("INCRBY", "{p}:aggregator-epoch")),
    ],
)
def test_commands_are_named_with_their_key(args: list[bytes], named: Command) -> None:
    assert command_of(args) == named
