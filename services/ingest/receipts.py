"""GET /v1/updates/{update_id}: the decision about one of the asking device's own updates.

Read-only. The device signs `GET /v1/updates/<update id>` under the read domain of the run
(shared/device_auth.read_domain; on a run's route `/v1/runs/<run>/updates/<update id>` the
signed text is the same, the domain names the run), so no receipt signature can pass as an
update signature, nor as a read of another run's receipt. The lookup is
keyed by the *authenticated* client id and the update id (fedasync/client/receipt_index.py): another
device's update id finds nothing and is answered exactly like an id never used, `404
not_decided`, so a device learns nothing about updates that are not its own.
"""

from __future__ import annotations

import time
from typing import Any

import redis.asyncio as aioredis
from aiohttp import web

from fedasync.services.ingest.refusal import (
    RateLimiter,
    Refusal,
    device_key,
    request_proof,
    unavailable,
)
from fedasync.services.runtime.redis_conn import TRANSIENT
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import receipts
from fedasync.services.stores.device_keys import KeyCache
from fedasync.shared.device_auth import AuthError, read_message, verify
from fedasync.shared.ingest_protocol import NOT_DECIDED
from fedasync.shared.keys import Keys
from fedasync.shared.update import MAX_ID_LENGTH


class ReceiptReader:
    """Authenticates a read and looks the receipt up; every failure is a Refusal."""

    def __init__(
        self,
        settings: Settings,
        redis: aioredis.Redis,
        keys: Keys,
        key_cache: KeyCache,
        limiter: RateLimiter,
        domain: bytes,
    ) -> None:
        self._settings = settings
        self._redis = redis
        self._keys = keys
        self._key_cache = key_cache
        #: the process's bucket of receipt reads per (run, device): not the publishing one
        self.limiter = limiter
        #: the run's read domain (shared/device_auth.read_domain)
        self._domain = domain

    async def read(self, request: web.Request) -> dict[str, Any] | None:
        """The ledger record of the decision (with `ledger_id`); None if there is none; a
        Refusal if the request is not signed by a known device, or too fast, or Redis is away."""
        update_id = request.match_info["update_id"]
        proof = request_proof(request)
        key = await device_key(self._key_cache, proof)
        try:
            message = read_message(update_id)
        except UnicodeEncodeError:  # not text: no device could have signed it, nor used it
            raise Refusal(401, "bad_signature", "the update id is not UTF-8") from None
        window_ms = self._settings.auth.window_ms
        try:
            verify(proof, key, message, int(time.time() * 1000), window_ms, self._domain)
        except AuthError as exc:
            raise Refusal(401, exc.reason.value, exc.detail) from None
        self.limiter.check(proof.client_id, time.monotonic(), take=True, run=self._keys.prefix)
        if not (1 <= len(update_id) <= MAX_ID_LENGTH and update_id.isprintable()):
            return None  # no update can have this id: answered like any id without a decision
        try:
            record = await receipts.lookup(self._redis, self._keys, proof.client_id, update_id)
        except TRANSIENT as exc:
            raise unavailable(exc) from None
        if record is not None:
            # a robust rule's `excluded` names other devices' updates: the ledger keeps it, a
            # device's receipt does not (it says nothing about other devices' updates)
            record.pop("excluded", None)
        return record


def not_decided(request: web.Request) -> web.Response:
    """404: nothing recorded for this device's update id; the same for every such id."""
    update_id = request.match_info["update_id"][:MAX_ID_LENGTH]
    detail = (
        f"no decision recorded for update {update_id!r} of this device: not decided yet, "
        "unknown, or older than the receipts kept"
    )
    return web.json_response({"error": detail, "reason": NOT_DECIDED}, status=404)
