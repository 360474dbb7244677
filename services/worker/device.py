"""What makes one device this device: its share of the data and how long its runs take.

Drawn from the task seed exactly as the simulator draws them (same SeedSequence streams), so
device k of a real fleet holds the data and has the speed of device k in simulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedasync.learning import partition
from fedasync.learning.dataset import Dataset
from fedasync.learning.dpsgd import DPSGD, DeviceAccountant, DPSGDError
from fedasync.learning.task import Task, TrainParams
from fedasync.learning.task_failure import guarded
from fedasync.learning.tasks import task_data
from fedasync.learning.torch_task import check_private
from fedasync.services.runtime.settings import SettingsError, TaskSettings, WorkerSettings
from fedasync.services.worker import dpsgd_state
from fedasync.shared import fleet
from fedasync.shared.seeds import DeviceStream, Stream, device_stream, stream

PROFILES: dict[
    str, fleet.Mixture | fleet.LogNormalFleet | fleet.ParetoFleet | fleet.ExponentialFleet
] = {
    "longtail": fleet.LONG_TAIL,
    "lognormal": fleet.LogNormalFleet(),
    "pareto": fleet.ParetoFleet(),
    "exponential": fleet.ExponentialFleet(),
}


@dataclass(frozen=True, slots=True)
class Device:
    task: Task
    data: Dataset
    latency: fleet.DeviceLatency | None  # None: as fast as it trains
    train: TrainParams
    #: this device's DP-SGD accountant, kept across its runs; None: plain training
    privacy: DeviceAccountant | None = None


def default_client_id(device_index: int) -> str:
    """A worker's client id when none is configured (keys issued for a fleet use the same)."""
    return f"device-{device_index}"


def build_device(task_settings: TaskSettings, worker: WorkerSettings) -> Device:
    if worker.device_index >= task_settings.num_devices:
        raise ValueError(
            f"device_index {worker.device_index} but the data is split over "
            f"{task_settings.num_devices} devices"
        )
    task = task_settings.build()
    seed = task_settings.seed
    train_data, _ = task_data(task_settings.name, task, stream(seed, Stream.DATA))
    devices = None
    if worker.profile != "none":
        devices = PROFILES[worker.profile].devices(
            task_settings.num_devices, stream(seed, Stream.FLEET)
        )
    # the same slow devices the simulator picks from the same profile draws (sim/world.py)
    slow = (
        []
        if devices is None
        else fleet.slowest([d.median_s for d in devices], task_settings.slow_share)
    )
    shares = partition.split(
        task_settings.partition,
        train_data.y,
        task_settings.num_devices,
        stream(seed, Stream.PARTITION),
        slow=slow,
        rare_class=task_settings.rare_class,
        keep=task_settings.rare_keep,
    )
    latency = None
    if devices is not None:
        latency = devices[worker.device_index].scaled(worker.time_scale)
    suggested = task.suggested
    params = TrainParams(
        epochs=worker.epochs or suggested.epochs,
        lr=worker.lr or suggested.lr,
        batch_size=worker.batch_size or suggested.batch_size,
    )
    task = guarded(task, task_settings.name)  # its train fails in one line, naming the frame
    privacy = None
    if worker.dpsgd_noise_multiplier is not None:
        try:
            check_private(task, task_settings.name)
        except DPSGDError as exc:  # one line at start-up (exit code 2), not a traceback
            raise SettingsError(f"invalid settings: FEDASYNC_WORKER__DPSGD_*: {exc}") from None
        privacy = DeviceAccountant(
            DPSGD(worker.dpsgd_noise_multiplier, worker.dpsgd_max_grad_norm, worker.dpsgd_delta)
        )
        if worker.dpsgd_state is not None:
            try:
                dpsgd_state.load(Path(worker.dpsgd_state), privacy)
            except dpsgd_state.StateFileError as exc:
                raise SettingsError(
                    f"invalid settings: FEDASYNC_WORKER__DPSGD_STATE: {exc}"
                ) from None
    return Device(task, train_data.subset(shares[worker.device_index]), latency, params, privacy)


def run_rng(seed: int, device: int, run: int) -> np.random.Generator:
    """The generator of one training run (shuffling, dropout, jitter) of one device."""
    return device_stream(seed, device, DeviceStream.TRAIN, run)
