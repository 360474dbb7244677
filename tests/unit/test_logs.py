"""The entry points' logging (services/runtime/logs.py): libraries' routine warnings held back,
their errors shown."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from absl import logging as absl_logging

from fedasync.services.runtime.logs import LIBRARY_NOISE, hold_back_library_noise


@pytest.fixture
def levels_restored() -> Iterator[None]:
    """The library loggers' levels as they were: other tests see them unchanged."""
    before = {name: logging.getLogger(name).level for name in LIBRARY_NOISE}
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("levels_restored")
def test_absl_warnings_are_held_back_and_its_errors_still_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hold_back_library_noise()
    with caplog.at_level(logging.DEBUG):
        absl_logging.warning("_compute_log_a_frac failed to converge: routine")
        absl_logging.error("a real error")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("absl", "ERROR", "a real error")
    ]
