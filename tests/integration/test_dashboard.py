"""The dashboard in headless Chromium: it shows the status, flips a switch, asks nothing outside,
and asks for the operator token when reads need one (FEDASYNC_CONTROL__OPEN_READS=false).

Needs Debian's `chromium` and the `playwright` package (driving that browser through
executable_path; no browser download). Skipped, with the reason, when either is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from aiohttp import web

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.control.app import create_app
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores import evaluations
from fedasync.services.stores.evaluations import EvaluationRecord
from fedasync.services.stores.policy_store import read_policy
from fedasync.shared.keys import Keys
from tests.integration.helpers import initial_state, ledger, make_update, publish

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright_api = pytest.importorskip("playwright.async_api", reason="playwright not installed")
TOKEN = "dashboard-test-token"


@pytest_asyncio.fixture
async def base_url(
    settings: Settings, redis: aioredis.Redis, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    """The control service on a free port; `open_reads` from an indirect parameter (default on)."""
    open_reads: bool = getattr(request, "param", True)
    control = settings.control.model_copy(update={"token": TOKEN, "open_reads": open_reads})
    settings = settings.model_copy(update={"control": control})
    keys = Keys(settings.redis.key_prefix)
    for i in range(5):
        await publish(redis, keys, make_update(f"d{i}", base=0, client=f"device-{i % 2}"))
    for version in range(6):  # what the evaluator would have recorded
        accuracy = 0.1 + 0.15 * version
        per_class = {str(c): min(1.0, accuracy + 0.05 * (c - 1)) for c in range(3)}
        record = EvaluationRecord(
            version, 1.0, 1.0, 2 - accuracy, accuracy, 90, accuracy, per_class
        )
        await evaluations.append(redis, keys, record, keep=1000)
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    runner = web.AppRunner(create_app(settings, redis, run_rules=False))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """Debian's Chromium, headless, with nothing of its own that calls out (updates, sync)."""
    async with playwright_api.async_playwright() as driver:
        browser = await driver.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            yield browser
        finally:
            await browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed")
async def test_dashboard_flips_a_switch_in_chromium(
    base_url: str, settings: Settings, redis: aioredis.Redis, tmp_path: Path
) -> None:
    requested: list[str] = []
    async with chromium() as browser:
        page = await browser.new_page(viewport={"width": 1100, "height": 900})
        page.on("request", lambda request: requested.append(request.url))
        page.on("dialog", lambda dialog: dialog.accept(TOKEN))
        await page.goto(base_url + "/")
        # selectors, not wait_for_function: the page's CSP forbids the eval its polling needs
        await page.wait_for_selector("#version:text-is('5')")
        await page.wait_for_selector("#accuracy:text-matches('^0\\.850')")
        # the accuracy curve: one line overall and one per class; τ and α bars drawn
        assert await page.locator("#chart-accuracy path").count() == 4
        assert await page.locator("#chart-tau rect").count() > 0
        assert await page.locator("#chart-alpha rect").count() > 0
        assert not await page.is_visible("#privacy-chart")  # DP off: no ε anywhere
        await page.click("#flip-raise-gamma")
        await page.wait_for_selector("#flip-raise-gamma:text('turn off')")
        shot = tmp_path / "dashboard.png"
        await page.screenshot(path=str(shot), full_page=True)
        if os.environ.get("DASHBOARD_SCREENSHOT"):  # to refresh docs/img/dashboard.png
            shutil.copy(shot, os.environ["DASHBOARD_SCREENSHOT"])
    policy = await read_policy(redis, Keys(settings.redis.key_prefix))
    assert policy.gamma == pytest.approx(0.9)
    assert all(url.startswith(base_url) for url in requested), requested  # no outside host
    assert shot.stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed")
@pytest.mark.parametrize("base_url", [False], indirect=True, ids=["closed-reads"])
async def test_dashboard_asks_for_the_token_when_reads_need_it(base_url: str) -> None:
    """With open_reads off every read is 401 without the token: the page asks once, then sends
    `Authorization: Bearer` on its reads and shows the status."""
    requested: list[str] = []
    reads: list[tuple[str, str | None]] = []
    prompts: list[str] = []

    async def answer(dialog: Any) -> None:
        prompts.append(dialog.type)
        await dialog.accept(TOKEN)

    def seen(request: Any) -> None:
        requested.append(request.url)
        if "/v1/" in request.url:
            reads.append((request.url, request.headers.get("authorization")))

    async with chromium() as browser:
        page = await browser.new_page()
        page.on("request", seen)
        page.on("dialog", answer)
        await page.goto(base_url + "/")
        await page.wait_for_selector("#version:text-is('5')")
        await page.wait_for_selector("#accuracy:text-matches('^0\\.850')")
        assert await page.text_content("#error") == ""
    assert prompts == ["prompt"]  # one question for the four concurrent reads
    first_four = {url.removeprefix(base_url).split("?")[0] for url, _ in reads[:4]}
    assert first_four == {"/v1/status", "/v1/switches", "/v1/alerts", "/v1/evaluations"}
    assert all(header is None for _, header in reads[:4])  # nothing stored yet: 401 each
    assert {header for _, header in reads[4:]} == {f"Bearer {TOKEN}"}
    assert all(url.startswith(base_url) for url in requested), requested  # no outside host


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed")
async def test_dashboard_shows_the_privacy_spent_with_dp_on(
    settings: Settings, redis: aioredis.Redis
) -> None:
    """DP on: the ε card shows the ε the budget counts (the newest ledger record's) against the
    budget, lowered at runtime; the ε chart draws a line per accounting model and the budget's.
    (DP off, both stay hidden: the first test.)"""
    policy = type(settings.policy)(
        dp_clip=1.0, dp_population=10, dp_participation=100, privacy_budget=1000.0
    )
    control = settings.control.model_copy(update={"token": TOKEN, "open_reads": True})
    settings = settings.model_copy(update={"control": control, "policy": policy})
    keys = Keys(settings.redis.key_prefix)
    for i in range(5):
        await publish(redis, keys, make_update(f"p{i}", base=0, client=f"device-{i}"))
    await run_aggregator(
        settings, redis=redis, initial=initial_state(settings), handle_signals=False, burst=True
    )
    spent = (await ledger(redis, keys))[-1]["epsilon_conservative"]
    budget = round(1.5 * spent, 3)  # lowered at runtime: close enough to be drawn
    runner = web.AppRunner(create_app(settings, redis, run_rules=False))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as session:
            change = {"changes": {"privacy_budget": budget}, "why": "dashboard test"}
            auth = {"Authorization": f"Bearer {TOKEN}"}
            async with session.patch(f"{base_url}/v1/policy", json=change, headers=auth) as r:
                assert r.status == 200, await r.text()
        async with chromium() as browser:
            page = await browser.new_page(viewport={"width": 1100, "height": 900})
            page.on("dialog", lambda dialog: dialog.accept(TOKEN))
            await page.goto(base_url + "/")
            await page.wait_for_selector(f"#epsilon:text-is('{spent:.2f} / {budget:g}')")
            assert await page.text_content("#epsilon-model") == "conservative"
            # two refreshes make a line each: one per model, and the budget's (flat lines
            # have no height: attached, not "visible")
            third = "#chart-epsilon path:nth-of-type(3)"
            await page.wait_for_selector(third, state="attached")
            assert await page.locator("#chart-epsilon path").count() == 3
            assert await page.is_visible("#privacy-chart")
            legend = await page.text_content("#legend-epsilon") or ""
            assert f"conservative {spent:.2f}" in legend
    finally:
        await runner.cleanup()


@pytest.mark.skipif(CHROMIUM is None, reason="Debian chromium not installed")
async def test_dashboard_lists_the_runs_and_shows_the_one_asked_for(
    base_url: str, settings: Settings, redis: aioredis.Redis
) -> None:
    """`?run=<id>` shows that run (reads and switches under /v1/runs/<id>/), the run list
    links every run, and the default run is left as it was."""
    run = "dash-" + settings.redis.key_prefix[-10:]  # the prefix ends in hex digits
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as session:
        body = {"id": run, "task": {"name": "linear"}}
        async with session.post(f"{base_url}/v1/runs", json=body, headers=auth) as created:
            assert created.status == 201, await created.text()
    mine = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"key_prefix": run})}
    )
    for i in range(2):
        await publish(redis, Keys(run), make_update(f"r{i}", base=0, client="device-r"))
    await run_aggregator(
        mine, redis=redis, initial=initial_state(mine), handle_signals=False, burst=True
    )
    requested: list[str] = []
    async with chromium() as browser:
        page = await browser.new_page()
        page.on("request", lambda request: requested.append(request.url))
        page.on("dialog", lambda dialog: dialog.accept(TOKEN))
        await page.goto(f"{base_url}/?run={run}")
        await page.wait_for_selector("#version:text-is('2')")  # the run's, not the default's 5
        await page.wait_for_selector(f"#run-{run}.on")
        assert await page.locator(f"#run-{settings.redis.key_prefix}").count() == 1
        assert await page.text_content("#run-title") == f" · run {run}"
        await page.click("#flip-raise-gamma")
        await page.wait_for_selector("#flip-raise-gamma:text('turn off')")
    assert (await read_policy(redis, Keys(run))).gamma == pytest.approx(0.9)
    assert (await read_policy(redis, Keys(settings.redis.key_prefix))).gamma == pytest.approx(0.6)
    reads = [url.removeprefix(base_url) for url in requested if "/v1/" in url]
    assert reads
    assert all(path == "/v1/runs" or path.startswith(f"/v1/runs/{run}/") for path in reads), reads
