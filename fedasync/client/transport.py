"""One HTTP exchange with a fedasync service, retried by the policy until it is not transient.

Every call of the device client (download, long-poll, publish, receipt) goes through `send`, so
they all retry the same way: connection errors, timeouts, `429` and `5xx`, after the longer of the
backoff and the answer's Retry-After, with the request rebuilt each time (a signature is made
afresh, over the same bytes). The ingest service's `503 ingest_paused` is the operators' decision
to have devices come back later: it is waited out as long as it lasts and uses up no attempt, as
are Redis full (`503 redis_out_of_memory`) and ingest's budget of unverified bytes spent by other
uploads (`503 unverified_budget`: a flood of forged bodies must not make a genuine device give up).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from redis.exceptions import RedisError

from fedasync.client.errors import Unavailable
from fedasync.client.redis_link import TRANSIENT, is_out_of_memory
from fedasync.client.retry import Pause, RetryPolicy, json_object, retry_after_s, retryable
from fedasync.shared.ingest_protocol import INGEST_PAUSED, REDIS_OUT_OF_MEMORY, UNVERIFIED_BUDGET

log = logging.getLogger(__name__)
T = TypeVar("T")

#: the ingest service's 503 reasons (shared/ingest_protocol.py) waited out without using up an
#: attempt: none says this device or its update is at fault, and each ends without the device
#: doing anything
WAITED_OUT = frozenset({INGEST_PAUSED, REDIS_OUT_OF_MEMORY, UNVERIFIED_BUDGET})


@dataclass(frozen=True, slots=True)
class Answer:
    """A service's answer, read whole: status, headers, body and the body as a JSON object."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def json(self) -> dict[str, Any]:
        return json_object(self.body)

    @property
    def reason(self) -> str:
        """The service's stable reason of a refusal; `unknown` if the body is not its JSON."""
        return str(self.json.get("reason", "unknown"))

    @property
    def error(self) -> str:
        return str(self.json.get("error", ""))


@dataclass(frozen=True, slots=True)
class Request:
    """What to send; `headers` is called before each attempt (signatures carry the time)."""

    method: str
    url: str
    headers: Callable[[], dict[str, str]] = dict
    body: bytes | None = None
    params: Mapping[str, str] | None = None
    timeout_s: float | None = None


class Transport:
    """Sends requests on one aiohttp session with one retry policy."""

    def __init__(self, session: aiohttp.ClientSession, policy: RetryPolicy, pause: Pause) -> None:
        self.session = session
        self.policy = policy
        self.pause = pause

    async def send(
        self,
        what: str,
        request: Request,
        again: Callable[[Answer], bool] = lambda answer: retryable(answer.status),
    ) -> Answer:
        """The first answer that `again` does not ask to repeat; Unavailable after the policy's
        attempts; Abandoned if stopped while waiting."""
        failures = 0
        timeout = None if request.timeout_s is None else aiohttp.ClientTimeout(request.timeout_s)
        while True:
            wait = self.policy.backoff(failures + 1)
            try:
                async with self.session.request(
                    request.method,
                    request.url,
                    data=request.body,
                    headers=request.headers(),
                    params=request.params,
                    timeout=timeout,
                ) as response:
                    answer = Answer(response.status, response.headers, await response.read())
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = str(exc) or type(exc).__name__
            else:
                if not again(answer):
                    return answer
                if answer.status >= 300:
                    wait = max(wait, retry_after_s(answer.headers.get("Retry-After")))
                problem = f"{answer.status} {answer.reason}"
                if answer.status == 503 and answer.reason in WAITED_OUT:
                    log.info("%s; trying again in %.0f s", answer.reason, wait)
                    await self.pause(wait)
                    continue
            failures += 1
            if failures > self.policy.attempts:
                raise Unavailable(
                    f"{what}: unavailable after {self.policy.attempts} retries: {problem}"
                )
            log.warning("%s failed (%s); trying again (attempt %d)", what, problem, failures)
            await self.pause(wait)


class RedisRetry:
    """Runs a Redis action again on connection errors, by the same policy (trusted network).

    A Redis full to `maxmemory` refuses the write and keeps nothing: it is waited out as long as
    it lasts and uses up no attempt, as the ingest service's `503 redis_out_of_memory` is, so a
    device writing straight to Redis rides out what one publishing through ingest does.
    """

    def __init__(self, policy: RetryPolicy, pause: Pause) -> None:
        self.policy = policy
        self.pause = pause

    async def __call__(self, what: str, action: Callable[[], Awaitable[T]]) -> T:
        failures = full = 0
        while True:
            try:
                return await action()
            except TRANSIENT as exc:
                failures += 1
                if failures > self.policy.attempts:
                    raise Unavailable(
                        f"{what}: Redis unavailable after {self.policy.attempts} retries: {exc}"
                    ) from exc
                log.warning("%s failed (%s); trying again (attempt %d)", what, exc, failures)
                await self.pause(self.policy.backoff(failures))
            except RedisError as exc:
                if not is_out_of_memory(exc):
                    raise
                full += 1
                wait = self.policy.backoff(full)
                log.info("%s: Redis is full (%s); trying again in %.0f s", what, exc, wait)
                await self.pause(wait)


def now_ms() -> int:
    """A signing time: this device's clock, Unix milliseconds."""
    return int(time.time() * 1000)
