"""What a device says of its own DP-SGD: the ε it reports in an update's metrics, and the fleet's
worst, as the simulator's summary and `fedasync up`'s both show it.

A device training with DP-SGD (learning/dpsgd.py) adds its sample-level ε, at its δ, to each
update's metrics. The server cannot check the figure (it never sees the device's data or its
noise): it is the device's own statement, recorded beside the decision (the ledger's
`device_epsilon`, not a field the core decides), and summarised as the fleet's worst, since a
privacy guarantee is only as good as the device that spent the most.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: the update metric carrying the device's ε after the run it reports
DEVICE_EPSILON = "dp_epsilon"
#: the update metric carrying the δ that ε is stated at
DEVICE_DELTA = "dp_delta"
#: the ledger record's fields for them (context beside the decision, like `at`)
RECORD_FIELDS = {DEVICE_EPSILON: "device_epsilon", DEVICE_DELTA: "device_delta"}


def reported(metrics: Mapping[str, float]) -> dict[str, float]:
    """The device-privacy figures among an update's metrics, named as the ledger names them;
    empty when the device reports none (no DP-SGD), so records without it keep their bytes."""
    epsilon = metrics.get(DEVICE_EPSILON)
    if epsilon is None or not math.isfinite(epsilon) or epsilon < 0:
        return {}
    out = {RECORD_FIELDS[DEVICE_EPSILON]: float(epsilon)}
    delta = metrics.get(DEVICE_DELTA)
    if delta is not None and math.isfinite(delta) and 0 < delta < 1:
        out[RECORD_FIELDS[DEVICE_DELTA]] = float(delta)
    return out


@dataclass(slots=True)
class WorstDevice:
    """The largest ε any device reported, whose it is and at which δ, and how many reported."""

    epsilon: float | None = None
    client_id: str | None = None
    delta: float | None = None
    clients: int = 0
    _seen: set[str] = field(default_factory=set)

    def add(self, client_id: str, record: Mapping[str, Any]) -> None:
        """Fold one decided update's record (or `reported(metrics)`) into the worst."""
        epsilon = record.get(RECORD_FIELDS[DEVICE_EPSILON])
        if epsilon is None:
            return
        if client_id not in self._seen:
            self._seen.add(client_id)
            self.clients += 1
        if self.epsilon is None or float(epsilon) > self.epsilon:
            self.epsilon, self.client_id = float(epsilon), client_id
            delta = record.get(RECORD_FIELDS[DEVICE_DELTA])
            self.delta = None if delta is None else float(delta)

    def to_dict(self) -> dict[str, Any] | None:
        """The summary's `device_privacy` section; None when no device reported an ε."""
        if self.epsilon is None:
            return None
        return {
            "worst_epsilon": self.epsilon,
            "client": self.client_id,
            "delta": self.delta,
            "devices_reporting": self.clients,
        }


def worst_of(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The fleet's worst device ε over ledger records (`fedasync up`'s summary)."""
    worst = WorstDevice()
    for record in records:
        worst.add(str(record["client_id"]), record)
    return worst.to_dict()
