"""The device client over HTTPS: a private edge's certificate is checked against `ca_file`.

A snapshot service stand-in (it answers `204`, no model yet, as the real one does before the first
commit) listens with TLS on 127.0.0.1, its certificate self-signed as docs/security.md ("A TLS
edge for devices") makes one. With that certificate as `ca_file` the client gets its answer;
without it the system's authorities do not know the certificate and nothing is exchanged; nor
with another authority's certificate as `ca_file`.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from fedasync import DeviceClient
from fedasync.client.errors import Unavailable
from fedasync.client.retry import RetryPolicy

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

#: no retries: a refused certificate is the answer, not a transient failure
ONCE = RetryPolicy(attempts=0)


def self_signed(where: Path, name: str) -> tuple[Path, Path]:
    """A certificate for `name` (DNS) and 127.0.0.1, and its key, the documented way."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = where / f"{name}.crt", where / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name},IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest_asyncio.fixture
async def edge(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """An HTTPS server answering `GET /v1/models/latest` with 204; its URL and certificate."""
    cert, key = self_signed(tmp_path, "localhost")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def latest(request: web.Request) -> web.Response:
        return web.Response(status=204)

    app = web.Application()
    app.router.add_get("/v1/models/latest", latest)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"https://127.0.0.1:{port}", cert
    finally:
        await runner.cleanup()


async def test_the_edges_certificate_in_ca_file_is_trusted(edge: tuple[str, Path]) -> None:
    url, cert = edge
    async with DeviceClient(url, "device-1", ca_file=str(cert), retry=ONCE) as device:
        assert await device.latest() is None  # 204: an answer over a verified connection


async def test_without_ca_file_a_private_certificate_is_refused(edge: tuple[str, Path]) -> None:
    url, _ = edge
    async with DeviceClient(url, "device-1", retry=ONCE) as device:
        with pytest.raises(Unavailable, match="certificate verify failed"):
            await device.latest()


async def test_another_authority_in_ca_file_is_not_this_one(
    edge: tuple[str, Path], tmp_path: Path
) -> None:
    """`ca_file` replaces the trusted authorities; it does not turn checking off."""
    url, _ = edge
    other, _ = self_signed(tmp_path, "elsewhere")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(other.read_bytes())
    async with DeviceClient(url, "device-1", ca_file=str(bundle), retry=ONCE) as device:
        with pytest.raises(Unavailable, match="certificate verify failed"):
            await device.latest()


async def test_a_missing_ca_file_fails_at_construction(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        DeviceClient("https://edge.example", "device-1", ca_file=str(tmp_path / "none.pem"))
