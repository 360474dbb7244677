"""The protocol every aggregation mode implements, and what a mode may use of the state.

A mode is one `Strategy` subclass in its own module under shared/modes/. It decides how an
update that passed the checks every mode shares (ids, dedup, closing, shape, staleness: in
`AggregationState.apply`) is taken in, and when that makes a server step (`take`). A mode that
keeps something between server steps names it (`holding`: the state's attribute and the
checkpoint's section, shared/modes/holdings.py) and says how a mode switch settles it (`held`,
`settled`, `empty`, driven by `AggregationState.settle`).

Adding a mode means one file here with its `Strategy`, one `Mode` value (shared/policy.py) and
one entry in `STRATEGIES` (shared/modes/__init__.py). A mode that keeps something new between
server steps also adds its holding (holdings.py, an attribute of the state) and a checkpoint
section for it (shared/checkpoint.py, a new FORMAT_VERSION): new bytes need a new format.

Strategies hold no data of their own: one instance serves every state, and everything a decision
depends on is in the state, so a checkpoint restores it whole. They see the state through
`State`, the few attributes and shared steps (the norm bound, the decision record, the mode
switch) that are written once, in `AggregationState`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, NamedTuple, Protocol

import numpy as np

from fedasync.shared.clients import ClientBook
from fedasync.shared.decision import Decision, Outcome
from fedasync.shared.layout import Layout
from fedasync.shared.modes.holdings import FedBuffBuffer, Memory, Tier
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.privacy.spent import PrivacySpent
from fedasync.shared.server_optimizer import OptimizerState
from fedasync.shared.update import Update


class Clip(NamedTuple):
    """The poisoning bound's verdict on an update it lets through (`State.clip`).

    Tuples, not dataclasses: made for every update, and a frozen dataclass costs microseconds.
    """

    #: the delta norm the update counts with: the bound when clipped, else its own
    norm: float
    #: bound / the update's own norm when clipped (what its delta is scaled by), else None
    scale: float | None = None

    @property
    def clipped(self) -> bool:
        return self.scale is not None


class Settlement(NamedTuple):
    """What a mode switch makes of what the previous modes held (`AggregationState.settle`):
    the weights and server optimizer once it is applied, and the server steps that took.
    Nothing has changed until `commit()`; `settling` says whether anything was held."""

    weights: np.ndarray
    optimizer: OptimizerState
    steps: int
    settling: bool
    commit: Callable[[], None]


class State(Protocol):
    """What a mode's strategy reads and changes of `AggregationState`."""

    layout: Layout
    version: int
    counters: dict[str, int]
    optimizer: OptimizerState
    history: list[tuple[int, np.ndarray]]
    clients: ClientBook
    buffer: FedBuffBuffer
    memory: Memory
    tiers: list[Tier]
    privacy: PrivacySpent

    def weights_view(self) -> np.ndarray: ...

    def private_step(self, policy: Policy, count: int) -> np.ndarray: ...

    def replace_weights(self, weights: np.ndarray) -> None: ...

    def scratch(self) -> np.ndarray: ...

    def clip(self, update: Update, policy: Policy, tau: int, norm: float) -> Clip | Decision: ...

    def settle(self, policy: Policy) -> Settlement: ...

    def zeno_check(
        self, update: Update, policy: Policy, tau: int, delta: np.ndarray, norm: float
    ) -> Decision | None: ...

    def make_room(self, policy: Policy) -> None: ...

    def forget_idle(self, policy: Policy) -> None: ...

    def reject_non_finite(self, update: Update, policy: Policy) -> Decision: ...

    def note_step(self, excluded: tuple[str, ...], detail: str) -> None: ...

    def advance(
        self,
        update: Update,
        policy: Policy,
        tau: int,
        alpha: float,
        step_norm: float,
        clip: Clip,
        *,
        server_step: bool,
    ) -> Decision: ...

    def decide(
        self,
        update: Update,
        policy: Policy,
        outcome: Outcome,
        *,
        tau: int | None = None,
        reason: str | None = None,
        detail: str = "",
        delta_norm: float | None = None,
    ) -> Decision:
        """A decision that applies nothing (a strategy's refusals; `advance` records the rest)."""


class Strategy(ABC):
    """One mode's rule: how an applied update is taken in, when a server step happens, and
    what the mode keeps between server steps and how a switch away from it settles that."""

    #: the policy mode this strategy decides
    mode: ClassVar[Mode]
    #: what it keeps between server steps: the state's attribute and the checkpoint's section
    #: of that name (shared/modes/holdings.py); None for nothing. Modes naming the same holding
    #: share it, and a switch between them settles nothing (fedbuff ↔ fedbuff-fair).
    holding: ClassVar[str | None] = None

    @abstractmethod
    def take(
        self, state: State, update: Update, new: np.ndarray, tau: int, policy: Policy
    ) -> Decision:
        """Decide `update` (its weights `new`, float32; τ = `tau`, not stale), which every mode's
        checks have passed: refuse it (the norm bound, values this mode cannot take) or take
        it in, settling a mode switch first (`state.settle`), stepping the server when this
        mode's rule says so, and record the decision (`state.advance`)."""

    def held(self, state: State, incoming: Strategy, policy: Policy) -> bool:
        """Whether `state` holds something of this mode that `incoming`, the strategy of
        `policy.mode`, cannot go on with (so a switch must settle it)."""
        return False

    def settled(
        self, state: State, x: np.ndarray, optimizer: OptimizerState, policy: Policy
    ) -> tuple[np.ndarray, OptimizerState, int]:
        """The weights and optimizer once what this mode holds is applied to `x` under
        `policy`, and the server steps that took (0 when the weights did not change). Nothing
        is changed: `empty` follows once the caller commits."""
        return x, optimizer, 0

    def empty(self, state: State) -> None:
        """Forget what this mode holds (after `settled`'s weights are committed)."""
        return None


def frozen(array: np.ndarray) -> np.ndarray:
    """`array`, made read-only: weights are replaced, never written in place."""
    array.flags.writeable = False
    return array


def sum_of_squares(scratch: np.ndarray) -> float:
    """Σv² with numpy's pairwise sum, overwriting `scratch` (a temporary of the caller's).

    Not BLAS dot: its threads may split the sum differently on another machine, and decisions
    must be bit-identical everywhere. Infinite or NaN if v holds one, or if a square overflows.
    """
    np.square(scratch, out=scratch)
    return float(np.sum(scratch))
