"""What every algorithm of one simulation shares: task, data, partition, fleet, initial model.

Built once from the config and the seed. The fleet's mutable parts (availability schedules,
replay cursors) are created afresh for each algorithm by `new_fleet`, from the same streams,
so every algorithm meets the same devices, the same latencies and the same outages.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np

from fedasync.learning import partition
from fedasync.learning.backdoor import Trigger, attack_success
from fedasync.learning.dataset import Dataset
from fedasync.learning.dpsgd import DPSGD, DeviceAccountant, DPSGDError, private
from fedasync.learning.held_out import held_out
from fedasync.learning.task import Task, TrainParams
from fedasync.learning.task_failure import GuardedTask, guarded
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
from fedasync.sim.attacks import attacked, malicious_devices
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
        #: each device's sample count as machine ints (8 bytes each): read at every decision,
        #: where a difference of two numpy scalars costs a microsecond or two
        self._sizes = array("q", sizes.tobytes())
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
        return self._sizes[index]

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
    #: the malicious devices (`[attack]`, sim/attacks.py); empty without an attack
    attackers: frozenset[int] = frozenset()
    #: the backdoor's trigger, and the stamped test inputs its success is measured on
    trigger: Trigger | None = None
    triggered_test: Dataset | None = None
    #: the server's held-out set, for Zeno++'s validation gradient (`[validation]`)
    validation: Dataset | None = None
    #: DP-SGD on every device ([training.dpsgd]); None: plain local training
    dpsgd: DPSGD | None = None

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def num_devices(self) -> int:
        return len(self.device_data)

    def local_training(
        self,
        index: int,
        data: Dataset,
        base: np.ndarray,
        rng: np.random.Generator,
        run: int,
        accountant: DeviceAccountant | None = None,
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Device `index`'s run `run` from `base` on its `data`, shuffled by `rng`: honest
        training (with DP-SGD through the device's `accountant` when it has one), or, for a
        malicious device, its attack (sim/attacks.py). `base` is not modified."""
        attack = self.config.attack
        malicious = attack is not None and index in self.attackers
        if malicious and self.trigger is not None:
            assert attack is not None
            own = device_stream(self.seed, index, DeviceStream.ATTACK)  # the same poison each run
            data = self.trigger.poison(data, attack.poison_share, own)
        params = self.training
        weights, metrics = self.task.train(
            base.copy(),  # a private copy: a device never holds server memory
            data,
            rng,
            epochs=params.epochs,
            lr=params.lr,
            batch_size=params.batch_size,
            **private(accountant),
        )
        if malicious:
            assert attack is not None
            rng_attack = device_stream(self.seed, index, DeviceStream.ATTACK, run)
            weights = attacked(attack, base, weights, rng_attack)
        return weights, metrics

    def attack_success(self, weights: np.ndarray) -> float | None:
        """The backdoor's success on `weights` (learning/backdoor.py); None without one."""
        if self.triggered_test is None:
            return None
        return attack_success(self.task, weights, self.triggered_test)

    def validation_gradient(self, weights: np.ndarray) -> np.ndarray:
        """Zeno++'s v: the mean loss gradient on the server's held-out set at `weights`."""
        assert self.validation is not None
        return self.task.gradient(weights, self.validation)

    def new_fleet(self) -> Fleet:
        return Fleet(
            self.new_latencies(),
            make_availability(self.config, self._trace_windows, self.client_ids),
        )

    def new_latencies(self) -> list[RunLatency]:
        """Each device's latency law, fresh, without the availability schedules `new_fleet`
        also makes: what the τ advisor reads. With intermittent devices a schedule is a
        generator per device (60 µs and about 1 KB each), which the advisor never looks at."""
        return make_latencies(self.config, self._trace_durations)


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
    zeno = [cfg.label(a) for a in config.algorithms if getattr(a, "zeno_margin", None) is not None]
    inner: Task = task.task if isinstance(task, GuardedTask) else task
    if zeno and type(inner).gradient is Task.gradient:
        raise cfg.ConfigError(
            f"algorithms {', '.join(zeno)} set zeno_margin, but task {config.task.name!r} does "
            "not compute loss gradients (Task.gradient), which Zeno++ needs"
        )
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
    validation = held_out(train, config.validation.samples, config.seed)
    attack = config.attack
    attackers: frozenset[int] = frozenset()
    trigger = triggered = None
    if attack is not None:
        attackers = malicious_devices(n, attack.share, stream(config.seed, Stream.ATTACK))
        if attack.kind == "backdoor":
            trigger = Trigger(attack.target, attack.trigger_size, attack.trigger_value)
            triggered = trigger.test_set(test)
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
        attackers=attackers,
        trigger=trigger,
        triggered_test=triggered,
        validation=validation,
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
