"""`fedasync devices` against a real Redis: a revoke that revoked nothing is not a success."""

from __future__ import annotations

import pytest

from fedasync.services.commands.cli import main

pytestmark = pytest.mark.integration


@pytest.mark.usefixtures("redis_url")
def test_revoking_a_device_that_has_a_key_succeeds_and_a_typo_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["devices", "add", "phone-17"]) == 0
    capsys.readouterr()
    assert main(["devices", "revoke", "phone-71"]) == 1  # a typo: phone-17 keeps its key
    [line] = capsys.readouterr().err.splitlines()
    assert "'phone-71' had no key, so no device lost one" in line
    assert main(["devices", "list"]) == 0
    listed = capsys.readouterr().out
    assert '"phone-17": "active"' in listed
    assert main(["devices", "revoke", "phone-17"]) == 0
    assert capsys.readouterr().out == "phone-17: revoked\n"


def test_devices_add_issues_a_distinct_key_per_run_and_refuses_an_unknown_run(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio

    import redis.asyncio as aioredis

    from fedasync.services.stores.runs import create_run
    from fedasync.shared.keys import Keys
    from fedasync.shared.runs import RunSpec

    async def stored(run: str) -> str | None:
        client = aioredis.Redis.from_url(redis_url)
        try:
            for made in ("run-a", "run-b"):
                await create_run(client, RunSpec(made))
            raw = await client.hget(Keys(run).device_keys, "phone-3")
            return None if raw is None else raw.decode()
        finally:
            await client.aclose()

    assert asyncio.run(stored("run-a")) is None  # makes the runs
    assert (
        main(["devices", "add", "phone-3", "--kind", "hmac", "--run", "run-a", "--run", "run-b"])
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    issued = dict(line.split(" ") for line in lines)
    assert sorted(issued) == ["run-a", "run-b"]
    assert issued["run-a"] != issued["run-b"]  # a distinct key per run
    assert asyncio.run(stored("run-a")) == issued["run-a"]
    assert asyncio.run(stored("run-b")) == issued["run-b"]
    assert asyncio.run(stored("fedasync")) is None  # not in the default run

    assert main(["devices", "add", "phone-4", "--run", "no-such-run"]) == 2
    assert "no run 'no-such-run' in this deployment" in capsys.readouterr().err
    assert main(["devices", "add", "phone-4", "--run", "Not A Run"]) == 2
    assert "is not a run id" in capsys.readouterr().err
    assert main(["devices", "revoke", "phone-3", "--run", "run-b"]) == 0
    assert capsys.readouterr().out == "phone-3: revoked\n"
    assert asyncio.run(stored("run-b")) is None
    assert asyncio.run(stored("run-a")) == issued["run-a"]
