"""What a device submits: its trained weights and where they came from."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

#: Longest update or client id, in characters; the codec and the state machine both enforce it.
MAX_ID_LENGTH = 128


@dataclass(frozen=True, slots=True, eq=False)
class Update:
    """One device's result of training from model `base_version`.

    `update_id` is chosen by the device and kept across retries: it is what makes a re-published
    update recognisable as the same one. `weights` is the flat vector in the model's layout.
    """

    update_id: str
    client_id: str
    base_version: int
    num_samples: int
    weights: np.ndarray
    created_at: float = 0.0
    metrics: Mapping[str, float] = field(default_factory=dict)
