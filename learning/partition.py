"""How a data set is split among devices: IID, Dirichlet label skew, class shards, rare class.

Each partitioner is a pure function of the labels, the number of devices and an injected
generator, and returns one array of sample indices per device (sorted; no index twice). Data
heterogeneity is what makes staleness hurt, so the simulator needs every one of these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


class PartitionError(ValueError):
    """A partition that cannot be made (too many devices for the data, bad parameters)."""


def iid(labels: np.ndarray, num_devices: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and cut into near-equal parts: every device sees every class in proportion."""
    _check(labels, num_devices)
    return _finish(np.array_split(rng.permutation(len(labels)), num_devices))


def dirichlet(
    labels: np.ndarray, num_devices: int, rng: np.random.Generator, *, beta: float
) -> list[np.ndarray]:
    """Label skew: each class is spread over devices in proportions drawn from Dir(β).

    Small β (0.1) gives each device a few dominant classes, large β (100) approaches IID. A device
    left empty takes one sample from the largest device, so every device can train.
    """
    _check(labels, num_devices)
    if not beta > 0:
        raise PartitionError(f"beta must be > 0, got {beta}")
    parts: list[list[np.ndarray]] = [[] for _ in range(num_devices)]
    for cls in np.unique(labels).tolist():
        members = rng.permutation(np.flatnonzero(labels == cls))
        shares = rng.dirichlet(np.full(num_devices, beta))
        cuts = (np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
        for device, chunk in enumerate(np.split(members, cuts)):
            parts[device].append(chunk)
    devices = [np.concatenate(p) for p in parts]
    for device in range(num_devices):
        if len(devices[device]) == 0:
            donor = max(range(num_devices), key=lambda d: (len(devices[d]), -d))
            devices[device] = devices[donor][-1:]
            devices[donor] = devices[donor][:-1]
    return _finish(devices)


def shards(
    labels: np.ndarray,
    num_devices: int,
    rng: np.random.Generator,
    *,
    classes_per_device: int = 2,
) -> list[np.ndarray]:
    """Class-extreme: each device holds exactly `classes_per_device` classes (1 or 2 typically).

    Classes are dealt from shuffled decks so that each is held by about as many devices as any
    other; a class's samples are then shared evenly among its holders.
    """
    _check(labels, num_devices)
    classes = np.unique(labels)
    if not 1 <= classes_per_device <= len(classes):
        raise PartitionError(f"classes_per_device must be in [1, {len(classes)}]")
    held: list[list[int]] = [[] for _ in range(num_devices)]
    decks = math.ceil(num_devices / len(classes))
    for _ in range(classes_per_device):
        deck = np.concatenate([rng.permutation(len(classes)) for _ in range(decks)])
        for device in range(num_devices):
            k = int(deck[device])
            while k in held[device]:
                k = (k + 1) % len(classes)
            held[device].append(k)
    devices: list[list[np.ndarray]] = [[] for _ in range(num_devices)]
    for k, cls in enumerate(classes.tolist()):
        holders = [d for d in range(num_devices) if k in held[d]]
        if not holders:
            continue  # more classes than slots: this class is held by no device
        members = rng.permutation(np.flatnonzero(labels == cls))
        for device, chunk in zip(holders, np.array_split(members, len(holders)), strict=True):
            devices[device].append(chunk)
    return _finish([np.concatenate(d) if d else np.empty(0, np.int64) for d in devices])


def rare_class_on_slow(
    labels: np.ndarray,
    num_devices: int,
    rng: np.random.Generator,
    *,
    slow: Sequence[int],
    rare_class: int,
    keep: float = 1.0,
) -> list[np.ndarray]:
    """The write-up's trap: one class lives only on the `slow` devices.

    `keep` is the share of that class's samples kept at all (making it rare); they are shared
    among the slow devices. Every other class is split IID over all devices.
    """
    _check(labels, num_devices)
    slow_devices = sorted(set(slow))
    if not slow_devices or not all(0 <= d < num_devices for d in slow_devices):
        raise PartitionError(f"slow must name devices in [0, {num_devices}), got {list(slow)}")
    if not 0.0 < keep <= 1.0:
        raise PartitionError(f"keep must be in (0, 1], got {keep}")
    rare = rng.permutation(np.flatnonzero(labels == rare_class))
    if len(rare) == 0:
        raise PartitionError(f"no sample has the rare class {rare_class}")
    rare = rare[: max(1, round(len(rare) * keep))]
    common = rng.permutation(np.flatnonzero(labels != rare_class))
    devices = list(np.array_split(common, num_devices))
    for device, chunk in zip(slow_devices, np.array_split(rare, len(slow_devices)), strict=True):
        devices[device] = np.concatenate([devices[device], chunk])
    return _finish(devices)


#: Partition names, as configs and settings spell them.
PARTITIONS = ("iid", "dirichlet", "shards", "rare_class_on_slow")


def split(
    name: str,
    labels: np.ndarray,
    num_devices: int,
    rng: np.random.Generator,
    *,
    beta: float = 0.5,
    classes_per_device: int = 2,
    slow: Sequence[int] = (),
    rare_class: int = 0,
    keep: float = 1.0,
) -> list[np.ndarray]:
    """The partition called `name`: the one dispatch the simulator and the device worker share."""
    if name not in PARTITIONS:
        raise PartitionError(f"unknown partition {name!r}; known: {list(PARTITIONS)}")
    if name != "iid" and labels.dtype.kind == "f":
        raise PartitionError(f"partition {name!r} needs class labels (not regression targets)")
    if name == "dirichlet":
        return dirichlet(labels, num_devices, rng, beta=beta)
    if name == "shards":
        return shards(labels, num_devices, rng, classes_per_device=classes_per_device)
    if name == "rare_class_on_slow":
        return rare_class_on_slow(
            labels, num_devices, rng, slow=slow, rare_class=rare_class, keep=keep
        )
    return iid(labels, num_devices, rng)


def _check(labels: np.ndarray, num_devices: int) -> None:
    if labels.ndim != 1:
        raise PartitionError(f"labels must be one-dimensional, got shape {labels.shape}")
    if not 1 <= num_devices <= len(labels):
        raise PartitionError(f"need 1 <= devices <= {len(labels)} samples, got {num_devices}")


def _finish(devices: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = [np.sort(np.asarray(d, dtype=np.int64)) for d in devices]
    empty = [i for i, d in enumerate(out) if len(d) == 0]
    if empty:
        raise PartitionError(f"devices {empty[:10]} would get no data; use fewer devices")
    return out
