"""One seed, many independent streams: numpy SeedSequence children named by a fixed key.

`SeedSequence(seed, spawn_key=key)` is exactly the child that `spawn` would produce, but needs no
state, so the k-th run of device d gets the same generator in every algorithm and in any order
of events. That is what makes FedAsync, FedBuff and FedAvg run on *the same* fleet.
"""

from __future__ import annotations

import hashlib
from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    DATA = 0
    PARTITION = 1
    FLEET = 2
    MODEL = 3
    SERVER = 4
    DEVICE = 5
    #: the server's held-out set (Zeno++'s validation gradient)
    VALIDATION = 6
    #: which devices are malicious (sim/attacks.py)
    ATTACK = 7


class DeviceStream(IntEnum):
    LATENCY = 0
    AVAILABILITY = 1
    TRAIN = 2
    #: a malicious device's own draws: its noise, its poisoned samples
    ATTACK = 3


def stream(seed: int, *key: int) -> np.random.Generator:
    """The generator for one purpose; the same (seed, key) always gives the same draws."""
    return np.random.Generator(bits(seed, *key))


def bits(seed: int, *key: int) -> np.random.PCG64:
    """The bit generator under `stream(seed, *key)`, without a Generator around it (cheaper,
    for code that keeps only its state)."""
    return np.random.PCG64(np.random.SeedSequence(seed, spawn_key=key))


def device_stream(seed: int, device: int, kind: DeviceStream, *more: int) -> np.random.Generator:
    """A device's own generator for latencies, availability, or one run's training."""
    return stream(seed, Stream.DEVICE, device, kind, *more)


def simulated_dp_secret(seed: int) -> bytes:
    """The DP noise secret of a simulation with `seed` (shared/privacy/noise.py): derived from
    the seed, so a simulation with DP reproduces from its config, where the aggregator keeps a
    random per-run secret."""
    return hashlib.sha256(f"fedasync-sim-dp/{seed}".encode()).digest()
