"""The tree keeps its shape: a pure core, no pickle anywhere, one implementation of the rule."""

from __future__ import annotations

import ast
import functools
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


# ---------------------------------------------------------------------------------------------
# The layers. Every module of the package, by the name it is imported under, and the layer it is
# in; an import may point down (to a layer this one rests on) or stay within its layer, never up
# or sideways, and no modules import each other in a circle.

#: bottom to top; each layer may import the layers before it (and itself), none after it
CHAIN = ("guard", "core", "learning", "sim", "runtime", "stores", "services", "commands", "api")
#: the public device client sits beside the chain, on the core only. The layers from the runtime
#: up may import it: the runtime and the stores build on its Redis link (failover-aware
#: connections, receipt lookups: fedasync/client/redis_link.py, receipt_index.py), which a device
#: needs without the server, and the device worker is a device built on it
CLIENT_MAY_IMPORT = frozenset({"guard", "core", "client"})
CLIENT_IMPORTED_BY = frozenset({"client", "runtime", "stores", "services", "commands", "api"})
#: the services layer: one package each, none importing another's
SERVICES = ("aggregator", "control", "evaluator", "ingest", "snapshot", "supervisor", "worker")

#: why each entry of KNOWN_UNTIL_MERGE is there: the part of issue 26 that removes it
CLIENT = "h-client: fedasync.client imports only the core (the wire contract into shared/)"
HEADERS = "h-client: the snapshot service's header names and content type into the wire contract"
SNAPSHOT_CIRCLE = "h-client: snapshot app <-> fast (fast names SnapshotMetrics under TYPE_CHECKING)"

#: imports of the tree as it is before the other parts of issue 26 are merged, each (importer,
#: imported) with the part that removes it. The lead empties this after merging them; an entry
#: whose import is gone fails `test_known_exceptions_still_exist`, so the list cannot go stale.
#: A circle is let pass while one of its imports is listed here.
KNOWN_UNTIL_MERGE: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    """The name a file of the tree is imported under: shared/policy.py is fedasync.shared.policy
    (fedasync/shared links to shared/), fedasync/client/device.py is fedasync.client.device."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[0] != "fedasync":
        parts = ("fedasync", *parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_files() -> dict[str, Path]:
    """Every module of the package by name: the four linked folders and what fedasync/ holds of
    its own (walked without following its links, so each file is seen once)."""
    files = [p for d in ("shared", "learning", "sim", "services") for p in (ROOT / d).rglob("*.py")]
    own = ROOT / "fedasync"
    files += [p for p in own.rglob("*.py") if not any(q.is_symlink() for q in p.parents)]
    return {module_name(p): p for p in sorted(files)}


MODULES = package_files()


def layer(module: str) -> str:
    """The layer a module of the package is in; a folder of services/ that is none of the layers
    below is refused, so a new service is placed here (in SERVICES) before it can pass."""
    parts = module.split(".")
    if module == "fedasync._import_guard":
        return "guard"  # imports nothing; each folder's __init__ loads it to word a refusal
    if len(parts) == 1 or parts[1] == "torch":
        return "api"  # fedasync/__init__.py and fedasync.torch: the public names
    if parts[1] != "services":
        return {"shared": "core"}.get(parts[1], parts[1])  # core, learning, sim, client
    if len(parts) == 2:
        return "runtime"  # services/__init__.py, which imports only the guard
    if parts[2] in ("runtime", "stores", "commands"):
        return parts[2]
    if parts[2] in SERVICES:
        return "services"
    raise AssertionError(f"{module}: services/{parts[2]}/ is in no layer (add it to SERVICES?)")


def may_import(importer: str, imported: str) -> bool:
    """Whether a module of `importer`'s layer may import one of `imported`'s (the layer rules
    only; a service importing another service is refused by `sideways`)."""
    if importer == "client":
        return imported in CLIENT_MAY_IMPORT
    if imported == "client":
        return importer in CLIENT_IMPORTED_BY
    return CHAIN.index(imported) <= CHAIN.index(importer)


def sideways(importer: str, imported: str) -> bool:
    """One service's package importing another's (services/aggregator importing snapshot)."""
    a, b = importer.split("."), imported.split(".")
    return (
        layer(importer) == layer(imported) == "services"
        and len(a) > 2
        and len(b) > 2
        and a[2] != b[2]
    )


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_edges(module: str, path: Path) -> list[tuple[str, bool]]:
    """The project modules `module` imports, each with whether the import runs (False for one
    under `if TYPE_CHECKING:`), function-level imports included. `from a.b import c` names the
    module a.b.c when there is one, else a.b (c is a name in it); relative imports are resolved.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    edges: list[tuple[str, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.Import):
            edges.extend((alias.name, runs) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                edges.append((full if full in MODULES else base, runs))
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(tree, True)
    return [(name, runs) for name, runs in edges if name in MODULES and name != module]


@functools.cache  # the tree does not change during a run; parsed once for the tests below
def module_graph(*, with_type_checking: bool) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for imported, runs in import_edges(module, path):
            if runs or with_type_checking:
                graph[module].add(imported)
    return graph


def layer_violations() -> set[tuple[str, str]]:
    """Every import that runs up a layer or sideways. Imports under `if TYPE_CHECKING:` count:
    an annotation that names a class of a layer above depends on that layer all the same."""
    found = set()
    for module, imported in sorted(
        (m, i) for m, targets in module_graph(with_type_checking=True).items() for i in targets
    ):
        if not may_import(layer(module), layer(imported)) or sideways(module, imported):
            found.add((module, imported))
    return found


def import_circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each
    sorted. Function-level imports count: they run, later. Imports under `if TYPE_CHECKING:`
    count too: they never run, so they cannot leave a module half initialised, but two modules
    that name each other's classes still cannot be read, tested or moved one without the other,
    and hiding one direction behind TYPE_CHECKING is how the circles issue 26 names were kept
    (shared/policy.py ↔ server_optimizer.py, snapshot/app.py ↔ fast.py)."""
    graph = module_graph(with_type_checking=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(circles)


def test_every_module_has_a_layer() -> None:
    """The walk finds the package (the layer rules below would pass on an empty tree)."""
    assert {
        "fedasync.shared.policy",
        "fedasync.client.device",
        "fedasync.services.commands.cli",
    } <= set(MODULES)
    assert {layer(m) for m in MODULES} == {*CHAIN, "client"}
    assert {m.split(".")[2] for m in MODULES if layer(m) == "services"} == set(SERVICES)
    assert layer("fedasync.services.commands.redis_launch.server") == "commands"
    assert layer("fedasync.services.snapshot.app") == "services"


def test_imports_point_down_only() -> None:
    """core (shared) → learning → sim → services: runtime → stores → the services → commands,
    and the public client beside them on the core only: no import runs up a layer, and no service
    imports another service's package."""
    assert layer_violations() - set(KNOWN_UNTIL_MERGE) == set()


def test_no_import_circles() -> None:
    circles = import_circles()
    known = [c for c in circles if any(set(edge) <= set(c) for edge in KNOWN_UNTIL_MERGE)]
    assert [c for c in circles if c not in known] == []


def test_known_exceptions_still_exist() -> None:
    """Each entry of KNOWN_UNTIL_MERGE is still an import of the tree: remove it once its part is
    merged (this test then names it)."""
    graph = module_graph(with_type_checking=True)
    assert [edge for edge in KNOWN_UNTIL_MERGE if edge[1] not in graph[edge[0]]] == []
