"""The snapshot service's hottest answers, written without aiohttp (http_guard.py, FastPath).

A polling fleet mostly asks three things: `GET /v1/models/latest` with the ETag it holds (304),
the same without it (200, the model), and `GET /v1/models/latest/meta`; or the same of a named
run (`GET /v1/runs/<id>/models/latest[/meta]`) this worker already holds (a run not held yet,
or an id that is no run id, is aiohttp's, whose middleware checks it). Their answers change only
when a version is committed or training ends, so they are built once per change (and their
`Date` once per second) as ready bytes, and a request costs a look at its head and a socket write:
what nginx does for a static file. Everything else (long-polls, versions, safetensors, query
strings, bodies, `Connection: close`, HTTP/1.0, any head this does not read with certainty) is
declined and aiohttp answers it, through the same handlers as always (app.py).

The bytes are those aiohttp writes for the same request through app.py's handlers (same status,
same headers in the same order, same body; a test compares them), and each answer is counted in
the same metrics (in plain ints, added to them whenever they are read: `HotAnswers.fold`).
"""

from __future__ import annotations

import json
import re
import sys
import time
from email.utils import formatdate
from typing import TYPE_CHECKING

from aiohttp import __version__ as aiohttp_version

from fedasync.services.snapshot.conditional import none_match
from fedasync.shared.runs import is_run_id
from fedasync.shared.snapshot_protocol import (
    DONE_HEADER,
    LATEST_META_PATH,
    LATEST_PATH,
    VERSION_HEADER,
)

if TYPE_CHECKING:
    from fedasync.services.snapshot.cache import ModelCache, Served
    from fedasync.services.snapshot.metrics import RunMetrics
    from fedasync.services.snapshot.runs import RunCaches

#: the request lines answered here; any other (a query string, HTTP/1.0...) goes to aiohttp
_LATEST = f"GET {LATEST_PATH} HTTP/1.1".encode()
_META = f"GET {LATEST_META_PATH} HTTP/1.1".encode()
#: a named run's: this, the run id, then one of the two tails
_RUN_PREFIX = b"GET /v1/runs/"
_LATEST_TAIL = b"/models/latest HTTP/1.1"
_META_TAIL = b"/models/latest/meta HTTP/1.1"
#: a header line read with certainty: a token, a colon, a value without control characters
_HEADER = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
#: headers that change how a request is read or answered: such requests are aiohttp's
_DECLINED = frozenset(
    {b"content-length", b"transfer-encoding", b"expect", b"upgrade", b"content-encoding"}
)
#: heads remembered at most (then forgotten all at once: a fleet repeats few)
KNOWN_HEADS = 4096
_now = time.time
SERVER = f"Python/{sys.version_info[0]}.{sys.version_info[1]} aiohttp/{aiohttp_version}"


#: what a head asks (an index into `HotAnswers._answers` and `_counts`)
DECLINED, NOT_MODIFIED, MODEL, META = range(4)


class HotAnswers:
    """The fast path of one snapshot app, for every run it holds: the request line names the
    run (the legacy lines the default run), and that run's RunAnswers answers."""

    def __init__(self, runs: RunCaches) -> None:
        self._runs = runs
        #: by the run id as the request line spells it (b"" for the legacy lines)
        self._by_run: dict[bytes, RunAnswers] = {}
        #: whole heads already answered, and whose answers they are
        self._heads: dict[bytes, RunAnswers] = {}

    def known(self, data: bytes) -> tuple[bytes, ...] | None:
        """As RunAnswers.known, for the run whose head `data` was (None: not one answered)."""
        answers = self._heads.get(data)
        return None if answers is None else answers.known(data)

    def answer(self, head: bytes) -> tuple[bytes, ...] | None:
        """The answer to this request head, or None: aiohttp answers it (see the module doc)."""
        answers = self._answers_of(head)
        if answers is None:
            return None
        answer = answers.answer(head)
        if answer is not None:
            if len(self._heads) >= KNOWN_HEADS:
                self._heads.clear()
            self._heads[head] = answers
        return answer

    def _answers_of(self, head: bytes) -> RunAnswers | None:
        """The RunAnswers of the run the request line names, if it is one answered here."""
        line = head[: head.find(b"\r\n")]
        if line in (_LATEST, _META):
            spelled = b""
        elif line.startswith(_RUN_PREFIX):
            rest = line[len(_RUN_PREFIX) :]
            slash = rest.find(b"/")
            if slash < 0 or rest[slash:] not in (_LATEST_TAIL, _META_TAIL):
                return None
            spelled = rest[:slash]
        else:
            return None
        answers = self._by_run.get(spelled)
        if answers is not None:
            return answers
        if spelled:
            run = spelled.decode("latin-1")
            served = self._runs.get(run) if is_run_id(run) else None
        else:
            served = self._runs.default
        if served is None:
            return None  # not held yet (or no run id): aiohttp's middleware decides
        latest, meta = _LATEST, _META
        if spelled:
            latest, meta = _RUN_PREFIX + spelled + _LATEST_TAIL, _RUN_PREFIX + spelled + _META_TAIL
        answers = self._by_run[spelled] = RunAnswers(served.cache, served.metrics, latest, meta)
        return answers


class RunAnswers:
    """The fast path of one run: latest (200 and 304) and latest/meta, for the request lines
    `latest_line` and `meta_line` (the legacy ones by default).

    Its answers are counted in plain ints, one per kind, and added to the run's Prometheus
    metrics when they are read (`fold`, run by the registry before each collection) and before
    the answers change: an answer costs no metric call, and each is counted exactly once.
    """

    def __init__(
        self,
        cache: ModelCache,
        metrics: RunMetrics,
        latest_line: bytes = _LATEST,
        meta_line: bytes = _META,
    ) -> None:
        self._cache = cache
        self._metrics = metrics
        self._latest_line, self._meta_line = latest_line, meta_line
        self._latest_200 = metrics.requests.labels("latest", "200")
        self._latest_304 = metrics.requests.labels("latest", "304")
        self._meta_200 = metrics.requests.labels("meta", "200")
        metrics.registry.folds.append(self.fold)
        # what the answers below were built for, and until when their Date holds
        self._served: Served | None = None
        self._done: dict[str, str] | None = None
        self._second = self._until = 0.0  # the second of their Date, as time.time() reads it
        self._etag = ""
        self._body_size = 0
        #: by kind: the answer (None: aiohttp answers) and how many were given since the fold
        self._answers: list[tuple[bytes, ...] | None] = [None, None, None, None]
        self._counts = [0, 0, 0, 0]
        #: heads already read since the version changed, and what they ask: a fleet's polls
        #: repeat the same few heads (same host, same ETag), so most are read once
        self._known: dict[bytes, int] = {}

    def known(self, data: bytes) -> tuple[bytes, ...] | None:
        """The answer to `data` if it is exactly one request head already read and answered
        (since the version changed), else None: the cheapest way in, for whole heads read at
        once; anything else goes through `answer`."""
        cache = self._cache
        if (
            cache.latest is not self._served
            or cache.done is not self._done
            or cache.closing
            or not self._second <= _now() < self._until
        ):
            return None  # `answer` rebuilds (or declines)
        kind = self._known.get(data, DECLINED)
        self._counts[kind] += 1  # (DECLINED's count is never read)
        return self._answers[kind]

    def answer(self, head: bytes) -> tuple[bytes, ...] | None:
        """The answer to this request head, or None: aiohttp answers it (see the module doc)."""
        cache = self._cache
        served = cache.latest
        if served is None or cache.closing:
            return None  # 503s are aiohttp's
        if (
            served is not self._served
            or cache.done is not self._done
            or not self._second <= _now() < self._until
        ):
            self._build(served, cache.done)
        kind = self._known.get(head)
        if kind is None:  # a head not seen since the version changed: read it
            kind = self._classify(head)
            if len(self._known) >= KNOWN_HEADS:
                self._known.clear()
            self._known[head] = kind
        self._counts[kind] += 1
        return self._answers[kind]

    def fold(self) -> None:
        """Add the answers counted since the last fold to the metrics."""
        counts = self._counts
        not_modified, model, meta = counts[NOT_MODIFIED], counts[MODEL], counts[META]
        counts[:] = [0, 0, 0, 0]
        if not_modified:
            self._metrics.not_modified.inc(not_modified)
            self._latest_304.inc(not_modified)
        if model:
            self._metrics.sent.inc(model * self._body_size)
            self._latest_200.inc(model)
        if meta:
            self._meta_200.inc(meta)

    def _classify(self, head: bytes) -> int:
        """What this head asks of the current version (its ETag decides 304 or 200)."""
        end = head.find(b"\r\n")
        line = head[:end]
        if line != self._latest_line and line != self._meta_line:
            return DECLINED
        if_none_match: bytes | None = None
        for header in head[end + 2 : -4].split(b"\r\n"):
            match = _HEADER.fullmatch(header)
            if match is None:
                return DECLINED
            name = match.group(1).lower()
            if name == b"if-none-match":
                if if_none_match is not None:
                    return DECLINED
                if_none_match = match.group(2)
            elif name == b"connection":
                if match.group(2).lower() != b"keep-alive":
                    return DECLINED
            elif name in _DECLINED:
                return DECLINED
        if line == self._meta_line:
            return META
        if if_none_match is not None and none_match(if_none_match.decode("latin-1"), self._etag):
            return NOT_MODIFIED
        return MODEL

    def _build(self, served: Served, done: dict[str, str]) -> None:
        """(Re)build the answers when the version, the done flag or the second changed."""
        if served is not self._served or done is not self._done:
            self.fold()  # the counts so far were of the answers being replaced (body size)
            self._known.clear()  # an ETag that matched may not match any more
        self._served, self._done = served, done
        second = int(_now())
        self._second, self._until = float(second), second + 1.0
        date = formatdate(second, usegmt=True)
        own = [f"ETag: {served.etag}", f"{VERSION_HEADER}: {served.version}"]
        common = [*own, "Cache-Control: no-cache"]
        if done:
            common.append(f"{DONE_HEADER}: {done.get('reason', 'done')}")
        tail = [f"Date: {date}", f"Server: {SERVER}"]
        self._etag = served.etag
        self._body_size = len(served.body)
        head_304 = _head("304 Not Modified", [*common, *tail])
        head_200 = _head(
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
        meta_200 = (
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
        self._answers = [None, (head_304,), (head_200, served.body), (meta_200,)]


def _head(status: str, headers: list[str]) -> bytes:
    return (f"HTTP/1.1 {status}\r\n" + "".join(f"{h}\r\n" for h in headers) + "\r\n").encode()
