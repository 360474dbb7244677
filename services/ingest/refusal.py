"""What a refused request is, and the checks every signed request shares.

A refusal is one `Refusal`: an HTTP status, a stable reason, a human detail and headers; the app
turns it into a JSON body, a log line and a count. The device's proof of origin (headers), its
key, and its rate are checked the same way for an update (POST) and for a receipt (GET).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from aiohttp import web

from fedasync.services.runtime.redis_conn import TRANSIENT
from fedasync.services.stores.device_keys import KeyCache, Known
from fedasync.shared.device_auth import AuthError, AuthReason, Proof, VerifyKey, parse_proof
from fedasync.shared.ingest_protocol import CLIENT_HEADER, SIGNATURE_HEADER, TIME_HEADER
from fedasync.shared.token_bucket import TokenBucket

#: rate-limit buckets kept before full (idle) ones are forgotten
MAX_IDLE_BUCKETS = 10_000


class Refusal(Exception):
    """A request that is answered with an error: HTTP status, stable reason, human detail."""

    def __init__(
        self, status: int, reason: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.reason = reason
        self.detail = detail
        self.headers = headers or {}
        super().__init__(f"{reason}: {detail}")


def unavailable(exc: BaseException) -> Refusal:
    """Redis did not answer: come back in a second (nothing was changed, or a retry settles it)."""
    return Refusal(503, "unavailable", f"Redis: {exc}", {"Retry-After": "1"})


@dataclass(slots=True)
class RateLimiter:
    """A token bucket per authenticated device of a run, in this process's memory: keyed by
    (run, client id), since each run's operators name their devices, and one run's device must
    not spend the rate of another run's device of the same name."""

    rate: float
    burst: int
    what: str = "updates"
    buckets: dict[tuple[str, str], TokenBucket] = field(default_factory=dict)

    def _bucket(self, device: tuple[str, str], now: float) -> TokenBucket:
        bucket = self.buckets.get(device)
        if bucket is None:
            if len(self.buckets) >= MAX_IDLE_BUCKETS:
                self.buckets = {c: b for c, b in self.buckets.items() if not b.is_full(now)}
            bucket = self.buckets[device] = TokenBucket.full(self.rate, self.burst, now)
        return bucket

    def check(self, client_id: str, now: float, *, take: bool, run: str = "") -> None:
        """Refuse with 429 if the device has no token; take one if `take`."""
        bucket = self._bucket((run, client_id), now)
        wait = bucket.take(now) if take else bucket.wait(now)
        if wait > 0:
            raise Refusal(
                429,
                "rate_limited",
                f"more than {self.rate:g} {self.what}/s (burst {self.burst}) from {client_id!r}",
                {"Retry-After": str(max(1, math.ceil(wait)))},
            )


def request_proof(request: web.Request) -> Proof:
    """The signature headers, parsed (not yet verified); 401 if absent or malformed."""

    def raw(name: str) -> bytes | None:
        value = request.headers.get(name)
        return None if value is None else value.encode("utf-8", "surrogateescape")

    try:
        return parse_proof(raw(CLIENT_HEADER), raw(TIME_HEADER), raw(SIGNATURE_HEADER))
    except AuthError as exc:
        # the core names the proof's parts as the stream entry does (c, t, s): say which header
        detail = exc.detail
        if exc.reason is AuthReason.MALFORMED_SIGNATURE:
            detail += f" ({_HEADER_NAMES})"
        raise Refusal(401, exc.reason.value, detail) from None


#: the signature headers by the letters the core's messages use for them
_HEADER_NAMES = f"c: {CLIENT_HEADER}, t: {TIME_HEADER}, s: {SIGNATURE_HEADER}"


async def device_key(cache: KeyCache, proof: Proof) -> VerifyKey:
    """The key of the device the proof names; 401 if unknown or revoked, 503 if Redis is away."""
    return (await device_known(cache, proof)).key


async def device_known(cache: KeyCache, proof: Proof) -> Known:
    """`device_key`, with the fingerprint of the key's stored text (taken in the same step)."""
    try:
        return await cache.get_known(proof.client_id)
    except AuthError as exc:
        raise Refusal(401, exc.reason.value, exc.detail) from None
    except TRANSIENT as exc:
        raise unavailable(exc) from None
