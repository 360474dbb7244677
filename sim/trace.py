"""Replayed fleets: per-device durations and online windows read from CSV files.

durations: `device,duration_s` (one row per run, replayed in order, cyclically)
windows:   `device,online_from_s,online_until_s` (a device is offline outside its windows)
Devices are ordered by first appearance in the durations file.
"""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be replayed; names the file and line."""


def _rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or any(c not in reader.fieldnames for c in columns):
                raise TraceError(f"{path}: needs the columns {', '.join(columns)}")
            return [(number + 2, row) for number, row in enumerate(reader)]
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from None


def _seconds(path: Path, line: int, text: str | None) -> float:
    try:
        value = float(text or "")
    except ValueError:
        raise TraceError(f"{path}:{line}: {text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise TraceError(f"{path}:{line}: seconds must be finite and >= 0, got {value}")
    return value


def read_durations(path: Path) -> dict[str, tuple[float, ...]]:
    """Device id → its run durations, in file order."""
    out: dict[str, list[float]] = {}
    for line, row in _rows(path, ("device", "duration_s")):
        value = _seconds(path, line, row["duration_s"])
        if value == 0:
            raise TraceError(f"{path}:{line}: a run cannot take 0 s")
        out.setdefault(row["device"], []).append(value)
    if not out:
        raise TraceError(f"{path}: no rows")
    return {device: tuple(values) for device, values in out.items()}


def read_windows(path: Path) -> dict[str, list[tuple[float, float]]]:
    """Device id → its sorted online windows; overlapping windows are refused."""
    out: dict[str, list[tuple[float, float]]] = {}
    for line, row in _rows(path, ("device", "online_from_s", "online_until_s")):
        start = _seconds(path, line, row["online_from_s"])
        end = _seconds(path, line, row["online_until_s"])
        if end <= start:
            raise TraceError(f"{path}:{line}: window ends before it starts")
        out.setdefault(row["device"], []).append((start, end))
    for device, windows in out.items():
        windows.sort()
        for (_, end), (start, _) in itertools.pairwise(windows):
            if start < end:
                raise TraceError(f"{path}: windows of device {device!r} overlap")
    return out
