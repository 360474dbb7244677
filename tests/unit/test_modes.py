"""The mode registry: every policy mode has one strategy, and a switch settles in one order."""

from __future__ import annotations

from fedasync.shared.modes import HOLDERS, STRATEGIES
from fedasync.shared.modes.fedbuff import FedBuff
from fedasync.shared.modes.memory import MemoryMode
from fedasync.shared.modes.tiered import Tiered
from fedasync.shared.policy import Mode


def test_every_mode_has_exactly_its_strategy() -> None:
    assert set(STRATEGIES) == set(Mode)
    assert all(strategy.mode is mode for mode, strategy in STRATEGIES.items())


def test_a_switch_settles_the_buffer_then_the_memory_then_the_tiers() -> None:
    """fedbuff-fair shares FedBuff's buffer: one holder each, in the order the sums were made."""
    assert [type(h) for h in HOLDERS] == [FedBuff, MemoryMode, Tiered]
    assert STRATEGIES[Mode.FEDBUFF_FAIR].holding == STRATEGIES[Mode.FEDBUFF].holding == "buffer"
    assert STRATEGIES[Mode.FEDASYNC].holding is None


def test_strategies_keep_no_data_of_their_own() -> None:
    """Everything a decision depends on is in the state, so a checkpoint restores it whole."""
    assert all(vars(strategy) == {} for strategy in STRATEGIES.values())
