"""Which run a single-run process speaks for: the default run unless told it is another."""

from __future__ import annotations

import asyncio

from fedasync.services.runtime.own_run import own_domain, own_run
from fedasync.services.runtime.settings import load_settings
from fedasync.services.worker.service import _client
from fedasync.shared.device_auth import DOMAIN, update_domain


def test_a_process_is_the_default_runs_unless_another_run_is_named_the_default() -> None:
    alone = load_settings(redis={"key_prefix": "t-any_prefix"})
    assert own_run(alone) is None  # every deployment before runs, every test's own prefix
    assert own_domain(alone) == DOMAIN
    default = load_settings(redis={"key_prefix": "fedasync"}, auth={"default_run": "fedasync"})
    assert own_run(default) is None
    named = load_settings(redis={"key_prefix": "run-b"}, auth={"default_run": "fedasync"})
    assert own_run(named) == "run-b"
    assert own_domain(named) == update_domain("run-b") == b"fedasync-update-v2\nrun=run-b\n"


def test_a_worker_of_a_named_run_uses_its_runs_routes() -> None:
    worker = {
        "snapshot_url": "http://127.0.0.1:1",
        "ingest_url": "http://127.0.0.1:2",
        "key": "00" * 32,
    }
    named = load_settings(
        redis={"key_prefix": "run-b"}, auth={"default_run": "fedasync"}, worker=worker
    )
    legacy = load_settings(worker=worker)

    async def runs() -> tuple[str | None, str | None]:
        a = _client(named, None, asyncio.Event())
        b = _client(legacy, None, asyncio.Event())
        try:
            return a.run, b.run
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(runs()) == ("run-b", None)
