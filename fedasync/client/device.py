"""DeviceClient: everything code on a device needs from fedasync, in one asyncio object.

    async with DeviceClient(snapshot_url, "device-7", key=KEY, ingest_url=ingest_url) as device:
        model = await device.latest()                       # conditional GET: 304 costs nothing
        weights = train(model.weights.copy())               # train on a copy, never the model
        sent = await device.publish(weights, model.version, num_samples=len(data))
        receipt = await device.receipt(sent.update_id, wait=30)
        print(receipt.outcome, receipt.decision)            # applied, τ, α, version ...

Publishing goes through the ingest service when `ingest_url` is given (signed with the device
key: the device needs no Redis credentials), else straight to Redis's updates stream (`redis`: a
trusted network; signed too if a key is given). Receipts are read the same way: from ingest with
the key, else from Redis. Every call retries transient failures by `retry` (docs/device-client.md).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType

import aiohttp
import numpy as np
import redis.asyncio as aioredis

from fedasync.client import publishing, receipts
from fedasync.client.errors import ClientError, Refused
from fedasync.client.models import Downloads, Model, Models
from fedasync.client.publishing import PreparedUpdate, Published
from fedasync.client.receipts import Receipt
from fedasync.client.redis_link import connect_url
from fedasync.client.retry import Pause, RetryPolicy
from fedasync.client.transport import RedisRetry, Transport
from fedasync.shared.device_auth import SigningKey, check_client_id, parse_signing_key
from fedasync.shared.durability import Durability
from fedasync.shared.keys import Keys
from fedasync.shared.runs import check_run_id

#: how often `receipt(wait=...)` asks again, at most (it starts at 50 ms and doubles)
RECEIPT_POLL_MAX_S = 1.0


def _key_bytes(key: str | bytes | None) -> SigningKey | None:
    if key is None or isinstance(key, bytes):
        if key is not None and len(key) != 32:
            raise ValueError(f"a device key is 32 bytes, got {len(key)}")
        return key
    return parse_signing_key(key)


class DeviceClient:
    """One device's connection to a fedasync system (asyncio; `SyncDeviceClient` wraps it).

    `key`: the device key as `fedasync devices add` prints it: `ed25519:<base64>` (an Ed25519
    private key; the default) or 64 hex characters (an HMAC key, or its 32 bytes).
    `redis`: a client (the caller closes it) or a URL (closed with this client).
    `stopping`: once set, a wait between retries ends with `Abandoned` instead of sleeping on.
    `sleep` replaces those waits (tests). `session`: an aiohttp session to use (the caller
    closes it); by default the client opens its own, with `timeout_s` per request.
    `durability`: publishing straight to Redis in durable mode (`RedisSettings.durability`), an
    update counts as published only once WAIT says that many replicas hold it.
    `ca_file`: a PEM file of the certificate authorities that HTTPS URLs' certificates must chain
    to, for an edge with a private or self-signed certificate (docs/security.md, "A TLS edge for
    devices"); unset, the system's authorities. Either way the certificate and the host name are
    checked: there is no switch to turn checking off. Ignored with `session` (it has its own).
    `run`: the run this device trains for; None (the default) is the deployment's default run
    through the legacy routes (`/v1/models/latest`, `/v1/updates`), a run id its own routes
    (`/v1/runs/<run>/...`), its own signature domain (docs/wire-format.md) and, straight to
    Redis, its keys (`key_prefix` is then ignored). A key is issued per run
    (`fedasync devices add <client> --run <run>`): another run's key is `unknown_device`.
    """

    def __init__(
        self,
        snapshot_url: str,
        client_id: str,
        *,
        key: str | bytes | None = None,
        ingest_url: str | None = None,
        redis: aioredis.Redis | str | None = None,
        key_prefix: str = "fedasync",
        retry: RetryPolicy | None = None,
        timeout_s: float = 60.0,
        dtype: str = "float32",
        session: aiohttp.ClientSession | None = None,
        stopping: asyncio.Event | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        durability: Durability | None = None,
        ca_file: str | None = None,
        run: str | None = None,
    ) -> None:
        check_client_id(client_id)
        self.run = None if run is None else check_run_id(run)
        # read now, so that a missing or unreadable file is an error here, not at first use
        self._ssl = None if ca_file is None else ssl.create_default_context(cafile=ca_file)
        self.client_id = client_id
        self._key = _key_bytes(key)
        if ingest_url is not None and self._key is None:
            raise ValueError("publishing through ingest_url needs the device key (key=...)")
        self._snapshot_url = snapshot_url
        self._ingest_url = ingest_url
        self._owns_redis = isinstance(redis, str)
        self._redis = connect_url(redis) if isinstance(redis, str) else redis
        self._keys = Keys(key_prefix if run is None else run)
        self._durability = durability or Durability()
        self._policy = retry or RetryPolicy()
        self._timeout_s = timeout_s
        self._dtype = dtype
        self._session = session
        self._owns_session = session is None
        self._pause = Pause(stopping, sleep)
        self._redis_retry = RedisRetry(self._policy, self._pause)
        self._transport: Transport | None = None
        self._models: Models | None = None
        #: why training ended, when ingest said so first (`409 run_done`)
        self._done_by_ingest: str | None = None
        self._downloads = Downloads()

    # ------------------------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> DeviceClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close what this client opened (its HTTP session, its Redis connection)."""
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None
            self._transport = None
        if self._owns_redis and self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    def _http(self) -> Transport:
        if self._transport is None:
            if self._session is None:
                timeout = aiohttp.ClientTimeout(total=self._timeout_s)
                connector = None if self._ssl is None else aiohttp.TCPConnector(ssl=self._ssl)
                self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
            self._transport = Transport(self._session, self._policy, self._pause)
        return self._transport

    def _snapshots(self) -> Models:
        if self._models is None:
            self._models = Models(
                self._http(), self._snapshot_url, self._timeout_s, self._downloads, self.run
            )
        return self._models

    # -------------------------------------------------------------------------------- models
    async def latest(self) -> Model | None:
        """The newest committed model (a conditional GET: unchanged costs a `304`, and the model
        held is returned); None while nothing has been committed yet."""
        return await self._snapshots().latest()

    async def wait_newer(self, version: int, timeout: float) -> Model | None:
        """The newest model once one above `version` is committed, waiting up to `timeout`
        seconds (the snapshot service's long-poll); None if none came in time. `-1` waits for
        the first model."""
        return await self._snapshots().wait_newer(version, timeout)

    @property
    def model(self) -> Model | None:
        """The newest model this client has received (None before the first)."""
        return None if self._models is None else self._models.model

    @property
    def training_done(self) -> str | None:
        """Why training ended (`max_updates`, `max_seconds`), once the snapshot service said so
        (or ingest refused an update with `409 run_done`, which says it too)."""
        if self._done_by_ingest is not None:
            return self._done_by_ingest
        return None if self._models is None else self._models.training_done

    @property
    def downloads(self) -> Downloads:
        """Full downloads and `304`s so far."""
        return self._downloads

    # ------------------------------------------------------------------------------- publish
    def prepare(
        self,
        weights: np.ndarray,
        base_version: int,
        num_samples: int,
        metrics: Mapping[str, float] | None = None,
        *,
        update_id: str | None = None,
    ) -> PreparedUpdate:
        """An update of this device, encoded once (a random id unless given); `send` it, as
        often as needed: every send is the same update."""
        return publishing.prepare(
            self.client_id,
            weights,
            base_version,
            num_samples,
            metrics,
            update_id=update_id,
            dtype=self._dtype,
        )

    async def send(self, update: PreparedUpdate) -> Published:
        """Publish a prepared update: through ingest if configured, else to Redis. Raises
        `Refused` (ingest refused it for good, with its reason), `Unavailable` (still failing
        after every retry: sending it again later is safe) or `Abandoned` (stopping)."""
        if self._ingest_url is not None and self._key is not None:
            try:
                return await publishing.over_http(
                    self._http(), self._ingest_url, self._key, self.client_id, update, self.run
                )
            except Refused as exc:
                if exc.training_done:  # 409 run_done: as the snapshot service's header says
                    self._done_by_ingest = exc.training_done
                raise
        if self._redis is None:
            raise ClientError("publishing needs ingest_url and key, or redis")
        return await publishing.to_redis(
            self._redis,
            self._keys,
            self._key,
            self.client_id,
            update,
            self._redis_retry,
            self._durability,
            self.run,
        )

    async def publish(
        self,
        weights: np.ndarray,
        base_version: int,
        num_samples: int,
        metrics: Mapping[str, float] | None = None,
        *,
        update_id: str | None = None,
    ) -> Published:
        """`prepare` then `send`: one update, one id, however many attempts it takes."""
        update = self.prepare(weights, base_version, num_samples, metrics, update_id=update_id)
        return await self.send(update)

    # ------------------------------------------------------------------------------ receipts
    async def receipt(self, update_id: str, wait: float = 0.0) -> Receipt:
        """The decision about this device's update `update_id`: applied (τ, α, version), dropped
        or rejected (reason), duplicate; or not decided (`receipt.decided` is False). With
        `wait`, asks again (50 ms, doubling to 1 s apart) until decided or `wait` seconds passed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        interval = 0.05
        while True:
            found = await self._receipt_once(update_id)
            remaining = deadline - loop.time()
            if found.decided or remaining <= 0:
                return found
            await self._pause(min(interval, remaining))
            interval = min(2 * interval, RECEIPT_POLL_MAX_S)

    async def _receipt_once(self, update_id: str) -> Receipt:
        if self._ingest_url is not None and self._key is not None:
            return await receipts.over_http(
                self._http(), self._ingest_url, self._key, self.client_id, update_id, self.run
            )
        if self._redis is None:
            raise ClientError("receipts need ingest_url and key, or redis")
        return await receipts.from_redis(
            self._redis, self._keys, self.client_id, update_id, self._redis_retry
        )
