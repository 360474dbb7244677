"""The error a command reports in one line (its message says why and what to do instead).

A module of its own, importing nothing: `fedasync`'s entry point catches it without importing
the Redis client that most commands raising it use (services/commands/redis_target.py).
"""

from __future__ import annotations


class CommandError(Exception):
    """A command cannot do what was asked; the message says why and what to do instead."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
