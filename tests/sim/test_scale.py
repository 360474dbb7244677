"""What lets a fleet of a million fit (issue 16): lazy devices, parked streams, lazy data."""

from __future__ import annotations

import numpy as np

from fedasync.shared.fleet import AlwaysOnline, DeviceLatency
from fedasync.shared.seeds import DeviceStream, device_stream
from fedasync.sim.asynchronous import make_devices
from fedasync.sim.device import Device, ParkedStream
from fedasync.sim.world import build_world
from tests.sim.helpers import config


def test_parked_devices_draw_exactly_their_own_streams_interleaved() -> None:
    parked = ParkedStream(3)
    law = DeviceLatency(30.0, 0.2)
    devices = [Device(i, f"d{i}", lambda: None, law, AlwaysOnline(), 5, parked) for i in range(3)]  # type: ignore[arg-type, return-value]
    plans = {i: [] for i in range(3)}  # type: dict[int, list[float]]
    for step in range(30):  # interleaved, as the event loop does
        index = (step * 7) % 3
        plans[index].append(devices[index].plan_run(0.0, 0.5).end)
    for index, ends in plans.items():
        own = device_stream(5, index, DeviceStream.LATENCY)
        expected = []
        for _ in ends:
            expected.append(law.sample(own))
            own.random(), own.random()
        assert ends == expected


def test_devices_are_made_on_first_use_and_data_cut_on_demand() -> None:
    world = build_world(config(fleet={"devices": 40, "latency": {"kind": "longtail"}}))
    devices = make_devices(world)
    assert len(devices) == 40
    assert devices._made.count(None) == 40
    device = devices[17]
    assert devices[17] is device
    assert devices._made.count(None) == 39
    data = world.device_data
    assert sum(data.sizes()) == len(world.train)
    assert len(device.data) == data.size(17) == len(data[17])
    joined = np.concatenate([data[i].y for i in range(40)])
    assert sorted(joined.tolist()) == sorted(world.train.y.tolist())
