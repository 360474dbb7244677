"""`PCG64Starts`: the fleet's stream starts computed at once are numpy's own, stream by stream.

The simulator seeds every device's latency stream from this table (issue 29) instead of a
SeedSequence and a PCG64 each; any difference would change every run, so it is compared with
numpy for seeds of one and of two 32-bit words and indices across word boundaries.
"""

from __future__ import annotations

import pytest

from fedasync.shared.seeds import PCG64Starts, bits


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**32 - 1, 2**32, 2**40 + 7])
@pytest.mark.parametrize(("prefix", "suffix"), [((5,), (0,)), ((5,), (2, 9)), ((), ())])
def test_each_start_is_numpys(seed: int, prefix: tuple[int, ...], suffix: tuple[int, ...]) -> None:
    count = 70_000  # past 2^16, in one table
    starts = PCG64Starts(seed, prefix, count, suffix)
    for index in (0, 1, 2, 255, 256, 4097, 65535, 65536, count - 1):
        state = bits(seed, *prefix, index, *suffix).state["state"]
        assert starts.start(index) == (state["state"], state["inc"])
