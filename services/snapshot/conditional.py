"""`If-None-Match` as HTTP has it (RFC 9110, section 13.1.2), for both of the service's paths.

The header is `*` or a comma-separated list of entity tags, and a GET compares them weakly: a
client (or a cache in between) that sends our tag back as `W/"v42-…"` still gets its 304. A tag
is matched as a whole quoted string, so one that holds a comma is not split in two.
"""

from __future__ import annotations

import re

#: one entity tag of a list, weak or strong: its quoted part is what a weak comparison compares
_TAG = re.compile(r'(?:W/)?("[^"]*")')


def none_match(header: str, etag: str) -> bool:
    """Whether an `If-None-Match` header names `etag` (a strong tag, quotes included): 304."""
    if header.strip() == "*":
        return True
    return any(match.group(1) == etag for match in _TAG.finditer(header))
