"""The worker's publish journal: lines survive a kill -9 of the writer; readers merge files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fedasync.services.worker.journal import Journal, read_journals

ROOT = Path(__file__).resolve().parents[2]


def test_lines_written_before_a_kill_9_are_all_there(tmp_path: Path) -> None:
    path = tmp_path / "w.journal"
    code = (
        "import os, signal\n"
        "from fedasync.services.worker.journal import Journal\n"
        f"journal = Journal({str(path)!r})\n"
        "journal.attempted('u1')\n"
        "journal.acknowledged('u1', '1-0')\n"
        "journal.attempted('u2')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False)
    assert result.returncode == -9
    contents = read_journals([path])
    assert contents.acknowledged == {"u1": "1-0"}
    assert contents.attempted == {"u1", "u2"}
    assert contents.malformed == 0


def test_journals_of_several_workers_merge_and_odd_lines_are_counted(tmp_path: Path) -> None:
    Journal(str(tmp_path / "a.journal")).acknowledged("x", "5-0")
    Journal(str(tmp_path / "b.journal")).attempted("y")
    (tmp_path / "c.journal").write_text("ack\tz\n")  # torn: no entry id
    contents = read_journals(sorted(tmp_path.glob("*.journal")))
    assert contents.acknowledged == {"x": "5-0"}
    assert contents.attempted == {"x", "y"}  # acknowledged implies attempted
    assert contents.malformed == 1


def test_without_a_path_nothing_is_written(tmp_path: Path) -> None:
    journal = Journal(None)
    journal.attempted("u")
    journal.acknowledged("u", "1-0")
    assert list(tmp_path.iterdir()) == []
