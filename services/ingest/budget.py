"""The budget of unverified bytes: bodies being read whose signature is not yet checked.

A body's MAC can only be checked once the whole body is in, so until then its bytes are held
for whoever claims a client id, and a client id is no secret (the demo's are `device-0…`). The
key and rate checks before the body cost a forger nothing (a forged request takes no token), so
without a bound a few connections could make ingest hold gigabytes. Each body reserves its
declared length (or the body limit, for a chunked upload) before a byte of it is read, and gives
it back once its MAC is checked, accepted or not. Beyond the budget, in all or for the client id
it claims, the body is refused unread: `503 unverified_budget` with `Retry-After`. A body is
always let in when nothing else is being read (in all, or for its client id), so a budget set
below the body limit makes uploads take turns; and every body has a deadline (app.py,
`upload_deadline_s`), so none holds its reservation longer than that, trickled or not.

In this process's memory, as the rate limiter is: each ingest process has its own budget.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from fedasync.services.ingest.refusal import Refusal
from fedasync.shared.ingest_protocol import UNVERIFIED_BUDGET

REASON = UNVERIFIED_BUDGET


@dataclass(slots=True)
class UnverifiedBudget:
    """Bytes reserved by bodies being read, in all and by client id."""

    total: int
    #: None: the body limit in force
    per_client: int | None
    retry_after_s: int
    in_flight: int = 0
    by_client: dict[str, int] = field(default_factory=dict)

    @contextmanager
    def hold(self, client_id: str, size: int, limit: int) -> Iterator[None]:
        """Reserve `size` bytes for a body claiming `client_id` while it is read and checked
        (`limit`: the body limit in force); a Refusal if the budget cannot take them."""
        self.admit(client_id, size, limit)
        self.in_flight += size
        self.by_client[client_id] = self.by_client.get(client_id, 0) + size
        try:
            yield
        finally:
            self.in_flight -= size
            left = self.by_client[client_id] - size
            if left:
                self.by_client[client_id] = left
            else:
                del self.by_client[client_id]

    def admit(self, client_id: str, size: int, limit: int) -> None:
        """Refuse (503) a body of `size` bytes the budget cannot take now."""
        per_client = limit if self.per_client is None else self.per_client
        mine = self.by_client.get(client_id, 0)
        if mine and mine + size > per_client:
            self._refuse(f"{mine} bytes of bodies claiming {client_id!r}", per_client, size)
        if self.in_flight and self.in_flight + size > self.total:
            self._refuse(f"{self.in_flight} bytes of bodies", self.total, size)

    def _refuse(self, held: str, budget: int, size: int) -> None:
        raise Refusal(
            503,
            REASON,
            f"{held} are being read unverified (budget {budget}); this one's {size} bytes "
            "would exceed it: retry later",
            {"Retry-After": str(self.retry_after_s)},
        )
