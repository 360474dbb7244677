"""Test-wide setup: deterministic hypothesis runs with enough examples to mean something."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# derandomize: every run explores the same examples, so CI is reproducible; at least 500 each.
settings.register_profile(
    "ci",
    max_examples=500,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("thorough", max_examples=3000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
