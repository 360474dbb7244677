"""What can go wrong for a device, as types: a refusal for good, giving up, being stopped."""

from __future__ import annotations


class ClientError(Exception):
    """Every error the device client raises on purpose derives from this."""


class Refused(ClientError):
    """A service refused the request for good (a 4xx other than 429): sending it again would be
    refused again. `reason` is the service's stable reason (`bad_signature`, `too_large`, ...,
    or `unknown` when the answer was not the service's JSON, e.g. a proxy's page).
    `training_done` is why training ended, when the refusal says so (`409 run_done`)."""

    def __init__(
        self, status: int, reason: str, detail: str, training_done: str | None = None
    ) -> None:
        self.status = status
        self.reason = reason
        self.detail = detail
        self.training_done = training_done
        super().__init__(f"{status} {reason}: {detail}")


class Unavailable(ClientError, ConnectionError):
    """Still failing after every retry the policy allows (connection errors, 429, 5xx). For a
    publish: it may or may not have been added; sending the same prepared update again is safe."""


class Abandoned(ClientError):
    """The client was asked to stop (its `stopping` event) while it waited to try again; for a
    publish, the update was not acknowledged."""


class UnexpectedAnswer(ClientError):
    """An answer the protocol does not have (an unknown status, a body that does not decode)."""
