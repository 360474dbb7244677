"""`fedasync up` notes a Ctrl-C or SIGTERM and stops only where stopping is safe.

A KeyboardInterrupt raised at an arbitrary bytecode once hid a worker's kill -9 (it landed inside
`Popen.poll`, between reaping the worker and storing its exit code); these tests hold the rule
that replaced it: the handler only notes the signal, `check` acts on it.
"""

from __future__ import annotations

import signal

import pytest

from fedasync.services.commands.up.interrupts import Interrupts


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopping_signal_is_noted_on_arrival_and_raised_only_at_a_check(sig: int) -> None:
    interrupts = Interrupts()
    with interrupts.installed():
        signal.raise_signal(sig)  # runs the Python handler before returning
        noted = interrupts.received  # reached: the handler did not raise
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
    assert noted == sig


def test_no_signal_means_check_and_sleep_return() -> None:
    interrupts = Interrupts()
    with interrupts.installed():
        interrupts.check()
        interrupts.sleep(0)
    assert interrupts.received is None


def test_sleep_stops_once_a_signal_has_come() -> None:
    interrupts = Interrupts()
    with interrupts.installed():
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            interrupts.sleep(0)


def test_the_handlers_before_are_back_on_the_way_out_even_an_ignored_sigint() -> None:
    """A `nohup … &` job inherits SIGINT ignored; inside, Ctrl-C is noted all the same."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupts = Interrupts()
        with interrupts.installed():
            assert signal.getsignal(signal.SIGINT) == interrupts.note
            assert signal.getsignal(signal.SIGTERM) == interrupts.note
            interrupts.ignore()  # the cleanup under way
            signal.raise_signal(signal.SIGINT)
            assert interrupts.received is None
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    finally:
        signal.signal(signal.SIGINT, before[signal.SIGINT])
