"""The parts of `fedasync chaos --compose` that need no Docker engine.

The run itself is tests/compose/test_chaos.py (it needs an engine); here: which faults a compose
run can inject, when a Redis restart counts as having kept the commits, what the stack does with
the caller's environment, how the command answers where there is no engine, and what the
failover run (`--ha`) brings up.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fedasync.services.commands.chaos.cli import main
from fedasync.services.commands.chaos.compose.run import COMPOSE, Recovery, Run
from fedasync.services.commands.chaos.compose.stack import Stack, engine_problem, fresh_settings
from fedasync.services.commands.chaos.schedule import PROFILES, FaultKind, build_schedule
from fedasync.services.runtime.settings import RedisSettings
from fedasync.services.stores.acl import users


def test_a_compose_run_refuses_faults_it_cannot_inject(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot inject"):
        Run(tmp_path, tmp_path / "out", 1, profile=PROFILES["fast"])


def test_the_compose_schedule_has_every_kind_asked_for_and_is_seeded() -> None:
    faults = build_schedule(COMPOSE, 1)
    kinds = {f.kind for f in faults}
    assert kinds == {
        FaultKind.KILL_WORKER,
        FaultKind.KILL_AGGREGATOR,
        FaultKind.KILL_REDIS,
        FaultKind.RESTART_SNAPSHOT,
    }
    assert sum(f.kind is FaultKind.KILL_WORKER for f in faults) >= 2
    assert faults == build_schedule(COMPOSE, 1)
    assert all(0 <= f.target < COMPOSE.workers for f in faults)


@pytest.mark.parametrize(
    ("before", "after", "kept"),
    [
        ((10, 12), (10, 12), True),
        ((10, 12), (15, 18), True),
        ((10, 12), (0, 0), False),  # the AOF replay dropped every commit
        ((10, 12), (10, 11), False),  # one ledger record gone
        ((10, 12), None, False),  # the control service never answered again
        (None, None, False),  # nor before the kill: nothing shows the commits were kept
    ],
)
def test_a_redis_restart_keeps_the_commits_when_nothing_is_less(
    before: tuple[int, int] | None, after: tuple[int, int] | None, kept: bool
) -> None:
    recovery = Recovery(1.0, "kill_redis", "redis-1", 42, 0, 1, 3.0, before, after)
    assert recovery.commits_kept is kept


def test_other_faults_have_no_commits_to_keep() -> None:
    assert Recovery(1.0, "kill_worker", "worker-1", 42, 0, 1, 1.0).commits_kept
    assert not Recovery(1.0, "kill_worker", "worker-1", 42, 0, None, None).recovered


def test_the_stack_gets_fresh_secrets_and_none_of_the_callers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FEDASYNC_BUDGET__MAX_UPDATES", "7")
    monkeypatch.setenv("REDIS_PASSWORD_ADMIN", "from-the-shell")
    monkeypatch.setenv("PIP_INDEX_URL", "http://mirror.example/simple")
    settings = fresh_settings(FEDASYNC_WORKER__JOURNAL="/tmp/j")
    expected = {u.password_variable for u in users(RedisSettings().key_prefix)}
    assert expected <= set(settings)
    assert len(settings["FEDASYNC_CONTROL__TOKEN"]) >= 16
    assert settings != fresh_settings(FEDASYNC_WORKER__JOURNAL="/tmp/j")  # fresh each time
    env = Stack(tmp_path, "p", settings).env()
    assert "FEDASYNC_BUDGET__MAX_UPDATES" not in env
    assert env["REDIS_PASSWORD_ADMIN"] == settings["REDIS_PASSWORD_ADMIN"]
    assert env["FEDASYNC_WORKER__JOURNAL"] == "/tmp/j"
    assert env["PIP_INDEX_URL"] == "http://mirror.example/simple"  # build settings pass


def test_no_docker_cli_is_a_reason_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert engine_problem() == "no docker CLI on PATH"


def test_the_command_says_why_it_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["--compose", "--project-dir", str(tmp_path)]) == 2
    assert "no docker-compose.yml in" in capsys.readouterr().err
    (tmp_path / "docker-compose.yml").write_text("services: {}\n")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["--compose", "--project-dir", str(tmp_path)]) == 2
    assert "no docker CLI on PATH" in capsys.readouterr().err


def test_the_chaos_stack_gives_compose_every_password_it_requires() -> None:
    """compose refuses to start without each `${REDIS_PASSWORD_<USER>:?…}`; the merge of the
    Sentinel users once left three of them out of the chaos stack's settings."""
    import re
    from pathlib import Path

    from fedasync.services.commands.chaos.compose.stack import fresh_settings

    text = (Path(__file__).resolve().parents[2] / "docker-compose.yml").read_text()
    required = set(re.findall(r"\$\{(REDIS_PASSWORD_[A-Z]+):\?", text))
    assert len(required) == 10
    assert required <= set(fresh_settings())


def test_options_of_the_process_profiles_are_refused_with_compose(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for option in (["--mode", "memory"], ["--replica-lag-ms", "5"]):
        assert main(["--compose", "--project-dir", str(tmp_path), *option]) == 2
        assert "a compose run takes the stack's own settings" in capsys.readouterr().err


def test_the_failover_run_brings_up_the_ha_profile_under_sentinel(tmp_path: Path) -> None:
    """`--ha`: the compose file's Sentinels, as its comment says to export them, the primary's
    name as docker/redis/sentinel.conf monitors it, and durable mode as asked."""
    import re

    import yaml

    from fedasync.services.commands.chaos.compose.failover import (
        MASTER_NAME,
        REPLICAS,
        SENTINEL_ADDRESSES,
        Failover,
    )

    root = Path(__file__).resolve().parents[2]
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]
    for address in SENTINEL_ADDRESSES.split(","):
        name, port = address.split(":")
        assert compose[name]["profiles"] == ["ha"]
        assert port == "26379"
    for replica in REPLICAS:
        assert compose[replica]["profiles"] == ["ha"]
    assert (
        f"export FEDASYNC_REDIS__SENTINELS={SENTINEL_ADDRESSES}"
        in (root / "docker-compose.yml").read_text()
    )
    conf = (root / "docker" / "redis" / "sentinel.conf").read_text()
    assert re.search(rf"^sentinel monitor {MASTER_NAME} redis 6379 2$", conf, re.MULTILINE)

    for durable in (0, 1):
        env = Failover(tmp_path, tmp_path / "out", durable_replicas=durable).stack.env()
        assert env["COMPOSE_PROFILES"] == "ha"
        assert env["FEDASYNC_REDIS__SENTINELS"] == SENTINEL_ADDRESSES
        assert env["FEDASYNC_REDIS__DURABLE_REPLICAS"] == str(durable)
        assert RedisSettings(sentinels=env["FEDASYNC_REDIS__SENTINELS"]).sentinel_list
    # by default nothing is set: the shipped default, durable mode on with the Sentinels
    env = Failover(tmp_path, tmp_path / "out").stack.env()
    assert "FEDASYNC_REDIS__DURABLE_REPLICAS" not in env
