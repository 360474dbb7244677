"""CPU time of `fedasync` reading its arguments, against `python -c pass`, side by side.

Every command parses its arguments before it does anything: `--help` and a typo, of the command
or of a subcommand's option, should cost about what starting Python does, not the ~2 s of CPU
importing numpy, pydantic, redis and aiohttp took when every subcommand was built up front (nor
the ~0.5 s the settings' pydantic models and numpy took while `up`'s flags were built from them).
Each command runs `--rounds` times, the commands in turn within each round (a load that comes and
goes touches all alike); a figure is the median of its rounds' user + system CPU seconds of the
child, and the ratio is that ÷ the same for `python -c pass`.

Every command is measured: the list is read from the `fedasync` parser itself (its subcommands and
theirs: `ledger export`, `devices add`, ...), each asked `--help` and given a mistyped option, so a
new command that imports before it parses shows here. `--commands` narrows the list to those
whose name contains one of the words given.

Run: python bench/cli_startup.py [--rounds 5] [--commands up ledger]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

FEDASYNC = str(Path(sys.executable).with_name("fedasync"))
BASELINE = "python -c pass"
#: what is run besides every subcommand's `--help` and mistyped option
FIXED: dict[str, list[str]] = {
    BASELINE: [sys.executable, "-c", "pass"],
    "fedasync --help": [FEDASYNC, "--help"],
    "fedasync frobnicate": [FEDASYNC, "frobnicate"],
}


def subcommands(parser: argparse.ArgumentParser) -> list[list[str]]:
    """Every command path of `parser`, depth first: `["up"]`, `["ledger"]`, `["ledger",
    "export"]`, ... (argparse keeps a parser's subparsers in its `_subparsers` group)."""
    paths: list[list[str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths.append([name])
                paths.extend([name, *deeper] for deeper in subcommands(sub))
    return paths


def commands(only: list[str] | None) -> dict[str, list[str]]:
    """The runs: the fixed ones, then `--help` and `--frobnicate` of every command path."""
    from fedasync.services.commands.cli import build_parser

    runs = dict(FIXED)
    for path in subcommands(build_parser()):
        name = " ".join(path)
        if only and not any(word in name for word in only):
            continue
        runs[f"fedasync {name} --help"] = [FEDASYNC, *path, "--help"]
        runs[f"fedasync {name} --frobnicate"] = [FEDASYNC, *path, "--frobnicate"]
    return runs


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
    parser.add_argument("--commands", nargs="*", help="only commands whose name contains these")
    args = parser.parse_args()
    runs = commands(args.commands)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, argv in runs.items():
            samples[name].append(cpu_seconds(argv))
    base = statistics.median(samples[BASELINE])
    width = max(len(name) for name in runs)
    print(f"{'command':<{width}} {'CPU s (median)':>15} {'÷ python -c pass':>17}")
    for name, values in samples.items():
        cpu = statistics.median(values)
        print(f"{name:<{width}} {cpu:>15.3f} {cpu / max(base, 1e-3):>17.1f}")


if __name__ == "__main__":
    main()
