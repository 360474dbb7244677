"""Progress as plain lines, for a log or a pipe, where a progress bar would show nothing.

`fedasync simulate` draws a rich bar on a terminal; elsewhere (CI, `| tee`, a service's log) it
prints one short line per algorithm each time another tenth of the simulated budget has passed,
or when `every_s` seconds of wall time went by without a line, as `fedasync up --no-live` does.
The lines are display only: nothing a run records or writes depends on them, so a run gives the
same bytes with or without them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fedasync.sim.result import Progress

#: wall seconds without a line after which one is printed anyway
EVERY_S = 30.0
#: share of the simulated budget between two lines
STEP = 0.1


def line_progress(
    total_s: float,
    write: Callable[[str], None],
    *,
    every_s: float = EVERY_S,
    step: float = STEP,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[str], Progress]:
    """A `progress(name)` for `simulate` that writes lines such as
    `[   31 s] fedasync: 36/360 simulated min (10%), 1204 applied`."""
    started = clock()

    def start(name: str) -> Progress:
        printed = 0  # steps of the budget passed when the last line was written
        last = clock()

        def advance(sim_s: float, applied: int) -> None:
            nonlocal printed, last
            share = sim_s / total_s
            steps = int(share / step + 1e-9)  # 0.3 / 0.1 is 2.9999999999999996
            now = clock()
            if steps <= printed and now - last < every_s:
                return
            printed, last = max(steps, printed), now
            write(
                f"[{now - started:5.0f} s] {name}: {sim_s / 60:.0f}/{total_s / 60:.0f} "
                f"simulated min ({min(share, 1.0):.0%}), {applied} applied"
            )

        return advance

    return start
