"""Which run a request is about, decided once for every route of a service.

Every route of the control, snapshot and ingest services has a twin under `/v1/runs/{run}/…`;
the legacy route (no `{run}` in its pattern) means the default run, as before runs existed. One
middleware reads the `{run}` of the matched route, refuses an id outside the grammar (400
`bad_run_id`) or one that names no run (404 `unknown_run`), and hands the handler a RunContext:
the run's id, keys and Redis client. Handlers read `request[RUN]`, never a service-wide prefix,
so a handler cannot serve one run's keys for another's path.

Whether a run exists is `EXISTS {run}:run` in the run's own slot (never the directory, which may
be on another primary), cached briefly: a hit for a few seconds, a miss for one, so a new run is
served within a second and a flood of unknown ids costs one small read each second per id at
most (bounded: the cache forgets the oldest entries).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from fedasync.services.runtime.run_clients import RunClients
from fedasync.shared.keys import Keys
from fedasync.shared.runs import BAD_RUN_ID, UNKNOWN_RUN, RunIdError, check_run_id

#: the route variable that names a run
RUN_VARIABLE = "run"


@dataclass(frozen=True, slots=True)
class RunContext:
    """The run a request is about: its id, its keys, the client of its slot, and whether it came
    by a legacy route (`legacy`: the request named no run)."""

    id: str
    keys: Keys
    redis: aioredis.Redis
    legacy: bool


#: the request's RunContext (set by `runs_middleware` on every request)
RUN = web.RequestKey("run", RunContext)

#: whether a run exists, given its client and id (services/stores/runs.run_exists)
Exists = Callable[[aioredis.Redis, str], Awaitable[bool]]


class KnownRuns:
    """Whether a run exists, cached: `hit_s` for a run seen, `miss_s` for one not (yet) seen.

    The default run always exists (it is the deployment's own prefix, created or not)."""

    def __init__(
        self,
        clients: RunClients,
        exists: Exists,
        *,
        hit_s: float = 5.0,
        miss_s: float = 1.0,
        capacity: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clients = clients
        self._exists = exists
        self._hit_s, self._miss_s, self._capacity, self._clock = hit_s, miss_s, capacity, clock
        self._seen: OrderedDict[str, tuple[bool, float]] = OrderedDict()

    async def exists(self, run: str) -> bool:
        if run == self.clients.default:
            return True
        now = self._clock()
        cached = self._seen.get(run)
        if cached is not None and now < cached[1]:
            return cached[0]
        known = await self._exists(self.clients.for_run(run), run)
        self._seen[run] = (known, now + (self._hit_s if known else self._miss_s))
        self._seen.move_to_end(run)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        return known

    def learn(self, run: str) -> None:
        """Count `run` as existing now (this process just created it)."""
        self._seen[run] = (True, self._clock() + self._hit_s)
        self._seen.move_to_end(run)

    def forget(self, run: str) -> None:
        """Stop counting `run` as existing (this process just retired it)."""
        self._seen.pop(run, None)


def refusal(status: int, reason: str, message: str) -> web.Response:
    """The `{"error", "reason"}` answer of a request for a run that cannot be served."""
    return web.json_response({"error": message, "reason": reason}, status=status)


def runs_middleware(known: KnownRuns) -> Middleware:
    """The middleware that sets `request[RUN]` (see the module's docstring).

    Routes that name a run they may create (POST /v1/runs has none in its pattern) pass; a
    route whose pattern has `{run}` is served only for a run that exists."""
    clients = known.clients

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        named = request.match_info.get(RUN_VARIABLE)
        if named is None:
            run, legacy = clients.default, True
        else:
            try:
                run = check_run_id(named)
            except RunIdError as exc:
                return refusal(400, BAD_RUN_ID, str(exc))
            if not await known.exists(run):
                return refusal(404, UNKNOWN_RUN, f"no run {run!r} in this deployment")
            legacy = False
        request[RUN] = RunContext(run, Keys(run), clients.for_run(run), legacy)
        return await handler(request)

    return middleware
