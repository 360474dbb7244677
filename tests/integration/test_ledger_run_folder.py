"""`fedasync ledger verify --run`: a finished `fedasync up` run verified from its folder alone.

The folder is built as `up` leaves it: a private redis-server kept its append-only file under
`redis/`, the aggregator committed through it, the server stopped, `summary.json` written. The
command starts a copy of that Redis; the run folder must come out byte for byte as it went in.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, make_update, publish

pytestmark = pytest.mark.integration


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file under `folder` with the SHA-1 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def train(run: Path, prefix: str, updates: int) -> None:
    """What `fedasync up` leaves behind: a Redis under run/redis/ that saw a training, stopped."""
    server = RedisServer(run / "redis")
    server.start()
    try:
        settings = load_settings(
            redis={"url": server.url, "key_prefix": prefix},
            task={"name": "linear"},
            aggregator={"batch_ms": 20, "block_ms": 100, "port": 0},
        )
        asyncio.run(_train(settings, updates))
    finally:
        server.stop()


async def _train(settings: Settings, updates: int) -> None:
    redis = connect(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    try:
        for i in range(updates):
            await publish(redis, keys, make_update(f"u{i}", base=max(i - 2, 0), value=float(i)))
        await run_aggregator(
            settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
        )
    finally:
        await redis.aclose()


@pytest.fixture
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new user's shell after `fedasync up`: no FEDASYNC_ variable, a run folder."""
    for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
        monkeypatch.delenv(name)


@pytest.mark.usefixtures("no_settings")
def test_verify_and_export_a_finished_run_from_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "up-20261130-120000"
    train(run, "run-prefix", 12)  # not the default prefix: found in the data
    (run / "summary.json").write_text("{}\n")
    before = fingerprint(run)

    assert main(["ledger", "verify", "--run", str(run)]) == 0
    captured = capsys.readouterr()
    assert "ledger verify: OK: 12 decisions replayed" in captured.out
    assert "committed model version" in captured.out
    assert "reproduced bit for bit" in captured.out
    assert captured.err == ""  # finished: no note about a live run

    exported = tmp_path / "ledger.jsonl"
    assert main(["ledger", "export", "--run", str(run), "--out", str(exported)]) == 0
    assert len(exported.read_text().splitlines()) == 12
    assert fingerprint(run) == before  # the run's own files were never written


@pytest.mark.usefixtures("no_settings")
def test_a_run_without_summary_is_read_from_a_copy_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "up-live"
    train(run, "fedasync", 3)
    before = fingerprint(run)
    assert main(["ledger", "verify", "--run", str(run)]) == 0
    captured = capsys.readouterr()
    assert "OK: 3 decisions replayed" in captured.out
    assert "no summary.json (still running, or cut short)" in captured.err
    assert fingerprint(run) == before


@pytest.mark.usefixtures("no_settings")
def test_two_trainings_in_one_redis_need_a_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "up-two"
    train(run, "first", 2)
    train(run, "second", 4)  # the same Redis data, started again
    assert main(["ledger", "verify", "--run", str(run)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "key prefixes first, second: choose one with FEDASYNC_REDIS__KEY_PREFIX" in line
    monkeypatch.setenv("FEDASYNC_REDIS__KEY_PREFIX", "second")
    assert main(["ledger", "verify", "--run", str(run)]) == 0
    assert "OK: 4 decisions replayed" in capsys.readouterr().out


@pytest.mark.usefixtures("no_settings")
def test_verify_under_a_prefix_with_no_training_says_where_it_looked_not_failed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mistyped prefix (or database) is not a failed proof: `FAILED` would send an operator
    to stop production; one line says where nothing was found, exit 2."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        monkeypatch.setenv("FEDASYNC_REDIS__URL", server.url)
        monkeypatch.setenv("FEDASYNC_REDIS__KEY_PREFIX", "fedasnyc")
        assert main(["ledger", "verify"]) == 2
    finally:
        server.stop()
    captured = capsys.readouterr()
    assert "FAILED" not in captured.out
    [line] = captured.err.splitlines()
    assert "no training under the key prefix 'fedasnyc'" in line
    assert "FEDASYNC_REDIS__KEY_PREFIX" in line
