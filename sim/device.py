"""A simulated device: its data, its latency and availability, and its own random streams."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedasync.learning.dataset import Dataset
from fedasync.shared.fleet import Availability, RunLatency
from fedasync.shared.seeds import DeviceStream, device_stream


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One training run as the fleet decides it: when it would finish, or when it is lost."""

    run: int
    start: float
    end: float
    #: the device drops out (fails, or goes offline) at this time, before `end`
    lost_at: float | None

    @property
    def over_at(self) -> float:
        return self.end if self.lost_at is None else self.lost_at


class Device:
    """Draws each run's latency and fate from its own stream, in run order."""

    def __init__(
        self,
        index: int,
        client_id: str,
        data: Dataset,
        latency: RunLatency,
        availability: Availability,
        seed: int,
    ) -> None:
        self.index = index
        self.client_id = client_id
        self.data = data
        self.latency = latency
        self.availability = availability
        self.runs = 0
        self._seed = seed
        self._rng = device_stream(seed, index, DeviceStream.LATENCY)

    def plan_run(self, now: float, dropout: float, latency_factor: float = 1.0) -> RunPlan:
        """Three draws per run whatever happens, so run k is the same in every algorithm.

        `latency_factor` (a fleet phase) scales the drawn latency; the draws stay the same.
        """
        duration = self.latency.sample(self._rng) * latency_factor
        fails, when = float(self._rng.random()), float(self._rng.random())
        end = now + duration
        lost = now + when * duration if fails < dropout else None
        offline = self.availability.window_end(now)
        if offline < end and (lost is None or offline < lost):
            lost = offline
        plan = RunPlan(self.runs, now, end, lost)
        self.runs += 1
        return plan

    def train_rng(self, run: int) -> np.random.Generator:
        """The shuffling stream of one run, independent of every other run."""
        return device_stream(self._seed, self.index, DeviceStream.TRAIN, run)
