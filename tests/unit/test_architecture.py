"""The tree keeps its shape: a pure core, no pickle anywhere, one implementation of the rule."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = sorted((ROOT / "shared").rglob("*.py"))
ALL_CODE = sorted(
    p
    for d in ("shared", "services", "learning", "sim", "tests", "bench")
    for p in (ROOT / d).rglob("*.py")
)

# I/O, concurrency, clocks and randomness stay out of the core; settings read the environment
# through pydantic-settings only when load_settings() is called.
FORBIDDEN_IN_CORE = {
    "asyncio",
    "aiohttp",
    "redis",
    "logging",
    "socket",
    "time",
    "datetime",
    "random",
    "threading",
    "subprocess",
    "pickle",
    "torch",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_core_module_does_no_io(path: Path) -> None:
    assert imported_modules(path) & FORBIDDEN_IN_CORE == set()
    assert "open(" not in path.read_text()


def test_core_never_imports_services() -> None:
    for path in CORE:
        assert "services" not in imported_modules(path), path.name


@pytest.mark.parametrize("path", ALL_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_pickle_anywhere(path: Path) -> None:
    text = path.read_text()
    if path.name == "test_architecture.py":
        return
    assert "pickle" not in imported_modules(path)
    assert "allow_pickle=True" not in text


def test_mixing_rule_is_written_once() -> None:
    """Only FedAsync's strategy may compute α = α0·s(τ) and mix; everything else calls it."""
    callers_of_staleness = [
        p.relative_to(ROOT)
        for p in ALL_CODE
        if "staleness.factor(" in p.read_text() and not p.name.startswith("test_")
    ]
    assert callers_of_staleness == [Path("shared/policy.py")]
    mixers = [  # bench/ keeps a bare copy of the arithmetic on purpose, as its baseline
        p.relative_to(ROOT)
        for p in ALL_CODE
        if "np.float32(alpha)" in p.read_text()
        and not p.name.startswith("test_")
        and p.parts[-2] != "bench"
    ]
    assert mixers == [Path("shared/modes/fedasync.py")]


def test_the_ledger_stream_is_read_in_one_place() -> None:
    """Only services/stores/ledger.py pages through the ledger and decodes its records; the control
    service's window, the run folder, export and verify all read through `ledger.records`."""
    readers = [
        p.relative_to(ROOT)
        for p in sorted((ROOT / "services").rglob("*.py"))
        if re.search(
            r"(xrange\(\s*|stream_entries\(\s*\w+,\s*)(self\.)?keys\.ledger", p.read_text()
        )
    ]
    assert readers == [Path("services/stores/ledger.py")]


def test_per_client_acceptance_is_built_in_one_place() -> None:
    """The dashboard's and the run summary's per-client rows come from shared/acceptance.py."""
    builders = [
        p.relative_to(ROOT)
        for p in ALL_CODE
        if '"rate": a' in p.read_text() and not p.name.startswith("test_")
    ]
    assert builders == [Path("shared/acceptance.py")]


def full_imports(path: Path) -> set[str]:
    """Every module an import statement names, dotted in full (`from a.b import c`: a.b, a.b.c),
    lazy imports inside functions included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_production_never_imports_the_simulator() -> None:
    """Nothing under services/ imports fedasync.sim, with one edge allowed: the `fedasync` command
    (services/commands/cli.py) registers `simulate` and `advise`, which are the simulator's own
    commands. Charts and statistics that both use live in the core (shared/charts.py,
    shared/stats.py)."""
    importers = [
        p.relative_to(ROOT)
        for p in sorted((ROOT / "services").rglob("*.py"))
        if any(n == "fedasync.sim" or n.startswith("fedasync.sim.") for n in full_imports(p))
    ]
    assert importers == [Path("services/commands/cli.py")]


@pytest.mark.parametrize("path", ALL_CODE, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_imports_the_old_top_level_names(path: Path) -> None:
    """One import name: `fedasync.shared`, never `shared` (the folders are not packages of
    their own once installed; an old import works only from a checkout, by accident)."""
    old = {"shared", "services", "learning", "sim"}
    assert imported_modules(path) & old == set()
