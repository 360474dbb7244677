"""What every algorithm of one simulation shares: task, data, partition, fleet, initial model.

Built once from the config and the seed. The fleet's mutable parts (availability schedules,
replay cursors) are created afresh for each algorithm by `new_fleet`, from the same streams,
so every algorithm meets the same devices, the same latencies and the same outages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np

from fedasync.learning import partition
from fedasync.learning.dataset import Dataset
from fedasync.learning.dpsgd import DPSGD, DPSGDError
from fedasync.learning.task import Task, TrainParams
from fedasync.learning.task_failure import guarded
from fedasync.learning.tasks import get_task, task_data
from fedasync.learning.torch_task import check_private
from fedasync.shared import fleet as profiles
from fedasync.shared.fleet import (
    AlwaysOnline,
    Availability,
    Intermittent,
    RunLatency,
    Windows,
    slowest,
)
from fedasync.shared.seeds import DeviceStream, Stream, device_stream, stream
from fedasync.sim import config as cfg
from fedasync.sim.trace import read_durations, read_windows

ALWAYS_ONLINE = AlwaysOnline()


class DeviceData(Sequence[Dataset]):
    """Each device's share of the training set, cut out only when asked for.

    The partition is kept as one array of sample indices and an offset per device, not as a
    data set per device: a million devices then cost a few bytes each until one trains, and a
    device's data (a copy, as `Dataset.subset` makes) exists only while it trains.
    """

    def __init__(self, train: Dataset, parts: Sequence[np.ndarray]) -> None:
        self._train = train
        sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
        self._offsets = np.concatenate(([0], np.cumsum(sizes)))
        self._indices = np.concatenate(parts) if len(parts) else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, index: int) -> Dataset: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Dataset]: ...
    def __getitem__(self, index: int | slice) -> Dataset | Sequence[Dataset]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        start, end = self._offsets[index], self._offsets[index + 1]
        return self._train.subset(self._indices[start:end])

    def size(self, index: int) -> int:
        """How many samples device `index` holds, without cutting its data out."""
        return int(self._offsets[index + 1] - self._offsets[index])

    def sizes(self) -> list[int]:
        sizes: list[int] = np.diff(self._offsets).tolist()
        return sizes


@dataclass(slots=True)
class Fleet:
    """Per device: how long a run takes and when it is online; fresh for each algorithm."""

    latencies: list[RunLatency]
    availability: list[Availability]


@dataclass(frozen=True, slots=True, eq=False)
class World:
    config: cfg.SimConfig
    task: Task
    train: Dataset
    test: Dataset
    device_data: DeviceData
    client_ids: list[str]
    init_weights: np.ndarray
    training: TrainParams
    #: typical (median) latency of each device, seconds
    medians_s: list[float]
    #: the devices the fleet marks slow (largest medians), ascending
    slow: list[int]
    _trace_durations: dict[str, tuple[float, ...]] | None
    _trace_windows: dict[str, list[tuple[float, float]]] | None
    #: DP-SGD on every device ([training.dpsgd]); None: plain local training
    dpsgd: DPSGD | None = None

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def num_devices(self) -> int:
        return len(self.device_data)

    def new_fleet(self) -> Fleet:
        return Fleet(
            make_latencies(self.config, self._trace_durations),
            make_availability(self.config, self._trace_windows, self.client_ids),
        )


def make_latencies(
    config: cfg.SimConfig, durations: dict[str, tuple[float, ...]] | None
) -> list[RunLatency]:
    """Each device's latency law, drawn from the fleet stream (or replayed from a trace)."""
    spec = config.fleet.latency
    if durations is not None:
        return [profiles.ReplayedLatency(d) for d in durations.values()]
    profile: (
        profiles.Mixture
        | profiles.LogNormalFleet
        | profiles.ParetoFleet
        | profiles.ExponentialFleet
        | profiles.FixedFleet
    )
    if isinstance(spec, cfg.LongTailLatency):
        profile = profiles.Mixture(tuple(spec.tiers), spec.jitter)
    elif isinstance(spec, cfg.LogNormalLatency):
        profile = profiles.LogNormalFleet(spec.median_s, spec.sigma, spec.jitter)
    elif isinstance(spec, cfg.ParetoLatency):
        profile = profiles.ParetoFleet(spec.scale_s, spec.shape, spec.jitter)
    elif isinstance(spec, cfg.ExponentialLatency):
        profile = profiles.ExponentialFleet(spec.mean_s, spec.minimum_s, spec.jitter)
    elif isinstance(spec, cfg.FixedLatency):
        profile = profiles.FixedFleet(tuple(spec.medians_s), spec.jitter)
    else:  # pragma: no cover - a trace always comes with durations
        raise AssertionError(spec)
    return list(profile.devices(config.fleet.devices, stream(config.seed, Stream.FLEET)))


def make_availability(
    config: cfg.SimConfig,
    windows: dict[str, list[tuple[float, float]]] | None,
    client_ids: Sequence[str],
) -> list[Availability]:
    """Each device's online schedule, from its own stream (or from a trace)."""
    spec = config.fleet.availability
    if isinstance(spec, cfg.IntermittentAvailability):
        return [
            Intermittent(
                spec.online_mean_s,
                spec.offline_mean_s,
                device_stream(config.seed, d, DeviceStream.AVAILABILITY),
            )
            for d in range(len(client_ids))
        ]
    if windows is not None:
        return [Windows(windows.get(c, [])) for c in client_ids]
    return [ALWAYS_ONLINE] * len(client_ids)  # stateless: one instance serves every device


def build_world(config: cfg.SimConfig) -> World:
    """Load the task's data, split it over the fleet, and draw the initial model."""
    # its train and evaluate fail in one line naming the user's frame (learning/task_failure.py)
    task = guarded(get_task(config.task.name, **config.task.params), config.task.name)
    base = Path(config.base_dir)
    durations = windows = None
    if isinstance(config.fleet.latency, cfg.TraceLatency):
        durations = read_durations(base / config.fleet.latency.path)
        if len(durations) != config.fleet.devices:
            raise cfg.ConfigError(
                f"fleet.devices is {config.fleet.devices} but the trace has {len(durations)}"
            )
    if isinstance(config.fleet.availability, cfg.TraceAvailability):
        windows = read_windows(base / config.fleet.availability.path)
    dpsgd = _dpsgd(config.training.dpsgd, task, config.task.name)
    n = config.fleet.devices
    client_ids = list(durations) if durations else [f"d{i:0{len(str(n - 1))}d}" for i in range(n)]
    medians = [lat.quantile(0.5) for lat in make_latencies(config, durations)]
    slow = slowest(medians, config.data.slow_share)
    train, test = task_data(config.task.name, task, stream(config.seed, Stream.DATA))
    parts = _partition(config.data, train.y, n, slow, stream(config.seed, Stream.PARTITION))
    return World(
        config=config,
        task=task,
        train=train,
        test=test,
        device_data=DeviceData(train, parts),
        client_ids=client_ids,
        init_weights=task.init_weights(stream(config.seed, Stream.MODEL)),
        training=_training(config.training, task.suggested),
        medians_s=medians,
        slow=slow,
        _trace_durations=durations,
        _trace_windows=windows,
        dpsgd=dpsgd,
    )


def _dpsgd(spec: cfg.DPSGDConfig | None, task: Task, name: str) -> DPSGD | None:
    """The fleet's DP-SGD settings, refused before anything runs if the task cannot use them."""
    if spec is None:
        return None
    try:
        check_private(task, name)
        return DPSGD(spec.noise_multiplier, spec.max_grad_norm, spec.delta)
    except DPSGDError as exc:
        raise cfg.ConfigError(f"[training.dpsgd]: {exc}") from None


def _training(spec: cfg.TrainingConfig, suggested: TrainParams) -> TrainParams:
    return TrainParams(
        epochs=spec.epochs if spec.epochs is not None else suggested.epochs,
        lr=spec.lr if spec.lr is not None else suggested.lr,
        batch_size=spec.batch_size if spec.batch_size is not None else suggested.batch_size,
    )


def _partition(
    spec: cfg.DataConfig,
    labels: np.ndarray,
    n: int,
    slow: list[int],
    rng: np.random.Generator,
) -> list[np.ndarray]:
    try:
        return partition.split(
            spec.partition,
            labels,
            n,
            rng,
            beta=spec.beta,
            classes_per_device=spec.classes_per_device,
            slow=slow,
            rare_class=spec.rare_class,
            keep=spec.rare_keep,
        )
    except partition.PartitionError as exc:
        raise cfg.ConfigError(str(exc)) from None
