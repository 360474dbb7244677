"""The distribution installs one top-level package, `fedasync`, and its command works from it.

The wheel is built from a copy of the source files (the build follows fedasync/'s links to
shared/, services/, learning/ and sim/), installed without dependencies into a new virtualenv,
and what it put into site-packages is listed. The installed command then runs with the test
environment's dependencies on PYTHONPATH (a path entry, so no editable-install hook of this
checkout is loaded) and from a folder outside the checkout, so only the installed copy can answer.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "fedasync", "shared", "services", "learning", "sim")


class Installed(NamedTuple):
    """A new venv with the wheel of this checkout installed, and what the wheel added."""

    env_dir: Path
    site: Path
    added: list[str]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("packaging")
    source = base / "source"
    source.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(path, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    wheels = base / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(source)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("fedasync-*.whl")
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True,
        ).stdout.strip()
    )  # fmt: skip
    before = set(os.listdir(site))
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Installed(env_dir, site, sorted(set(os.listdir(site)) - before))


def test_the_wheel_installs_exactly_one_top_level_package(installed: Installed) -> None:
    site, added = installed.site, installed.added
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert added == ["fedasync", f"fedasync-{version}.dist-info"]
    top_level = site / f"fedasync-{version}.dist-info" / "top_level.txt"
    if top_level.exists():
        assert top_level.read_text().split() == ["fedasync"]
    # the linked folders arrive as real files under the one package, with the dashboard page
    for module in ("shared/policy.py", "services/aggregator/service.py", "learning/task.py"):
        assert (site / "fedasync" / module).is_file(), module
    # and the checks that refuse a second import name (docs/architecture.md, "One package")
    for module in ("_import_guard.py", "services/__init__.py", "sim/__init__.py"):
        assert (site / "fedasync" / module).is_file(), module
    assert (site / "fedasync" / "services" / "control" / "dashboard.html").is_file()
    # and every Lua script beside its caller, which loads it with importlib.resources
    scripts = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "services").rglob("*.lua"))
    assert scripts, "no .lua files found in services/"
    for script in scripts:
        assert (site / "fedasync" / script).is_file(), script
    assert not any((site / "fedasync").rglob("*.egg-info"))


def test_the_installed_command_runs_from_the_installed_package(
    installed: Installed, tmp_path: Path
) -> None:
    env_dir, site = installed.env_dir, installed.site
    dependencies = sysconfig.get_paths()["purelib"]  # this environment's aiohttp, redis, numpy …
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDASYNC_")}
    env["PYTHONPATH"] = dependencies
    helped = subprocess.run(
        [str(env_dir / "bin" / "fedasync"), "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    assert "usage: fedasync" in helped.stdout
    where = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c", "import fedasync; print(fedasync.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(site)
