"""What every bench prints first and last: the code's commit, the cores, the load average.

A figure from a bench is only comparable with another if both say which code ran and how busy the
machine was (issue 29: a rerun that did not reproduce the documented ratios could not tell a code
change from a slower or busier machine). Benches import this module as a sibling (`bench/` is the
script's directory, so it is on sys.path when a bench runs).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import fedasync


def code_commit() -> str:
    """The commit of the fedasync code this process imports (and its children, from there)."""
    root = Path(fedasync.__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        done.check_returncode()
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return f"unknown ({root})"
    return f"{head}{' + uncommitted changes' if dirty else ''} ({root})"


def machine() -> str:
    """One line: commit, cores, and the 1/5/15-minute load averages at this moment."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"commit {code_commit()}; nproc {os.cpu_count()}; load average {load}"


def process_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) process `pid` has used: /proc/PID/stat's utime and stime.

    CPU per unit of work moves far less with the machine's load than rates do, so it tells a
    change of code (more work done) from a busier or slower machine (issue 29). Raises OSError
    once the process is gone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
