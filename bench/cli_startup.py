"""CPU time of `fedasync` reading its arguments, against `python -c pass`, side by side.

Every command parses its arguments before it does anything: `--help` and a typo, of the command
or of a subcommand's option, should cost about what starting Python does, not the ~2 s of CPU
importing numpy, pydantic, redis and aiohttp took when every subcommand was built up front (nor
the ~0.5 s the settings' pydantic models and numpy took while `up`'s flags were built from them).
Each command runs `--rounds` times, the commands in turn within each round (a load that comes and
goes touches all alike); a figure is the median of its rounds' user + system CPU seconds of the
child, and the ratio is that ÷ the same for `python -c pass`.

Run: python bench/cli_startup.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

FEDASYNC = str(Path(sys.executable).with_name("fedasync"))
COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "fedasync --help": [FEDASYNC, "--help"],
    "fedasync frobnicate": [FEDASYNC, "frobnicate"],
    "fedasync up --help": [FEDASYNC, "up", "--help"],
    "fedasync up --frobnicate": [FEDASYNC, "up", "--frobnicate"],
    "fedasync simulate --help": [FEDASYNC, "simulate", "--help"],
}


def cpu_seconds(argv: list[str]) -> float:
    """User + system CPU of one run of `argv` (its exit code is not asked: a typo exits 2)."""
    before = os.times()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = os.times()
    return (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, argv in COMMANDS.items():
            samples[name].append(cpu_seconds(argv))
    base = statistics.median(samples["python -c pass"])
    print(f"{'command':<26} {'CPU s (median)':>15} {'÷ python -c pass':>17}")
    for name, values in samples.items():
        cpu = statistics.median(values)
        print(f"{name:<26} {cpu:>15.3f} {cpu / max(base, 1e-3):>17.1f}")


if __name__ == "__main__":
    main()
