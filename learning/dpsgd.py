"""DP-SGD on the device: a device's settings for it, and its own accountant, kept across runs.

Opacus (Yousefpour et al. 2021) clips each sample's gradient to `max_grad_norm`, adds Gaussian
noise of standard deviation `noise_multiplier · max_grad_norm` to each batch's sum, and samples
batches by Poisson sampling (each sample in with probability q = 1/⌈n/B⌉), the setting its RDP
accountant (Mironov 2017; Mironov, Talwar, Zhang 2019) assumes. What it guarantees is
sample-level: about one of this device's samples, for everything the device ever trained on
them. So the accountant belongs to the device, not to one run: `DeviceAccountant` composes every
run the device trained, and the ε it reports grows with each. The server's user-level DP
(shared/privacy) is a different, stronger guarantee about a whole device (docs/your-model.md).

Opacus is imported only when a private run trains (it costs seconds of import): a run without
DP-SGD never imports it, and neither does building these settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedasync.shared.device_privacy import DEVICE_DELTA, DEVICE_EPSILON

if TYPE_CHECKING:
    from opacus import PrivacyEngine
    from torch import nn

#: the fix Opacus offers for modules without per-sample gradients, named in the refusal
FIX = "opacus.validators.ModuleValidator.fix(model)"


class DPSGDError(ValueError):
    """DP-SGD cannot run with this task or model: the message says why and what to change."""


@dataclass(frozen=True, slots=True)
class DPSGD:
    """A device's DP-SGD settings: σ (noise multiplier), C (per-sample clip norm) and δ."""

    noise_multiplier: float
    max_grad_norm: float = 1.0
    delta: float = 1e-5

    def __post_init__(self) -> None:
        finite = all(
            math.isfinite(v) for v in (self.noise_multiplier, self.max_grad_norm, self.delta)
        )
        if not finite or self.noise_multiplier <= 0 or self.max_grad_norm <= 0:
            raise DPSGDError(
                "DP-SGD needs noise_multiplier > 0 and max_grad_norm > 0, got "
                f"{self.noise_multiplier} and {self.max_grad_norm}"
            )
        if not 0 < self.delta < 1:
            raise DPSGDError(f"DP-SGD's delta must be in (0, 1), got {self.delta}")


class DeviceAccountant:
    """One device's Opacus privacy engine (RDP accountant), kept for all of its runs.

    Each private run is made private through the same engine, so the accountant's history holds
    every step the device ever took: `epsilon()` is the device's total sample-level ε at its δ.
    One per device: two devices sharing one would add each other's steps.
    """

    def __init__(self, dp: DPSGD) -> None:
        self.dp = dp
        self._engine: PrivacyEngine | None = None
        #: private runs trained through this accountant
        self.runs = 0

    @property
    def engine(self) -> PrivacyEngine:
        """The engine, made (and opacus imported) when the first private run needs it."""
        if self._engine is None:
            import warnings

            from opacus import PrivacyEngine

            # RDP, the accountant the privacy literature and the server's sampled model use;
            # secure_mode needs torchcsprng and gives up the seeded reproducibility runs have
            # (docs/your-model.md), which is what Opacus warns of here
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
                self._engine = PrivacyEngine(accountant="rdp", secure_mode=False)
        return self._engine

    @property
    def history(self) -> list[tuple[float, float, int]]:
        """(noise multiplier, sample rate, steps) of every step taken, as Opacus keeps them."""
        if self._engine is None:
            return []
        return list(self._engine.accountant.history)

    def restore(self, history: list[tuple[float, float, int]], runs: int) -> None:
        """Continue from the steps a previous process of this device took (its saved state),
        so a restarted device reports the ε of all its runs, not of those since the restart."""
        if history:
            self.engine.accountant.history = [(float(s), float(q), int(n)) for s, q, n in history]
        self.runs = runs

    def epsilon(self) -> float:
        """The device's ε at its δ over every step so far (0 before its first)."""
        if not self.history:
            return 0.0
        return float(self.engine.accountant.get_epsilon(delta=self.dp.delta))

    def metrics(self) -> dict[str, float]:
        """The figures a device adds to its update's metrics: its ε and the δ it is at."""
        return {DEVICE_EPSILON: self.epsilon(), DEVICE_DELTA: self.dp.delta}


class FleetAccountants:
    """Each simulated device's own accountant, made at its first private run (the simulator
    holds a fleet; a worker holds one `DeviceAccountant`)."""

    def __init__(self, dp: DPSGD) -> None:
        self.dp = dp
        self._devices: dict[int, DeviceAccountant] = {}

    def of(self, device: int) -> DeviceAccountant:
        accountant = self._devices.get(device)
        if accountant is None:
            accountant = self._devices[device] = DeviceAccountant(self.dp)
        return accountant


def private(accountant: DeviceAccountant | None) -> dict[str, DeviceAccountant]:
    """The keyword arguments a task's train gets for DP-SGD: none without it, so a run without
    DP-SGD calls every task exactly as before."""
    return {} if accountant is None else {"privacy": accountant}


def check_module(model: nn.Module, task_name: str) -> None:
    """Refuse a module Opacus cannot compute per-sample gradients for, naming its layers and
    the fix (Opacus's own explanation is a paragraph; the log line names what to change)."""
    from opacus.validators import ModuleValidator

    if not ModuleValidator.validate(model, strict=False):
        return
    layers = [
        f"{name} ({type(module).__name__})"
        for name, module in model.named_modules()
        if name and not list(module.children()) and ModuleValidator.validate(module, strict=False)
    ]
    if not layers:  # the module as a whole: Opacus's first sentence says why
        first = str(ModuleValidator.validate(model, strict=False)[0]).split(". ")[0]
        layers = [first[:200]]
    raise DPSGDError(
        f"task {task_name!r}: its model cannot train with DP-SGD, Opacus computes no per-sample "
        f"gradients for {', '.join(layers)}; replace them in the task's model(), e.g. return "
        f"{FIX} (BatchNorm becomes GroupNorm)"
    )
