"""A simulated device: its data, its latency and availability, and its own random streams."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from fedasync.learning.dataset import Dataset
from fedasync.shared.fleet import Availability, RunLatency
from fedasync.shared.seeds import DeviceStream, PCG64Starts, Stream, device_stream


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


class ParkedStream:
    """Many devices' latency streams behind one numpy Generator.

    A Generator costs about 4 KB and 60 µs to make; a device keeps only its PCG64 state (two
    integers) and borrows the shared Generator for its draws, so a million devices fit in
    memory. The draws are exactly those of the device's own `device_stream`: its state is
    created from that stream's seed and only ever advanced by the device's own draws.
    """

    def __init__(self, devices: int) -> None:
        self._bits = np.random.PCG64()
        self.generator = np.random.Generator(self._bits)
        self._devices = devices
        self._starts: tuple[int, PCG64Starts] | None = None

    def initial(self, seed: int, index: int) -> tuple[int, int]:
        """The (state, increment) device `index`'s latency stream starts from: its own
        `device_stream`'s, computed for the whole fleet at once on first use (a fresh PCG64
        holds no buffered 32-bit half, so the two integers are all of it)."""
        if self._starts is None or self._starts[0] != seed:
            key = (Stream.DEVICE,), self._devices, (DeviceStream.LATENCY,)
            self._starts = seed, PCG64Starts(seed, *key)
        return self._starts[1].start(index)

    def borrow(self, state: int, inc: int) -> np.random.Generator:
        """The shared Generator, positioned where the device's own stream is."""
        self._bits.state = {
            "bit_generator": "PCG64",
            "state": {"state": state, "inc": inc},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self.generator

    def position(self) -> int:
        """The state the shared Generator reached; the device keeps it for its next draws.

        Only 64-bit draws (normal, uniform) are made, so no buffered 32-bit half is lost.
        """
        state = self._bits.state
        assert not state["has_uint32"], "a device stream drew a 32-bit value"
        position: int = state["state"]["state"]
        return position


class Device:
    """Draws each run's latency and fate from its own stream, in run order."""

    __slots__ = (
        "_data",
        "_inc",
        "_parked",
        "_seed",
        "_state",
        "availability",
        "client_id",
        "index",
        "latency",
        "runs",
    )

    def __init__(
        self,
        index: int,
        client_id: str,
        data: Callable[[], Dataset],
        latency: RunLatency,
        availability: Availability,
        seed: int,
        parked: ParkedStream,
    ) -> None:
        self.index = index
        self.client_id = client_id
        self._data = data
        self.latency = latency
        self.availability = availability
        self.runs = 0
        self._seed = seed
        self._parked = parked
        self._state, self._inc = parked.initial(seed, index)

    @property
    def data(self) -> Dataset:
        """The device's samples, cut out of the training set when a run needs them."""
        return self._data()

    def plan_run(self, now: float, dropout: float, latency_factor: float = 1.0) -> RunPlan:
        """Three draws per run whatever happens, so run k is the same in every algorithm.

        `latency_factor` (a fleet phase) scales the drawn latency; the draws stay the same.
        """
        rng = self._parked.borrow(self._state, self._inc)
        duration = self.latency.sample(rng) * latency_factor
        fails, when = float(rng.random()), float(rng.random())
        self._state = self._parked.position()
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


class Devices:
    """The fleet's devices, each made the first time the simulation touches it.

    Nothing of a device exists before its first run (its stream state, its client id), so a
    fleet of a million costs only what its active devices need.
    """

    def __init__(self, availability: Sequence[Availability], make: Callable[[int], Device]) -> None:
        self._made: list[Device | None] = [None] * len(availability)
        self._make = make
        #: each device's availability, readable without making the device (a device waiting
        #: for a free training slot is asked whether it is online, nothing else)
        self.availability = availability

    def __len__(self) -> int:
        return len(self._made)

    def __getitem__(self, index: int) -> Device:
        device = self._made[index]
        if device is None:
            device = self._made[index] = self._make(index)
        return device

    def __iter__(self) -> Iterator[Device]:
        return (self[i] for i in range(len(self)))
