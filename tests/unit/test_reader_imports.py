"""The reader process stays light: importing its entry (as a spawned child does) pulls no torch."""

from __future__ import annotations

import subprocess
import sys

CHECK = (
    "import sys\n"
    "import fedasync.services.aggregator.reader_process\n"
    "names = ('torch', 'fedasync.services.aggregator.deciding')\n"
    "heavy = sorted(m for m in names if m in sys.modules)\n"
    "print(','.join(heavy))\n"
)


def test_the_reader_process_imports_no_torch_and_no_deciding() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == ""
