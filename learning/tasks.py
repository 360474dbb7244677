"""The task registry: `get_task("digits", hidden=32)`, so configs name tasks by string."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedasync.learning.digits import DigitsMLP
from fedasync.learning.linear import LinearRegression
from fedasync.learning.synthetic import SyntheticClassification
from fedasync.learning.task import Task

TASKS: dict[str, Callable[..., Task]] = {
    "linear": LinearRegression,
    "synthetic": SyntheticClassification,
    "digits": DigitsMLP,
}


class UnknownTaskError(ValueError):
    """A task name or a task parameter that does not exist."""


def get_task(name: str, **params: Any) -> Task:
    """Build the task `name` with its parameters; unknown names and parameters are errors."""
    try:
        factory = TASKS[name]
    except KeyError:
        raise UnknownTaskError(f"unknown task {name!r}; known: {sorted(TASKS)}") from None
    try:
        return factory(**params)
    except TypeError as exc:
        raise UnknownTaskError(f"task {name!r}: {exc}") from None
