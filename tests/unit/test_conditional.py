"""`If-None-Match` compared as RFC 9110 has it: `*`, or a list of tags compared weakly."""

from __future__ import annotations

import pytest

from fedasync.services.snapshot.conditional import none_match

ETAG = '"v42-0123456789abcdef"'


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        (ETAG, True),
        (f"W/{ETAG}", True),  # a weak tag of the same opaque part: a GET compares weakly
        (f'"v41-ffffffffffffffff", {ETAG}', True),
        (f'  "x"  ,W/{ETAG}  ', True),
        ("*", True),
        (" * ", True),
        ("", False),
        ('"v41-ffffffffffffffff"', False),
        ("v42-0123456789abcdef", False),  # unquoted: not an entity tag
        ('"v42-0123456789abcdef-safetensors"', False),  # the other representation
        ('"a,b", "c"', False),  # a comma inside a tag does not split it
    ],
)
def test_if_none_match(header: str, matches: bool) -> None:
    assert none_match(header, ETAG) is matches


def test_a_tag_holding_a_comma_is_matched_whole() -> None:
    assert none_match('"x", "a,b"', '"a,b"')
    assert not none_match('"a,b"', '"a"')
