"""The ACL generator and `fedasync acl`: one rule set per user, placeholders or real passwords.

Whether Redis accepts the rules, and what they allow and refuse, is shown against a real server in
tests/integration/test_acl.py; here, what the generator writes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fedasync.services.commands.cli import main
from fedasync.services.runtime.sentinel_channels import SENTINEL_HELLO, SWITCH_MASTER
from fedasync.services.stores.acl import (
    DISCOVERY_USER,
    PASSWORD_RE,
    acl_file,
    all_users,
    sentinel_acl,
    sentinel_users,
    server_users,
    users,
)
from fedasync.shared.keys import REGISTRY

USERS = ["aggregator", "snapshot", "control", "evaluator", "ingest", "worker", "admin"]
#: Redis's own users on the data servers (replication, Sentinel), after the services'
SERVER_USERS = ["replica", "sentinel"]
FILE_USERS = USERS + SERVER_USERS


def acl_rules(prefix: str) -> dict[str, str]:
    """User name → its ACL rules (without `on` and password), as the file writes them."""
    return {user.name: user.rules() for user in users(prefix)}


def test_every_user_starts_from_nothing_and_names_only_keys_under_its_prefix() -> None:
    """... its claim-check payloads (`claim:<prefix>:{*}`), and the directory of runs, which
    control lists and adds to and the aggregator adds its run to (`register` at start)."""
    rules = acl_rules("p")
    assert list(rules) == USERS
    for name, rule in rules.items():
        words = rule.split()
        assert words[0] == "resetchannels", name
        assert "-@all" in words, name
        assert "+@all" not in words, name
        patterns = [w.split("~", 1)[1].rstrip(")") for w in words if "~" in w]
        assert patterns, name
        directory = [p for p in patterns if p == REGISTRY]
        assert directory == ([REGISTRY] if name in ("control", "aggregator") else []), name
        claims = [p for p in patterns if p.startswith("claim:")]
        assert claims == (["claim:p:{*}"] if name in ("aggregator", "worker") else []), name
        others = [p for p in patterns if p != REGISTRY and not p.startswith("claim:")]
        assert all(p.startswith("{p}:") for p in others), name
        channels = [w[1:] for w in words if w.startswith("&")]
        assert channels in ([], ["{p}:versions"]), name


def test_for_all_runs_every_pattern_matches_any_run_and_nothing_names_the_prefix() -> None:
    """`{*}:...` in place of `{p}:...`, the same grants otherwise, plus the supervisor."""
    one = {u.name: u.rules() for u in users("p")}
    every = {u.name: u.rules() for u in users("p", all_runs=True)}
    assert list(every) == [*USERS, "supervisor"]
    for name, rule in every.items():
        assert "{p}" not in rule, name
        assert "claim:p:" not in rule, name
        if name not in ("supervisor", "admin", "control", "snapshot", "ingest"):
            # only the run checks, run creation and retirement are new for many runs
            assert rule == one[name].replace("{p}", "{*}").replace("claim:p:", "claim:*:"), name
    # a run id has no glob character and no braces, so `{*}` is exactly "a run's tag"
    assert "~{*}:state" in every["aggregator"].split()
    assert "&{*}:versions" in every["snapshot"].split()


def test_the_supervisor_only_reads_the_directory_and_each_runs_spec_and_status() -> None:
    supervisor = next(u for u in users("p", all_runs=True) if u.name == "supervisor")
    assert supervisor.rules() == (
        "resetchannels -@all +ping (-@all +hkeys %R~{fedasync:runs}:index) "
        "(-@all +hget %R~{*}:run) (-@all +exists %R~{*}:done) "
        "(-@all +get %R~{*}:version %R~{*}:policy)"
    )


def test_retiring_is_admin_only_and_only_with_every_run() -> None:
    """DEL of any run key, SCAN, HDEL of the directory: `runs retire`, as admin."""
    for all_runs in (False, True):
        rules = {u.name: u.rules() for u in users("p", all_runs=all_runs)}
        deleting = [n for n, r in rules.items() if "%W~{*}:*" in r.split()]
        scanning = [n for n, r in rules.items() if "+scan)" in r.split()]
        assert deleting == scanning == (["admin"] if all_runs else []), all_runs
    admin = next(u for u in users("p", all_runs=True) if u.name == "admin").rules()
    assert "(-@all +del %W~{*}:* %W~claim:*:{*})" in admin
    assert "(-@all +hdel %W~{fedasync:runs}:index)" in admin


def test_on_a_cluster_every_user_may_learn_the_slot_map_and_nothing_more() -> None:
    plain = {u.name: u.rules() for u in users("p", all_runs=True)}
    clustered = {u.name: u.rules() for u in users("p", all_runs=True, cluster=True)}
    assert list(clustered) == list(plain)
    extra = " +cluster|slots +command +asking"
    for name, rule in clustered.items():
        root = plain[name].split(" (", 1)
        # the cluster client's commands join the root grant, whose keys stay as they were
        words = root[0].split()
        first_key = next((i for i, w in enumerate(words) if "~" in w), len(words))
        expected = " ".join(words[:first_key]) + extra
        if first_key < len(words):
            expected += " " + " ".join(words[first_key:])
        if len(root) > 1:
            expected += " (" + root[1]
        assert rule == expected, name


def test_the_cluster_file_has_cluster_admin_and_no_sentinel_user() -> None:
    names = [u.name for u in all_users("p", cluster=True)]
    assert names[-2:] == ["replica", "cluster-admin"]
    assert "sentinel" not in names
    admin = next(u for u in server_users(cluster=True) if u.name == "cluster-admin")
    assert not [w for w in admin.rules().split() if "~" in w]  # no key at all
    assert admin.password_variable == "REDIS_PASSWORD_CLUSTER_ADMIN"  # a shell name


def test_only_the_aggregator_may_publish_and_only_it_and_snapshot_have_a_channel() -> None:
    rules = acl_rules("p")
    assert [n for n, r in rules.items() if "+publish" in r.split()] == ["aggregator"]
    assert [n for n, r in rules.items() if "&" in r] == ["aggregator", "snapshot"]


def test_glob_characters_of_the_prefix_are_matched_literally() -> None:
    assert "~{a\\*b\\[1\\]}:state" in acl_rules("a*b[1]")["aggregator"].split()


@pytest.mark.parametrize("prefix", ["", "two words", "tab\there", "new\nline"])
def test_a_prefix_that_cannot_be_written_into_a_rule_is_refused(prefix: str) -> None:
    with pytest.raises(ValueError, match="cannot be written"):
        acl_rules(prefix)


def test_the_file_has_placeholders_or_the_passwords_given() -> None:
    lines = acl_file("p").splitlines()
    # the default user is off (no login) but keeps every right, so Redis 7.0's AOF replay, which
    # runs as that user and re-checks its ACL at each EXEC, is allowed (issue 12, item 0)
    assert lines[0] == "user default off resetchannels ~* &* +@all"
    assert lines[1] == "user health on nopass resetchannels -@all +ping"
    assert [line.split()[3] for line in lines[2:]] == [
        "${REDIS_PASSWORD_" + name.upper() + "}" for name in FILE_USERS
    ]
    passwords = {name: f"{name}-password-0123" for name in FILE_USERS}
    filled = acl_file("p", passwords).splitlines()
    assert [line.split()[3] for line in filled[2:]] == [">" + passwords[n] for n in FILE_USERS]
    with pytest.raises(ValueError, match="password of Redis user worker"):
        acl_file("p", passwords | {"worker": "has@at-0123456789"})


def test_cli_prints_the_file_for_a_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acl", "--prefix", "q"]) == 0
    assert capsys.readouterr().out == acl_file("q")
    assert main(["acl", "--all-runs", "--cluster"]) == 0
    assert capsys.readouterr().out == acl_file("fedasync", all_runs=True, cluster=True)


@pytest.mark.parametrize(
    ("name", "options"),
    [("users.acl", []), ("users-cluster.acl", ["--all-runs", "--cluster"])],
)
def test_each_committed_acl_file_is_what_the_command_prints(
    name: str,
    options: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in [v for v in os.environ if v.startswith("FEDASYNC_")]:
        monkeypatch.delenv(variable)
    assert main(["acl", *options]) == 0
    committed = (Path(__file__).resolve().parents[2] / "docker" / "redis" / name).read_text()
    assert committed == capsys.readouterr().out, f"run: fedasync acl {' '.join(options)} > {name}"


def test_cli_takes_passwords_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for user in all_users("q"):
        monkeypatch.setenv(user.password_variable, f"{user.name}-from-env-0123")
    assert main(["acl", "--prefix", "q", "--passwords-from-env"]) == 0
    expected = {name: f"{name}-from-env-0123" for name in FILE_USERS}
    assert capsys.readouterr().out == acl_file("q", expected)
    monkeypatch.delenv("REDIS_PASSWORD_ADMIN")
    assert main(["acl", "--prefix", "q", "--passwords-from-env"]) == 2
    assert "REDIS_PASSWORD_ADMIN is not set" in capsys.readouterr().err


def test_cli_makes_new_passwords_for_an_env_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["acl", "--prefix", "q", "--new-passwords"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split("=", 1)[0] for line in lines]
    values = [line.split("=", 1)[1] for line in lines]
    # the Sentinels' discovery user too; `sentinel` is one user on servers and Sentinels alike;
    # and the users of the cluster and runs profiles: one .env for every profile
    every = [*FILE_USERS, "discovery", "supervisor", "cluster_admin"]
    assert names == ["REDIS_PASSWORD_" + name.upper() for name in every]
    assert all(PASSWORD_RE.fullmatch(v) for v in values)
    assert len(set(values)) == len(values)


def test_replication_and_sentinel_users_name_no_key_and_only_the_sentinels_channels() -> None:
    """The hello channel for Redis's own processes, the failover announcement for the
    services' `discovery`, nothing else."""
    for user in (*server_users(), *sentinel_users()):
        words = user.rules().split()
        assert words[0] == "resetchannels", user.name
        assert "-@all" in words, user.name
        assert not [w for w in words if "~" in w], user.name  # no key at all
        channels = [w[1:] for w in words if w.startswith("&")]
        wanted = [SWITCH_MASTER] if user.name == DISCOVERY_USER else [SENTINEL_HELLO]
        assert channels in ([], wanted), user.name


def test_a_replica_may_only_run_the_replication_handshake() -> None:
    replica = next(u for u in server_users() if u.name == "replica")
    assert replica.rules() == "resetchannels -@all +ping +replconf +psync"


def test_the_services_may_only_ask_the_sentinels_where_the_primary_is_and_hear_a_switch() -> None:
    discovery = next(u for u in sentinel_users() if u.name == "discovery")
    allowed = {w[1:] for w in discovery.rules().split() if w.startswith("+")}
    assert allowed == {
        "ping",
        "sentinel|masters",
        "sentinel|master",
        "sentinel|get-master-addr-by-name",
        "sentinel|slaves",
        "sentinel|replicas",
        "subscribe",
        "unsubscribe",
    }
    assert discovery.channels == (SWITCH_MASTER,)
    assert not any(c in allowed for c in ("sentinel|failover", "sentinel|set", "sentinel"))


def test_the_sentinel_file_has_placeholders_or_the_passwords_given(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = sentinel_acl().splitlines()
    assert lines[0] == "user default off"  # nobody logs in to a Sentinel without a user
    assert lines[1] == "user health on nopass resetchannels -@all +ping"
    assert [line.split()[1:4] for line in lines[2:]] == [
        ["sentinel", "on", "${REDIS_PASSWORD_SENTINEL}"],
        ["discovery", "on", "${REDIS_PASSWORD_DISCOVERY}"],
    ]
    assert main(["acl", "--sentinel"]) == 0
    assert capsys.readouterr().out == sentinel_acl()
    for user in sentinel_users():
        monkeypatch.setenv(user.password_variable, f"{user.name}-from-env-0123")
    assert main(["acl", "--sentinel", "--passwords-from-env"]) == 0
    expected = {u.name: f"{u.name}-from-env-0123" for u in sentinel_users()}
    assert capsys.readouterr().out == sentinel_acl(expected)
