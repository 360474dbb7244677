"""What the compose tests share besides fixtures."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fedasync.services.commands.chaos.compose.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
#: the build arguments of an air-gapped build: the wheelhouse, and no index
AIR_GAPPED = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheels"}
#: the TLS edge's image, as docker-compose.yml names it
EDGE_IMAGE = "nginx:1.27-alpine"
#: the Debian packages the stand-in is made of (nginx's other dependencies are in the base)
NGINX_DEBS = ("nginx", "nginx-common")
STANDINS = Path(__file__).resolve().parent / "standins"


@dataclass(frozen=True, slots=True)
class Images:
    """How long the session's wheelhouse and image build took, seconds."""

    wheelhouse_s: float
    build_s: float


def nginx_standin(stack: Stack, base: str = "python:3.11-slim") -> str | None:
    """Make sure the engine has EDGE_IMAGE: the real one if it is there, else a stand-in built
    from Debian's nginx (standins/nginx.Dockerfile says how and why). Returns None when the
    image is there, else why it cannot be (the edge test then skips and says so)."""
    if stack.has_image(EDGE_IMAGE):
        return None
    if not stack.has_image(base):
        return f"neither {EDGE_IMAGE} nor {base} (the stand-in's base) is on this engine"
    if shutil.which("apt-get") is None:
        return f"{EDGE_IMAGE} is not on this engine and no apt-get can fetch Debian's nginx"
    with tempfile.TemporaryDirectory(prefix="nginx-standin-") as where:
        context = Path(where)
        debs = context / "debs"
        debs.mkdir()
        fetched = subprocess.run(
            ["apt-get", "download", *NGINX_DEBS],
            cwd=debs,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if fetched.returncode != 0 or len(list(debs.glob("*.deb"))) != len(NGINX_DEBS):
            return f"`apt-get download {' '.join(NGINX_DEBS)}` failed: {fetched.stderr.strip()}"
        shutil.copy(STANDINS / "nginx.Dockerfile", context / "Dockerfile")
        stack.docker(
            "build",
            "--network",
            "none",
            "--build-arg",
            f"BASE={base}",
            "--tag",
            EDGE_IMAGE,
            str(context),
            timeout_s=600,
        )
    return None
