"""Tiny simulation configs: a few devices, a small budget, so each run takes well under a second."""

from __future__ import annotations

from typing import Any

from fedasync.sim.config import SimConfig, build, merge


def run_cli(argv: list[str]) -> int:
    """`fedasync ARGV` (`simulate`, `advise`, ...) through the fedasync command's own parser; the
    handler's exit code."""
    from fedasync.services.commands.cli import build_parser

    args = build_parser(argv).parse_args(argv)
    return int(args.handler(args))


LINEAR: dict[str, Any] = {
    "name": "tiny",
    "task": {"name": "linear", "params": {"samples": 800}},
    "fleet": {"devices": 6, "latency": {"kind": "longtail", "jitter": 0.2}},
    "training": {"epochs": 1, "batch_size": 32},
    "budget": {"max_updates": 60, "max_seconds": 3600},
    "eval": {"interval_s": 30, "target": 0.9},
    "algorithms": [{"kind": "fedasync", "tau_max": 3}],
}


def config(base: dict[str, Any] | None = None, **overrides: Any) -> SimConfig:
    """`base` (LINEAR by default) with top-level sections overridden table by table."""
    return build(merge(base if base is not None else LINEAR, overrides))


def fixed_fleet(medians: list[float], **fleet: Any) -> dict[str, Any]:
    return {
        "devices": len(medians),
        "latency": {"kind": "fixed", "medians_s": medians, "jitter": 0.0},
        **fleet,
    }


#: presets too big to run whole in a test, with the fleet and data they are shrunk to there
#: (their shape kept: the same fleet kind and share of devices training at once)
SMALLER: dict[str, dict[str, Any]] = {
    "million-devices": {
        "fleet": {"devices": 2000, "max_concurrency": 200},
        "task": {"params": {"samples": 2500}},
    }
}


def preset_for_tests(name: str) -> dict[str, Any]:
    """A preset's data, shrunk if it is in SMALLER."""
    from fedasync.sim.presets import preset_data

    return merge(preset_data(name), SMALLER.get(name, {}))
