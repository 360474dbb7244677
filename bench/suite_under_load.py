"""The whole test suite, several times in a row, with a CPU hog on every core.

Issue 12 asked that the suite stay green on a loaded machine and from any shell. This wrapper
starts one busy process per core (`yes > /dev/null`, started and killed here, never left behind),
runs `python -m pytest` the given number of times, and prints each run's closing line and wall
time beside the time of one run without the hogs, when asked for. To check the "any shell" half,
start it the way a CI job or a cron line would:

    nohup .venv/bin/python bench/suite_under_load.py --runs 3 > under-load.log 2>&1 &

Run: python bench/suite_under_load.py [--runs 3] [--hogs 2] [--baseline] [-- pytest args]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLOSING = re.compile(r"^=*\s*(\d+ (passed|failed).*) in [\d.]+s", re.M)


def run_suite(pytest_args: list[str]) -> tuple[int, float, str]:
    """(exit code, wall seconds, pytest's closing line) of one whole run."""
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    seconds = time.monotonic() - start
    found = CLOSING.findall(done.stdout)
    closing = found[-1][0] if found else done.stdout.strip().splitlines()[-1:]
    if done.returncode != 0:
        failures = [line for line in done.stdout.splitlines() if line.startswith("FAILED")]
        print("\n".join(failures), flush=True)
    return done.returncode, seconds, str(closing)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--baseline", action="store_true", help="one run without hogs first")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    print(f"SIGINT disposition of this process: {signal.getsignal(signal.SIGINT)}", flush=True)
    # a `kill` of this wrapper still ends the hogs (the finally below), not just Ctrl-C
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    failed = 0
    if args.baseline:
        code, seconds, closing = run_suite(args.pytest_args)
        failed += code != 0
        print(f"baseline (no hog): exit {code}, {seconds:.0f} s: {closing}", flush=True)
    hogs = [
        subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, start_new_session=True)
        for _ in range(args.hogs)
    ]
    try:
        for run in range(1, args.runs + 1):
            code, seconds, closing = run_suite(args.pytest_args)
            failed += code != 0
            print(f"run {run} with {args.hogs} CPU hogs: exit {code}, {seconds:.0f} s: {closing}",
                  flush=True)  # fmt: skip
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    print("all green" if failed == 0 else f"{failed} run(s) failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
