"""SyncDeviceClient: the device client for code that is not asyncio (a training script).

It runs one event loop of its own in a background thread, for its whole life, and each method
hands its call to that loop and waits for the answer. One loop rather than `asyncio.run` per
call: the HTTP connections, the model held for `304`s and the Redis connection stay open between
calls, as they would in the async client. Close it (or use `with`) to stop the thread. Calls from
several threads are serialised by the loop; `redis` must be a URL here (a client object belongs to
the loop that made it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from fedasync.client.device import DeviceClient
from fedasync.client.models import Downloads, Model
from fedasync.client.publishing import PreparedUpdate, Published
from fedasync.client.receipts import Receipt
from fedasync.client.retry import RetryPolicy

T = TypeVar("T")


class SyncDeviceClient:
    """Blocking twin of `DeviceClient`: the same methods and arguments, without `await`."""

    def __init__(
        self,
        snapshot_url: str,
        client_id: str,
        *,
        key: str | bytes | None = None,
        ingest_url: str | None = None,
        redis: str | None = None,
        key_prefix: str = "fedasync",
        retry: RetryPolicy | None = None,
        timeout_s: float = 60.0,
        dtype: str = "float32",
        ca_file: str | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"fedasync-client-{client_id}", daemon=True
        )
        self._thread.start()
        self._stopping: asyncio.Event | None = None
        self._closed = False

        async def make() -> DeviceClient:
            self._stopping = asyncio.Event()
            return DeviceClient(
                snapshot_url,
                client_id,
                key=key,
                ingest_url=ingest_url,
                redis=redis,
                key_prefix=key_prefix,
                retry=retry,
                timeout_s=timeout_s,
                dtype=dtype,
                stopping=self._stopping,
                ca_file=ca_file,
            )

        try:
            self._client = self._run(make())
        except BaseException:
            self._stop_loop()
            raise

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            call.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()

    # the same methods as DeviceClient -----------------------------------------------------------
    @property
    def client_id(self) -> str:
        return self._client.client_id

    def latest(self) -> Model | None:
        return self._run(self._client.latest())

    def wait_newer(self, version: int, timeout: float) -> Model | None:
        return self._run(self._client.wait_newer(version, timeout))

    @property
    def model(self) -> Model | None:
        return self._client.model

    @property
    def training_done(self) -> str | None:
        return self._client.training_done

    @property
    def downloads(self) -> Downloads:
        return self._client.downloads

    def prepare(
        self,
        weights: np.ndarray,
        base_version: int,
        num_samples: int,
        metrics: Mapping[str, float] | None = None,
        *,
        update_id: str | None = None,
    ) -> PreparedUpdate:
        return self._client.prepare(
            weights, base_version, num_samples, metrics, update_id=update_id
        )

    def send(self, update: PreparedUpdate) -> Published:
        return self._run(self._client.send(update))

    def publish(
        self,
        weights: np.ndarray,
        base_version: int,
        num_samples: int,
        metrics: Mapping[str, float] | None = None,
        *,
        update_id: str | None = None,
    ) -> Published:
        return self._run(
            self._client.publish(weights, base_version, num_samples, metrics, update_id=update_id)
        )

    def receipt(self, update_id: str, wait: float = 0.0) -> Receipt:
        return self._run(self._client.receipt(update_id, wait))

    # lifecycle ----------------------------------------------------------------------------------
    def close(self) -> None:
        """Give up any wait in progress, close the connections, stop the loop's thread."""
        if self._closed:
            return
        stopping = self._stopping
        if stopping is not None:
            self._loop.call_soon_threadsafe(stopping.set)
        try:
            self._run(self._client.close())
        finally:
            self._closed = True
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> SyncDeviceClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
