"""One import path per module: the project's folders import as `fedasync.…` and under no other name.

From the repository's root the folders shared/, services/, learning/ and sim/ are on the path by
their bare names too; imported so, a module would load a second time, and its enums would not be
the ones the rest of fedasync compares with `is` (a FedAsync policy was decided as FedBuff). Each
folder's __init__.py refuses any name but `fedasync.<folder>` (fedasync/_import_guard.py). The
imports run in a fresh interpreter started in the repository's root, as a script there would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHY = "under a second name its modules would load twice"


def run_in_root(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("statement", "wrong", "right"),
    [
        ("import shared.policy", "shared.policy", "fedasync.shared.policy"),
        ("from shared.policy import Mode", "shared.policy", "fedasync.shared.policy"),
        ("from shared import policy", "shared", "fedasync.shared"),
        ("import services.stores.acl", "services.stores.acl", "fedasync.services.stores.acl"),
        ("import learning.task", "learning.task", "fedasync.learning.task"),
        ("import sim.config", "sim.config", "fedasync.sim.config"),
        (
            "import importlib; importlib.import_module('services.aggregator.service')",
            "services.aggregator.service",
            "fedasync.services.aggregator.service",
        ),
    ],
)
def test_a_bare_folder_name_fails_at_once_naming_the_right_import(
    statement: str, wrong: str, right: str
) -> None:
    ran = run_in_root("-c", statement)
    assert ran.returncode == 1
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: import {right}, not {wrong}: "), ran.stderr
    assert WHY in last


def test_running_a_service_by_its_bare_name_fails_the_same_way() -> None:
    """`python -m services.aggregator` fails too (runpy looks the package up outside an import
    statement, so the message names the folder: `import fedasync.services, not services`)."""
    ran = run_in_root("-m", "services.aggregator")
    assert ran.returncode == 1
    assert "import fedasync.services, not services: " in ran.stderr
    assert WHY in ran.stderr


def test_the_fedasync_names_work_from_the_root_and_load_each_module_once() -> None:
    """`fedasync.shared.policy` imports from the root, and no module of the tree is loaded a
    second time under a bare name on the way (the policy's Mode is the one aggregation uses)."""
    ran = run_in_root(
        "-c",
        "import sys\n"
        "import fedasync.shared.aggregation, fedasync.shared.policy as p\n"
        "import fedasync.shared.keys, fedasync.learning.task, fedasync.sim.config\n"
        "bare = {'shared', 'services', 'learning', 'sim'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in bare))\n"
        "print(p.Policy().mode is p.Mode.FEDASYNC, p.__name__)\n",
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["[]", "True fedasync.shared.policy"]
