"""The ingest service's app: POST /v1/updates adds a device's update to the stream once;
GET /v1/updates/{update_id} tells a device the decision about one of its own updates
(services/ingest/receipts.py). Both have a twin per run, `/v1/runs/{run}/updates[/{update_id}]`;
the legacy routes mean the default run (services/runtime/run_routes.py).

Each run gets its own `Ingest` (its keys, key cache, update store, policy, receipts, body limit
and signature domain), made at its first request, at most `FEDASYNC_INGEST__MAX_RUNS` of them
(beyond: 503 `too_many_runs`, nothing read). What guards the process stays shared: the budget of
unverified bytes (one process's memory), the rate limiters and the metrics. A device's token
bucket is keyed by (run, client id): client ids are chosen by each run's operators, so two runs'
devices of the same name are not made to share one rate, and a device enrolled in two runs
holds two keys, two identities.

The order of checks spends as little as possible on a request that will be refused: media type,
encoding (a compressed body is refused, never inflated) and declared length first (a body over
the limit is never read; the limit is the largest update of the run's model unless set:
services/ingest/body_limit.py), then the signature headers and the device's key (an unknown
device's body is never read), then the budget of unverified bytes (services/ingest/budget.py: a
body beyond it is never read), then the body, fed to the MAC as it streams in (capped while
reading, for chunked uploads), its MAC and signing time, the device's rate, the strict wire
decoder and the client id inside the message. A body whose MAC does not hold is dropped as soon
as that is known, and gives its bytes back to the budget.
Only then is it added to the stream, idempotently (services/ingest/store.py), and 202 is answered
once Redis has acknowledged the XADD (in durable mode: once WAIT says the replicas hold it).

Every refusal is one `Refusal` (services/ingest/refusal.py): a status, a stable reason, a JSON
body, a log line and a count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from aiohttp import web
from redis.exceptions import ResponseError

from fedasync.services.ingest.body_limit import BodyLimit
from fedasync.services.ingest.budget import UnverifiedBudget
from fedasync.services.ingest.metrics import IngestMetrics
from fedasync.services.ingest.openapi import RUN_PATH, RUN_RECEIPT_PATH, spec
from fedasync.services.ingest.receipts import ReceiptReader, not_decided
from fedasync.services.ingest.refusal import (
    RateLimiter,
    Refusal,
    device_known,
    request_proof,
    unavailable,
)
from fedasync.services.ingest.store import (
    IngestStore,
    KeyChanged,
    RunDone,
    SignedOutsideWindow,
    UpdateIdReused,
)
from fedasync.services.runtime.http_errors import json_errors
from fedasync.services.runtime.http_query import documented
from fedasync.services.runtime.http_service import livez, redis_readiness
from fedasync.services.runtime.prometheus import REGISTRY, metrics_response
from fedasync.services.runtime.redis_conn import TRANSIENT, is_out_of_memory
from fedasync.services.runtime.run_clients import RunClients
from fedasync.services.runtime.run_routes import RUN, KnownRuns, RunContext, runs_middleware
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.policy_store import PolicyCache
from fedasync.services.stores.runs import run_exists
from fedasync.shared.device_auth import (
    AuthError,
    AuthReason,
    BodyCheck,
    Proof,
    VerifyKey,
    check_claim,
    read_domain,
    stream_id_ms,
    update_domain,
    verify,
)
from fedasync.shared.ingest_protocol import (
    CLIENT_HEADER,
    CONTENT_TYPE,
    INGEST_PAUSED,
    NOT_DECIDED,
    PATH,
    RECEIPT_PATH,
    REDIS_OUT_OF_MEMORY,
    RUN_DONE,
)
from fedasync.shared.keys import Keys
from fedasync.shared.runs import BAD_RUN_ID, UNKNOWN_RUN, RunIdError, check_run_id
from fedasync.shared.snapshot_protocol import DONE_HEADER
from fedasync.shared.wire import WireError, WireReason, decode_update

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Accepted:
    """An update added to the stream (or found there: a retry), and the size of its body as
    read, which a chunked upload declares nowhere else (no Content-Length)."""

    update_id: str
    entry_id: str
    new: bool
    body_bytes: int


class Guards:
    """What guards the whole process, whichever run a request is for: the metrics, the rate
    limiters (a bucket per run and device) and the budget of unverified bytes."""

    def __init__(self, settings: Settings) -> None:
        self.metrics = IngestMetrics()
        self.limiter = RateLimiter(settings.ingest.rate_per_s, settings.ingest.burst)
        #: a device may read receipts as fast as it may publish: its own bucket, not the same one
        self.read_limiter = RateLimiter(
            settings.ingest.rate_per_s, settings.ingest.burst, what="receipt reads"
        )
        self.budget = UnverifiedBudget(
            settings.ingest.unverified_bytes,
            settings.ingest.unverified_bytes_per_client,
            settings.ingest.budget_retry_after_s,
        )
        self.metrics.unverified_bytes.set_function(lambda: self.budget.in_flight)


class Ingest:
    """One run's ingest: its keys, key cache, update store, policy, receipts, body limit and
    signature domain, beside the process's guards (shared by every run)."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        run: RunContext | None = None,
        guards: Guards | None = None,
        *,
        default: bool = True,
    ) -> None:
        keys = Keys(settings.redis.key_prefix) if run is None else run.keys
        guards = guards or Guards(settings)
        self.settings = settings
        self.redis = redis
        self.run = keys.prefix
        #: how devices name this run in what they sign: None for the deployment's default run
        signed_as = None if default else keys.prefix
        self.domain = update_domain(signed_as)
        self.keys_cache = KeyCache(redis, keys, settings.auth.key_refresh_s)
        self.store = IngestStore(
            redis,
            keys,
            settings.ingest.idempotency_ttl_s,
            window_ms=settings.auth.window_ms,
            durability=settings.redis.durability,
        )
        self.guards = guards
        self.limiter = guards.limiter
        self.policy = PolicyCache(redis, keys, settings.ingest.policy_refresh_s)
        self.metrics = guards.metrics
        self.receipts = ReceiptReader(
            settings, redis, keys, self.keys_cache, guards.read_limiter, read_domain(signed_as)
        )
        self.body_limit = BodyLimit(settings, redis, keys)
        self.budget = guards.budget

    def refuse(self, request: web.Request, refusal: Refusal) -> web.Response:
        self.metrics.refusals.labels(refusal.reason).inc()
        log.warning(
            "refused %s from %s: %s",
            request.headers.get(CLIENT_HEADER, "?")[:128],
            request.remote,
            refusal,
        )
        response = web.json_response(
            {"error": refusal.detail, "reason": refusal.reason},
            status=refusal.status,
            headers=refusal.headers,
        )
        if not request.content.is_eof():
            response.force_close()  # the body is not read: the connection cannot be reused
        return response

    def check_encoding(self, request: web.Request) -> None:
        """A compressed body is refused unread: inflating it would cost memory before its
        signature (over the bytes as sent) could be checked, and a small body can inflate to a
        huge one. Update messages are float arrays, which hardly compress anyway."""
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            raise Refusal(
                415,
                "content_encoding",
                f"Content-Encoding {encoding[:64]!r} is not accepted: send the message as is",
            )

    async def check_length(self, request: web.Request) -> int:
        """The body limit in force, once the declared length is within it (413 if not)."""
        limit = await self.body_limit.get(time.monotonic())
        self.metrics.body_limit_bytes.set(limit)
        length = request.content_length
        if length is not None and length > limit:
            raise Refusal(413, "too_large", f"body of {length} bytes > limit {limit}; not read")
        return limit

    async def accept(self, request: web.Request) -> Accepted:
        """Every check, then the idempotent XADD; what was accepted, or a Refusal.

        The pause switch is checked first of all: while ingest is paused nothing is read.
        """
        await self.check_not_paused()
        if request.content_type != CONTENT_TYPE:
            raise Refusal(
                415,
                "unsupported_media_type",
                f"Content-Type must be {CONTENT_TYPE}, got {request.content_type!r}",
            )
        self.check_encoding(request)
        limit = await self.check_length(request)
        proof = request_proof(request)
        known = await device_known(self.keys_cache, proof)
        key = known.key
        self.limiter.check(proof.client_id, time.monotonic(), take=False, run=self.run)
        body = await self.read_verified(request, proof, key, limit)
        window_ms = self.settings.auth.window_ms
        self.limiter.check(proof.client_id, time.monotonic(), take=True, run=self.run)
        try:
            update = decode_update(body, self.settings.wire.max_message_bytes)
            check_claim(proof, update.client_id)
        except WireError as exc:
            status = 413 if exc.reason is WireReason.TOO_LARGE else 422
            raise Refusal(status, exc.reason.value, exc.detail) from None
        except AuthError as exc:
            raise Refusal(403, exc.reason.value, exc.detail) from None
        update_id = update.update_id
        del update  # its weights are a copy of the body's: not held while Redis takes the body
        try:
            ingested = await self.store.add(
                proof.client_id, update_id, body, proof, known.fingerprint
            )
        except UpdateIdReused as exc:
            raise Refusal(409, "update_id_reused", str(exc)) from None
        except KeyChanged as exc:
            raise await self.key_changed(exc) from None
        except RunDone as exc:
            raise Refusal(
                409, RUN_DONE, f"run {self.run!r}: {exc}", {DONE_HEADER: exc.reason}
            ) from None
        except SignedOutsideWindow as exc:
            # then by Redis's clock, the aggregator's: what it would refuse is never acknowledged
            raise outside_window(proof, key, body, exc.entry_id, window_ms, self.domain) from None
        except TRANSIENT as exc:
            # maybe added, maybe not: a retry with the same update id settles it
            raise unavailable(exc) from None
        except ResponseError as exc:
            if not is_out_of_memory(exc):
                raise
            # refused whole, nothing added: the device sends it again later
            log.error("Redis is out of memory: update refused, device told to retry (%s)", exc)
            raise Refusal(
                503,
                REDIS_OUT_OF_MEMORY,
                "the update store is full; retry later",
                {"Retry-After": str(self.settings.ingest.paused_retry_after_s)},
            ) from None
        return Accepted(update_id, ingested.entry_id, ingested.new, len(body))

    async def key_changed(self, exc: KeyChanged) -> Refusal:
        """The 401 for an update signed with a key rotated or revoked while it arrived: the
        key of now says which (`revoked`, `unknown_device`, else `bad_signature`)."""
        self.keys_cache.forget(exc.client_id)
        try:
            await self.keys_cache.get(exc.client_id)
        except AuthError as now:
            return Refusal(401, now.reason.value, now.detail)
        except TRANSIENT as gone:
            return unavailable(gone)
        detail = f"{exc}: sign it with the device's new key"
        return Refusal(401, AuthReason.BAD_SIGNATURE.value, detail)

    async def read_verified(
        self, request: web.Request, proof: Proof, key: VerifyKey, limit: int
    ) -> bytes:
        """The body, once its MAC and signing time hold.

        It reserves its declared length (or the limit, if chunked) in the budget of unverified
        bytes before a byte is read, and gives it back once its MAC is known. Each chunk is fed
        to the MAC as it arrives and kept only until then: a forged body is dropped when it
        ends, never joined, decoded or stored.
        """
        reserved = limit if request.content_length is None else request.content_length
        with self.budget.hold(proof.client_id, reserved, limit):
            state = BodyCheck(key, proof.client_id, proof.signed_at_ms, self.domain)
            allowed_s = self.upload_deadline_s(reserved)
            try:
                async with asyncio.timeout(allowed_s):
                    chunks = await _read(request, state, limit, self.metrics)
            except TimeoutError:
                raise Refusal(
                    408,
                    "upload_too_slow",
                    f"the body of {reserved} bytes did not arrive within {allowed_s:.0f} s "
                    f"(at least {self.settings.ingest.min_upload_bytes_per_s} bytes/s after "
                    f"{self.settings.http.body_timeout_s:.0f} s)",
                ) from None
            now_ms = int(time.time() * 1000)
            try:  # by this clock first: most late signatures are refused without a write
                state.check(proof, now_ms, self.settings.auth.window_ms)
            except AuthError as exc:
                raise Refusal(401, exc.reason.value, exc.detail) from None
        return b"".join(chunks)

    def upload_deadline_s(self, reserved: int) -> float:
        """How long a body of `reserved` bytes may take to arrive: a grace of the longest pause
        allowed, then the minimum rate. The guard's pause limit alone would let a body trickled
        a byte at a time hold its share of the unverified budget for ever."""
        ingest = self.settings.ingest
        return self.settings.http.body_timeout_s + reserved / ingest.min_upload_bytes_per_s

    async def check_not_paused(self) -> None:
        """The `pause-ingest` switch: come back later (nothing is read, nothing is lost)."""
        try:
            policy = await self.policy.get(time.monotonic())
        except LookupError:
            return  # no policy yet: the aggregator has not started; nothing paused it
        except TRANSIENT as exc:
            raise unavailable(exc) from None
        if policy.ingest_paused:
            retry = str(self.settings.ingest.paused_retry_after_s)
            raise Refusal(
                503,
                INGEST_PAUSED,
                f"ingest paused by the operators (policy version {policy.version})",
                {"Retry-After": retry},
            )


def outside_window(
    proof: Proof, key: VerifyKey, body: bytes, entry_id: str, window_ms: int, domain: bytes
) -> Refusal:
    """The 401 for an update the store found signed outside the window of Redis's time of
    receipt, worded by the core's own check (the aggregator's) at that time."""
    try:
        verify(proof, key, body, stream_id_ms(entry_id.encode()), window_ms, domain)
    except AuthError as exc:
        detail = f"{exc.detail} (by Redis's clock, when it added the entry)"
        return Refusal(401, exc.reason.value, detail)
    # the script and the core disagree on the rule: refused all the same, and said loudly
    log.error(
        "the update store refused %s as signed outside the window; the core does not", entry_id
    )
    return Refusal(401, "signature_expired", f"signed outside the window at entry {entry_id}")


async def _read(
    request: web.Request, state: BodyCheck, limit: int, metrics: IngestMetrics
) -> list[bytes]:
    """The body's chunks as they arrived, each fed to `state` (the MAC); 413 once more than
    `limit` bytes came (a chunked upload declares no length), the rest never read.

    A device that goes away mid-body (it timed out, its network dropped) is a refusal like any
    other, counted as `connection_lost` and logged in one line, not a traceback at ERROR: nothing
    was added, and nobody is left to hear the answer.
    """
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := await request.content.readany():
            metrics.read_bytes.inc(len(chunk))
            size += len(chunk)
            if size > limit:
                raise Refusal(413, "too_large", f"body over the limit {limit}; the rest not read")
            state.update(chunk)
            chunks.append(chunk)
    except ConnectionResetError as exc:
        raise Refusal(400, "connection_lost", f"the body was cut off: {exc}") from None
    return chunks


#: the default run's Ingest (what the legacy routes serve)
INGEST = web.AppKey("ingest", Ingest)


#: the wire reason of a run beyond FEDASYNC_INGEST__MAX_RUNS (503: this process serves no more)
TOO_MANY_RUNS = "too_many_runs"


class RunIngests:
    """Each run's Ingest, made at its first request; at most `settings.ingest.max_runs`. When
    full, the runs that no longer exist (retired) give their place up first."""

    def __init__(self, settings: Settings, default: Ingest, known: KnownRuns) -> None:
        self._settings = settings
        self.default = default
        self.guards = default.guards
        self._runs: dict[str, Ingest] = {default.run: default}
        #: whether a run exists, cached (run_routes.KnownRuns): the app's middleware's own
        self.known = known
        self.guards.metrics.runs.set_function(lambda: len(self._runs))

    async def of(self, run: RunContext) -> Ingest:
        """The Ingest of `run`; a Refusal (503 too_many_runs) beyond the runs allowed."""
        ingest = self._runs.get(run.id)
        if ingest is not None:
            return ingest
        limit = self._settings.ingest.max_runs
        if len(self._runs) >= limit:
            await self._forget_retired()
            ingest = self._runs.get(run.id)  # made by a request that came meanwhile
            if ingest is not None:
                return ingest
        if len(self._runs) >= limit:
            self.guards.metrics.runs_refused.inc()
            raise Refusal(
                503,
                TOO_MANY_RUNS,
                f"this ingest service serves {limit} runs already (FEDASYNC_INGEST__MAX_RUNS); "
                f"run {run.id!r} is not served here",
                {"Retry-After": str(self._settings.ingest.paused_retry_after_s)},
            )
        ingest = self._runs[run.id] = Ingest(
            self._settings, run.redis, run, self.guards, default=False
        )
        return ingest

    async def _forget_retired(self) -> None:
        """Drop the Ingests of runs that exist no more (each look cached: run_routes.py)."""
        for held in [r for r in self._runs if r != self.default.run]:
            try:
                gone = not await self.known.exists(held)
            except TRANSIENT:
                return  # Redis away: the request's own refusal follows
            if gone:
                del self._runs[held]


#: every run's Ingest (the default run's is INGEST)
RUN_INGESTS = web.AppKey("run_ingests", RunIngests)


async def _named_run(request: web.Request, known: KnownRuns) -> RunContext:
    """The run a request names, for the `Expect: 100-continue` answer, which aiohttp gives
    before any middleware runs: the same checks and answers as runs_middleware's."""
    try:
        run = check_run_id(request.match_info["run"])
    except RunIdError as exc:
        raise Refusal(400, BAD_RUN_ID, str(exc)) from None
    if not await known.exists(run):
        raise Refusal(404, UNKNOWN_RUN, f"no run {run!r} in this deployment")
    return RunContext(run, Keys(run), known.clients.for_run(run), False)


def create_app(settings: Settings, redis: aioredis.Redis) -> web.Application:
    """The ingest app; `lingering_time=0`: a refused body is not drained, the connection closes;
    `auto_decompress=False`: aiohttp never inflates a body (a compressed one is refused, 415)."""
    clients = RunClients(redis, settings.redis, settings.redis.key_prefix)
    known = KnownRuns(clients, run_exists)
    ingest = Ingest(settings, redis)
    ingests = RunIngests(settings, ingest, known)
    app = web.Application(
        middlewares=[json_errors, runs_middleware(known)],
        client_max_size=ingest.body_limit.ceiling,  # a backstop: bodies are read in chunks
        handler_args={"lingering_time": 0, "auto_decompress": False},
    )
    app[INGEST] = ingest
    app[RUN_INGESTS] = ingests
    app[REGISTRY] = ingest.metrics.registry

    async def serving(request: web.Request) -> Ingest:
        return await ingests.of(request[RUN])

    async def post_update(request: web.Request) -> web.Response:
        run = ingest
        try:
            run = await serving(request)
            accepted = await run.accept(request)
        except Refusal as refusal:
            return run.refuse(request, refusal)
        ingest.metrics.accepted.labels("new" if accepted.new else "retry").inc()
        ingest.metrics.body_bytes.observe(accepted.body_bytes)
        return web.json_response(
            {
                "status": "accepted",
                "update_id": accepted.update_id,
                "entry_id": accepted.entry_id,
                "retry": not accepted.new,
            },
            status=202,
        )

    async def expect(request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: refuse a paused ingest or an oversized body before the
        device sends it (and, on a run's route, a run that is not served)."""
        run = ingest
        try:
            if "run" in request.match_info:
                run = await ingests.of(await _named_run(request, known))
            await run.check_not_paused()
            run.check_encoding(request)
            await run.check_length(request)
        except Refusal as refusal:
            return run.refuse(request, refusal)
        if request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"unknown Expect: {request.headers['Expect']}")
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    async def get_receipt(request: web.Request) -> web.Response:
        run = ingest
        try:
            run = await serving(request)
            record = await run.receipts.read(request)
        except Refusal as refusal:
            return run.refuse(request, refusal)
        if record is None:
            ingest.metrics.receipts.labels(NOT_DECIDED).inc()
            return not_decided(request)
        ingest.metrics.receipts.labels(str(record["outcome"])).inc()
        return web.json_response(record)

    async def readyz(request: web.Request) -> web.Response:
        return await redis_readiness(redis, key=Keys(settings.redis.key_prefix).state)

    async def metrics(request: web.Request) -> web.Response:
        return metrics_response(ingest.metrics.registry)

    async def close_clients(app: web.Application) -> None:
        await clients.aclose()

    app.on_cleanup.append(close_clients)
    app.add_routes(
        [
            web.post(PATH, post_update, expect_handler=expect),
            web.get(RECEIPT_PATH, get_receipt, allow_head=False),
            web.post(RUN_PATH, post_update, expect_handler=expect),
            web.get(RUN_RECEIPT_PATH, get_receipt, allow_head=False),
            web.get("/livez", livez),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics),
        ]
    )
    documented(app, spec())  # /openapi.json, and no query key it does not name
    return app
