"""Ctrl-C and SIGTERM for `fedasync up`: noted when they arrive, acted on where it is safe.

Python runs a signal handler between any two bytecodes of the main thread. A handler that raises
KeyboardInterrupt can therefore land inside `Popen.poll`, after the kernel has handed over a dead
worker's exit status and before Python stored it: the status is gone, the next poll reads ECHILD
and calls the exit 0, and a worker killed with -9 is reported as a clean stop. It can also land
in the middle of noting a crash. So the handler here only records the signal, and the run acts on
it at its waiting points (between two looks at the run, while a service starts).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: the signals that stop a run
STOPPING = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """Which stopping signal arrived (if any); `check` turns it into a KeyboardInterrupt."""

    def __init__(self) -> None:
        self.received: int | None = None

    def note(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum

    def check(self) -> None:
        """Raise KeyboardInterrupt if a stopping signal arrived: call where stopping is safe."""
        if self.received is not None:
            raise KeyboardInterrupt

    def sleep(self, seconds: float) -> None:
        """Wait, then stop if a signal came meanwhile (the sleep itself runs to its end: PEP 475
        resumes it after a handler that does not raise, so a Ctrl-C takes at most `seconds`)."""
        self.check()
        time.sleep(seconds)
        self.check()

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        """Note SIGINT and SIGTERM while inside; the previous handlers come back on the way out.

        SIGINT's handler is installed even when the shell that started us ignores it (a job
        started with `nohup … &` from a non-interactive shell inherits SIG_IGN): Ctrl-C, or a
        `kill -INT`, must stop the run all the same.
        """
        previous: dict[int, Any] = {sig: signal.signal(sig, self.note) for sig in STOPPING}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    @staticmethod
    def ignore() -> None:
        """From here on a stopping signal does nothing: the cleanup under way must finish."""
        for sig in STOPPING:
            signal.signal(sig, signal.SIG_IGN)
