"""One strategy per aggregation mode, and the registry `AggregationState` decides through.

Each mode's rule is one module here, a `Strategy` (base.py: the protocol). To add a mode: write
its module, add its value to `Mode` (shared/policy.py) and its strategy to `STRATEGIES` below.
The order of `STRATEGIES` is the order a mode switch settles what the modes held (`HOLDERS`).
"""

from __future__ import annotations

from fedasync.shared.modes.base import Clip, Settlement, State, Strategy
from fedasync.shared.modes.fedasync import FedAsync
from fedasync.shared.modes.fedbuff import FedBuff
from fedasync.shared.modes.fedbuff_fair import FedBuffFair
from fedasync.shared.modes.memory import MemoryMode
from fedasync.shared.modes.tiered import Tiered
from fedasync.shared.policy import Mode

#: every mode's strategy: buffer before memory before tiers is the order a switch settles them
STRATEGIES: dict[Mode, Strategy] = {
    strategy.mode: strategy
    for strategy in (FedAsync(), FedBuff(), FedBuffFair(), MemoryMode(), Tiered())
}


def _holders() -> tuple[Strategy, ...]:
    first: dict[str, Strategy] = {}
    for strategy in STRATEGIES.values():
        if strategy.holding is not None:
            first.setdefault(strategy.holding, strategy)
    return tuple(first.values())


#: the strategies that keep something between server steps, one per holding (fedbuff-fair's
#: buffer is FedBuff's), in `STRATEGIES` order
HOLDERS = _holders()

__all__ = ["HOLDERS", "STRATEGIES", "Clip", "Settlement", "State", "Strategy"]
