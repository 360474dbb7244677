"""The snapshot service's hottest answers, written without aiohttp (http_guard.py, FastPath).

A polling fleet mostly asks three things: `GET /v1/models/latest` with the ETag it holds (304),
the same without it (200, the model), and `GET /v1/models/latest/meta`. Their answers change only
when a version is committed or training ends, so they are built once per change (and their
`Date` once per second) as ready bytes, and a request costs a look at its head and a socket write:
what nginx does for a static file. Everything else (long-polls, versions, safetensors, query
strings, bodies, `Connection: close`, HTTP/1.0, any head this does not read with certainty) is
declined and aiohttp answers it, through the same handlers as always (app.py).

The bytes are those aiohttp writes for the same request through app.py's handlers (same status,
same headers in the same order, same body; a test compares them), and each answer is counted in
the same metrics.
"""

from __future__ import annotations

import enum
import json
import re
import sys
import time
from email.utils import formatdate
from typing import TYPE_CHECKING

from aiohttp import __version__ as aiohttp_version

if TYPE_CHECKING:
    from fedasync.services.snapshot.app import SnapshotMetrics
    from fedasync.services.snapshot.cache import ModelCache, Served

#: the request lines answered here; any other (a query string, HTTP/1.0...) goes to aiohttp
_LATEST = b"GET /v1/models/latest HTTP/1.1"
_META = b"GET /v1/models/latest/meta HTTP/1.1"
#: a header line read with certainty: a token, a colon, a value without control characters
_HEADER = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
#: headers that change how a request is read or answered: such requests are aiohttp's
_DECLINED = frozenset(
    {b"content-length", b"transfer-encoding", b"expect", b"upgrade", b"content-encoding"}
)
#: heads remembered at most (then forgotten all at once: a fleet repeats few)
KNOWN_HEADS = 4096
SERVER = f"Python/{sys.version_info[0]}.{sys.version_info[1]} aiohttp/{aiohttp_version}"


class _Kind(enum.Enum):
    DECLINED = 0
    NOT_MODIFIED = 1
    MODEL = 2
    META = 3


class HotAnswers:
    """The fast path of one snapshot app: latest (200 and 304) and latest/meta."""

    def __init__(self, cache: ModelCache, metrics: SnapshotMetrics) -> None:
        self._cache = cache
        self._metrics = metrics
        self._latest_200 = metrics.requests.labels("latest", "200")
        self._latest_304 = metrics.requests.labels("latest", "304")
        self._meta_200 = metrics.requests.labels("meta", "200")
        # what the answers below were built for: (served, done) and the second of their Date
        self._for: tuple[Served | None, dict[str, str] | None] = (None, None)
        self._second = -1
        self._etag = b""
        self._head_200 = self._head_304 = self._meta = b""
        self._body = b""
        #: heads already read since the version changed, and what they ask: a fleet's polls
        #: repeat the same few heads (same host, same ETag), so most are read once
        self._known: dict[bytes, _Kind] = {}

    def answer(self, head: bytes) -> list[bytes] | None:
        """The answer to this request head, or None: aiohttp answers it (see the module doc)."""
        cache = self._cache
        served = cache.latest
        if served is None or cache.closing:
            return None  # 503s are aiohttp's
        self._build(served, cache.done)
        kind = self._known.get(head)
        if kind is None:  # a head not seen since the version changed: read it
            kind = self._classify(head)
            if len(self._known) >= KNOWN_HEADS:
                self._known.clear()
            self._known[head] = kind
        if kind is _Kind.NOT_MODIFIED:
            self._metrics.not_modified.inc()
            self._latest_304.inc()
            return [self._head_304]
        if kind is _Kind.MODEL:
            self._metrics.sent.inc(len(self._body))
            self._latest_200.inc()
            return [self._head_200, self._body]
        if kind is _Kind.META:
            self._meta_200.inc()
            return [self._meta]
        return None

    def _classify(self, head: bytes) -> _Kind:
        """What this head asks of the current version (its ETag decides 304 or 200)."""
        end = head.find(b"\r\n")
        line = head[:end]
        if line not in (_LATEST, _META):
            return _Kind.DECLINED
        if_none_match: bytes | None = None
        for header in head[end + 2 : -4].split(b"\r\n"):
            match = _HEADER.fullmatch(header)
            if match is None:
                return _Kind.DECLINED
            name = match.group(1).lower()
            if name == b"if-none-match":
                if if_none_match is not None:
                    return _Kind.DECLINED
                if_none_match = match.group(2)
            elif name == b"connection":
                if match.group(2).lower() != b"keep-alive":
                    return _Kind.DECLINED
            elif name in _DECLINED:
                return _Kind.DECLINED
        if line == _META:
            return _Kind.META
        if if_none_match is not None and self._etag in _etags(if_none_match):
            return _Kind.NOT_MODIFIED
        return _Kind.MODEL

    def _build(self, served: Served, done: dict[str, str]) -> None:
        """(Re)build the answers when the version, the done flag or the second changed."""
        second = int(time.time())
        if self._for[0] is served and self._for[1] is done and self._second == second:
            return
        if self._for[0] is not served or self._for[1] is not done:
            self._known.clear()  # an ETag that matched may not match any more
        self._for, self._second = (served, done), second
        date = formatdate(second, usegmt=True)
        own = [f"ETag: {served.etag}", f"X-Fedasync-Version: {served.version}"]
        common = [*own, "Cache-Control: no-cache"]
        if done:
            common.append(f"X-Fedasync-Training-Done: {done.get('reason', 'done')}")
        tail = [f"Date: {date}", f"Server: {SERVER}"]
        self._etag = served.etag.encode()
        self._body = served.body
        self._head_304 = _head("304 Not Modified", [*common, *tail])
        self._head_200 = _head(
            "200 OK",
            [
                *common,
                "Content-Type: application/vnd.fedasync.model+msgpack",
                f"Content-Length: {len(served.body)}",
                *tail,
            ],
        )
        meta = json.dumps(served.meta | {"etag": served.etag, "training_done": done or None})
        body = meta.encode()
        self._meta = (
            _head(
                "200 OK",
                [
                    *own[1:],
                    "Content-Type: application/json; charset=utf-8",
                    f"Content-Length: {len(body)}",
                    *tail,
                ],
            )
            + body
        )


def _head(status: str, headers: list[str]) -> bytes:
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode()


def _etags(header: bytes) -> set[bytes]:
    """As app.py's `_etags`, on bytes."""
    return {tag.strip() for tag in header.split(b",") if tag.strip()}
