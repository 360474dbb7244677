"""The compose tests: the repository's docker-compose.yml built and run on a real Docker engine.

They need an engine (DOCKER_HOST, or Docker's default socket) with Docker Compose v2, and root on
the engine's host (the chaos test crashes containers by their main process's host pid); without
them every test here skips and says why, so the README's test command passes on a machine with no
Docker. `.ci/run` starts an engine when it can (../shared/compose-lab/ on the CI machines) and
exports its DOCKER_HOST, so CI runs them.

The images are built once per session the air-gapped way (docs/operations.md, "Building without
Docker Hub or PyPI"): docker/wheelhouse.sh fills docker/wheels/ through the host's package index,
then the build gets PIP_NO_INDEX=1 and PIP_FIND_LINKS=/wheels and installs from those wheels
alone. Base images are never pulled: the engine must have them (the lab's stand-ins on CI).
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from fedasync.services.commands.chaos.compose.stack import Stack, engine_problem, fresh_settings
from tests.compose.helpers import AIR_GAPPED, ROOT, Images


@pytest.fixture(scope="session")
def engine() -> None:
    """Skip (with the reason) where no Docker engine can run the stack."""
    problem = engine_problem()
    if problem is not None:
        pytest.skip(
            f"no Docker engine for the compose tests: {problem} "
            "(`.ci/run` starts one; docs/operations.md, Deploy with Docker Compose)"
        )
    if os.geteuid() != 0:
        pytest.skip("the compose tests crash containers by their host pid: run them as root")


@pytest.fixture(scope="session")
def images(engine: None) -> Images:
    """The wheelhouse, then both images built from it with no package index."""
    started = time.monotonic()
    subprocess.run([str(ROOT / "docker" / "wheelhouse.sh")], check=True, timeout=1800)
    wheelhouse_s = time.monotonic() - started
    stack = Stack(ROOT, "fedasync-build", fresh_settings(**AIR_GAPPED))
    build_s = stack.build()
    print(f"compose tests: wheelhouse {wheelhouse_s:.0f} s, image build {build_s:.0f} s")
    return Images(wheelhouse_s, build_s)
