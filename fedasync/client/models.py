"""The newest model from the snapshot service, downloaded only when it changed.

Every request carries the ETag of the model held (`If-None-Match`), so an unchanged version costs a
`304` and no body. `latest()` asks `GET /v1/models/latest?newer_than=-1&wait=0`: the newest model
(`200`/`304`) or, before the first commit, `204` at once, with no error to interpret.
`wait_newer(v, t)` is the snapshot service's long-poll, asked again until `t` seconds have passed
(the service caps each wait). The `X-Fedasync-Training-Done` header of any answer sets
`training_done`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from fedasync.client.errors import UnexpectedAnswer
from fedasync.client.transport import Answer, Request, Transport
from fedasync.shared.layout import Layout
from fedasync.shared.model_format import decode_model
from fedasync.shared.snapshot_protocol import DONE_HEADER, latest_path
from fedasync.shared.wire import WireError


@dataclass(frozen=True, slots=True, eq=False)
class Model:
    """One committed version: its number, its flat float32 weights (read-only: train on a copy),
    the layout that cuts them into named tensors, its ETag and when it was committed."""

    version: int
    weights: np.ndarray
    layout: Layout
    etag: str | None
    created_at: float


@dataclass(slots=True)
class Downloads:
    """How the model was fetched: full downloads and `304 Not Modified` answers."""

    downloads: int = 0
    not_modified: int = 0


class Models:
    """Fetches models for one device and keeps the newest one it got."""

    def __init__(
        self,
        transport: Transport,
        base_url: str,
        timeout_s: float,
        counts: Downloads,
        run: str | None = None,
    ) -> None:
        self._transport = transport
        #: `run`'s newest model (None: the legacy route, the default run's)
        self._url = base_url.rstrip("/") + latest_path(run)
        self._timeout_s = timeout_s
        self.model: Model | None = None
        self.training_done: str | None = None
        self.counts = counts

    async def latest(self) -> Model | None:
        """The newest committed model; None while nothing has been committed."""
        return await self._get(-1, 0.0)

    async def wait_newer(self, version: int, timeout: float) -> Model | None:
        """The newest model once its version is above `version`, waiting up to `timeout`
        seconds; None if none came in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        while True:
            remaining = max(0.0, deadline - loop.time())
            model = await self._get(version, remaining)
            if model is not None or remaining <= 0:
                return model

    async def _get(self, newer_than: int, wait: float) -> Model | None:
        def headers() -> dict[str, str]:
            held = self.model
            return {"If-None-Match": held.etag} if held is not None and held.etag else {}

        request = Request(
            "GET",
            self._url,
            headers,
            params={"newer_than": str(newer_than), "wait": repr(wait)},
            timeout_s=wait + self._timeout_s,
        )
        answer = await self._transport.send("model download", request)
        done = answer.headers.get(DONE_HEADER)
        if done is not None:
            self.training_done = done
        if answer.status == 204:
            return None
        if answer.status == 304 and self.model is not None:
            self.counts.not_modified += 1
            return self.model
        if answer.status != 200:
            raise UnexpectedAnswer(f"snapshot service answered {answer.status}: {answer.error}")
        self.model = _decode(answer)
        self.counts.downloads += 1
        return self.model


def _decode(answer: Answer) -> Model:
    try:
        message = decode_model(answer.body, max_bytes=len(answer.body))
    except WireError as exc:
        raise UnexpectedAnswer(f"the model does not decode: {exc}") from None
    snapshot = message.snapshot
    weights = snapshot.weights
    weights.flags.writeable = False  # held for 304s: a device must train on a copy
    return Model(
        snapshot.version,
        weights,
        snapshot.layout,
        answer.headers.get("ETag"),
        message.created_at,
    )
