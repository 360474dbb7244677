"""The device client carries nothing of the server: `import fedasync.client` loads the core, its
HTTP client (aiohttp's client side) and redis-py, and no module of the services, their metrics,
their settings or aiohttp's server. The wire contract both sides speak lives in the core
(shared/keys.py, shared/ingest_protocol.py, shared/snapshot_protocol.py, ...)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: module name prefixes a device must never load (`aiohttp.web` also covers `aiohttp.web_app`...);
#: nor the learning tasks or the simulator: a device brings its own training
FORBIDDEN = (
    "fedasync.services",
    "prometheus_client",
    "pydantic_settings",
    "aiohttp.web",
    "fedasync.learning",
    "fedasync.sim",
)


def test_the_device_client_imports_nothing_of_the_server(tmp_path: Path) -> None:
    # a fresh interpreter, started outside the checkout as a device's program would be
    listing = subprocess.run(
        [sys.executable, "-c", "import sys, fedasync.client; print('\\n'.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.split()
    assert "fedasync.client" in listing
    offenders = sorted(name for name in listing if name.startswith(FORBIDDEN))
    print("\n".join(offenders))
    assert offenders == []
