"""A device worker holds the data share the simulator gives the same device, rare class included.

`fedasync up --partition rare_class_on_slow` must be the simulator's `rare-class-fair` fleet in
miniature: the same slow devices (largest median of the same profile draws) hold the rare class.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedasync.services.runtime.settings import Settings, TaskSettings, WorkerSettings
from fedasync.services.worker.device import build_device
from fedasync.sim.config import build
from fedasync.sim.world import build_world

DEVICES = 20
SEED = 3


@pytest.mark.parametrize("partition", ["iid", "rare_class_on_slow"])
def test_every_worker_holds_the_simulators_share(partition: str) -> None:
    world = build_world(
        build(
            {
                "task": {"name": "digits"},
                "data": {"partition": partition, "rare_class": 8, "slow_share": 0.1},
                "fleet": {"devices": DEVICES, "latency": {"kind": "longtail"}},
                "seed": SEED,
                "algorithms": [{"kind": "memory"}],
            }
        )
    )
    task = TaskSettings(
        name="digits",
        seed=SEED,
        num_devices=DEVICES,
        partition=partition,
        rare_class=8,
        slow_share=0.1,
    )
    holders = []
    for index in range(DEVICES):
        device = build_device(task, WorkerSettings(device_index=index, profile="longtail"))
        expected = world.device_data[index]
        np.testing.assert_array_equal(device.data.X, expected.X)
        np.testing.assert_array_equal(device.data.y, expected.y)
        assert device.latency is not None
        assert device.latency.median_s == world.medians_s[index] * 0.01  # time-scaled
        if 8 in device.data.y:
            holders.append(index)
    if partition == "rare_class_on_slow":
        assert holders == world.slow
        assert len(holders) == 2  # 10% of 20
        assert min(world.medians_s[d] for d in holders) >= max(
            world.medians_s[d] for d in range(DEVICES) if d not in holders
        )


def test_a_rare_class_on_slow_devices_needs_a_latency_profile() -> None:
    with pytest.raises(ValueError, match=r"rare_class_on_slow needs a worker\.profile"):
        Settings(
            task={"partition": "rare_class_on_slow"},  # type: ignore[arg-type]
            worker={"profile": "none"},  # type: ignore[arg-type]
        )
