"""How patiently the device client retries, as a value; and how it reads a service's answer.

Transient failures are retried with the same request: connection errors, timeouts, `429` and every
`5xx` (the service's own `503`, a proxy's `502`/`504`), waiting the exponential backoff or the
answer's `Retry-After`, whichever is longer. An answer is not trusted to be the service's JSON:
between the device and the service there may be a proxy, so a body that is not a JSON object reads
as `{}` and a Retry-After that is not a number of seconds waits the default.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fedasync.client.errors import Abandoned

#: how long a Retry-After that is not a number of seconds (an HTTP-date, garbage) makes us wait
DEFAULT_RETRY_AFTER_S = 1.0
#: the longest Retry-After honoured: a misconfigured proxy must not park the device for hours
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries after the first try (`attempts`), and the backoff between them: `base_s` doubled
    after each failure, at most `max_s`; a `429`/`5xx` waits at least its Retry-After."""

    attempts: int = 10
    base_s: float = 0.05
    max_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.base_s < 0 or self.max_s < self.base_s:
            raise ValueError(f"invalid retry policy {self}")

    def backoff(self, failures: int) -> float:
        """The wait after the `failures`-th failure in a row (1, 2, ...)."""
        return min(self.base_s * 2.0**failures, self.max_s)


def retry_after_s(value: str | None) -> float:
    """Seconds to wait from a Retry-After header: a finite, non-negative number of seconds,
    capped at MAX_RETRY_AFTER_S; anything else (absent, an HTTP-date, garbage) is
    DEFAULT_RETRY_AFTER_S. fedasync's services send whole seconds; the other forms come from
    proxies."""
    try:
        seconds = float(value) if value is not None else DEFAULT_RETRY_AFTER_S
    except ValueError:
        return DEFAULT_RETRY_AFTER_S
    if not math.isfinite(seconds) or seconds < 0:
        return DEFAULT_RETRY_AFTER_S
    return min(seconds, MAX_RETRY_AFTER_S)


def json_object(body: bytes) -> dict[str, Any]:
    """The JSON object of an answer, or {} when it is not one: an error page from a proxy
    (HTML 502), aiohttp's own text 500, an empty body. Callers read fields with .get()."""
    try:
        answer = json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError alike
        return {}
    return answer if isinstance(answer, dict) else {}


def retryable(status: int) -> bool:
    """Worth sending the same request again: rate limited (429) or a server-side failure (5xx);
    any other refusal is for good."""
    return status == 429 or 500 <= status <= 599


class Pause:
    """Waits between attempts; ends early, raising Abandoned, once `stopping` is set, so a stop is
    never held up by a backoff or a long Retry-After. `sleep` replaces the wait (tests record
    the waits instead of sitting them out)."""

    def __init__(
        self,
        stopping: asyncio.Event | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.stopping = stopping or asyncio.Event()
        self._sleep = sleep

    async def __call__(self, seconds: float) -> None:
        if self._sleep is not None:
            await self._sleep(seconds)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), seconds)
        if self.stopping.is_set():
            raise Abandoned("stopping: given up while waiting to try again")
