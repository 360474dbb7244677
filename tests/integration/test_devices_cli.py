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
