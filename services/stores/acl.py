"""Redis users with least privilege: which commands on which keys each fedasync process may use.

One place decides every user's rights, read off the code of the process it serves (the commands
each one sends, including those its Lua scripts send: a script runs with the caller's rights, so
the script's own commands must be granted too). `acl_file` renders them as a Redis ACL file
(`redis-server --aclfile`); `fedasync acl` prints it; docs/security.md explains each user.

A user is a list of grants. Each grant allows its commands on its keys only, so a user may, for
example, XADD to the updates stream and SET its markers without being able to SET the stream (a
SET would replace it). The first grant is the user's root permissions; the others become Redis 7
selectors, `(...)`. Key access is full (`~`), read-only (`%R~`) or write-only (`%W~`).

Besides the services, two users serve Redis itself when it runs replicated under Sentinel
(`server_users`): `replica`, which a replica logs in to its primary as (`masteruser`), and
`sentinel`, which the Sentinels log in to every server as (`sentinel auth-user`), each allowed
only the commands replication or Sentinel sends (no key at all). The Sentinels' own users, in
their configuration file (`sentinel_users`, `sentinel_acl`): `sentinel` again, for the Sentinels'
talk among themselves, and `discovery`, which the services ask where the primary is as.

Passwords are never in the generated file unless given: without them each user carries a
placeholder token `${REDIS_PASSWORD_<USER>}`, which Redis refuses to load, so an unrendered file
can never start a server with a known password. docker/redis/entrypoint.sh fills them in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from fedasync.services.runtime.sentinel_channels import SENTINEL_HELLO, SWITCH_MASTER
from fedasync.shared.keys import REGISTRY, Keys

#: passwords go into Redis URLs and ACL lines: URL-unreserved characters only, and long enough
PASSWORD_RE = re.compile(r"[A-Za-z0-9._~-]{16,}")
PASSWORD_ENV_PREFIX = "REDIS_PASSWORD_"


@dataclass(frozen=True, slots=True)
class Grant:
    """Commands allowed on keys: full access (`keys`), read-only (`read`), write-only (`write`)."""

    commands: tuple[str, ...]
    keys: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()

    def rules(self) -> str:
        parts = ["-@all", *(f"+{c}" for c in self.commands)]
        parts += [f"~{k}" for k in self.keys]
        parts += [f"%R~{k}" for k in self.read]
        parts += [f"%W~{k}" for k in self.write]
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class User:
    """One Redis user: who it is for, its root grant, its selectors and pub/sub channels."""

    name: str
    purpose: str
    root: Grant
    selectors: tuple[Grant, ...] = ()
    channels: tuple[str, ...] = ()

    def rules(self) -> str:
        """The user's rights as ACL rules (no `on`, no password)."""
        parts = ["resetchannels", *(f"&{c}" for c in self.channels), self.root.rules()]
        parts += [f"({s.rules()})" for s in self.selectors]
        return " ".join(parts)

    @property
    def password_variable(self) -> str:
        return PASSWORD_ENV_PREFIX + self.name.upper()


def glob_escape(text: str) -> str:
    """`text` matched literally by Redis's glob patterns (keys and channels in ACL rules)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def users(prefix: str) -> tuple[User, ...]:
    """Every fedasync user, for keys under `prefix` (the setting FEDASYNC_REDIS__KEY_PREFIX)."""
    if not prefix or re.search(r"\s", prefix) or not prefix.isprintable():
        raise ValueError(f"key prefix {prefix!r} cannot be written into an ACL rule")
    k = Keys(glob_escape(prefix))
    models = k.model(0).removesuffix("0") + "*"
    device_keys = Grant(("hmget",), read=(k.device_keys, k.device_revoked))
    # appends an alert and can do nothing else to the stream (XADD's MAXLEN trims it at most)
    alert = Grant(("xadd",), write=(k.alerts,))
    # a receipt: the index names a ledger entry, read by its id (fedasync/client/receipt_index.py)
    receipts = (Grant(("hget",), read=(k.receipts,)), Grant(("xrange",), read=(k.ledger,)))
    # what the run is (stores/run_record.py): the task every process builds, the budget
    run_task = Grant(("hget",), read=(k.run,))
    ping = ("ping",)
    return (
        User(
            "aggregator",
            "the single consumer: reads updates, commits state, model, ledger, dead letters",
            Grant(
                (
                    *ping,
                    # start-up: fence, check what the last commit left (the ledger's last
                    # record, the group's position), policy, genesis, restore, take over
                    "get",
                    "set",
                    "incrby",
                    "hsetnx",
                    "xrevrange",
                    "xgroup|create",
                    "xpending",
                    "xclaim",
                    # the loop
                    "xreadgroup",
                    "xtrim",
                    "exists",
                    "xlen",
                    "xinfo|groups",
                    # ... and the lag correction script (stores/backlog.py) it runs
                    "xinfo|stream",
                    "xgroup|setid",
                    # the commit script (EVALSHA, SCRIPT LOAD if not cached) and what it runs
                    "evalsha",
                    "script|load",
                    "zadd",
                    "zrangebyscore",
                    "zremrangebyscore",
                    "del",
                    "xadd",
                    "xack",
                    "hset",
                    "publish",
                    # ... and the receipts index it keeps bounded (HSETNX granted above)
                    "rpush",
                    "llen",
                    "lpop",
                    "hdel",
                    # durable mode: each commit confirmed on the replicas before it is announced
                    "wait",
                ),
                keys=(
                    k.commit_seq,
                    k.epoch,
                    k.state,
                    k.version,
                    k.announced,
                    models,
                    k.models,
                    k.ledger,
                    k.updates,
                    k.deadletter,
                    k.done,
                    k.started,
                    k.genesis,
                    k.policy,
                    k.policies,
                    k.receipts,
                    k.receipts_order,
                    k.dedup,
                    k.memory,
                    # the run's noise secret: made once (SET NX), read at each start
                    k.dp_secret,
                ),
            ),
            (
                device_keys,
                # ingest's markers, read (never written) to take an update whose device's key
                # was rotated after ingest verified it (services/stores/ingest_markers.py)
                Grant(("mget",), read=(k.ingested("*"),)),
                alert,
                # start-up: is the policy log still in an earlier release's format?
                Grant(("type",), read=(k.policy_log,)),
                # restore: the memory mode's per-client deltas (the commit writes them)
                Grant(("hgetall",), read=(k.memory,)),
                # start-up: its task against the run's, then the run's task (once) and budget
                Grant(("hget", "hsetnx", "hset"), keys=(k.run,)),
            ),
            (k.versions_channel,),
        ),
        User(
            "snapshot",
            "serves committed models: reads them, follows new versions, alerts when the version "
            "in Redis goes back",
            Grant(
                (*ping, "get", "mget", "hgetall", "subscribe"),
                read=(k.version, k.announced, k.done, models),
            ),
            (alert,),
            channels=(k.versions_channel,),
        ),
        User(
            "control",
            "policy changes, switches, alerts, status: appends to the policy history, never "
            "rewrites it",
            Grant(
                (*ping, "get", "hgetall", "xrange", "xrevrange", "xlen"),
                read=(k.version, k.done, k.started, k.ledger, k.deadletter, k.evaluations),
            ),
            (
                # the aggregator's budget, against which the budget left is computed
                run_task,
                # the policy compare-and-set script (services/stores/policy_store.py); it runs
                # GET SET on the policy in force, HSETNX on policies, RPUSH on the log, and for a
                # switch flip HGET HSET HDEL on the switches hash: each granted below, no more
                Grant(
                    ("evalsha", "script|load"),
                    keys=(k.policy, k.policies, k.policy_log, k.switches),
                ),
                Grant(("get", "set"), keys=(k.policy,)),
                # the history: add a version, never overwrite one (HSETNX); append to the log,
                # never trim or rewrite it (RPUSH: no XADD, whose MAXLEN trims)
                Grant(("hsetnx",), write=(k.policies,)),
                Grant(("rpush",), write=(k.policy_log,)),
                # ... and read it back, for GET /v1/policy/history (policy_store.policy_log)
                Grant(("lrange",), read=(k.policy_log,)),
                Grant(("hget", "hgetall", "hkeys", "hset", "hdel"), keys=(k.switches,)),
                Grant(("xadd", "xrevrange"), keys=(k.alerts,)),
                # the backlog figures only: never the update payloads
                Grant(("exists", "xlen", "xinfo|groups"), read=(k.updates,)),
                # Redis's memory against maxmemory, for the memory rule (stores/memory.py)
                Grant(("info",)),
                # the directory of runs (stores/runs.py): listed for GET /v1/runs and the
                # rules of each run; an entry added when a run is created (HSETNX, never
                # rewritten)
                Grant(("hkeys", "hsetnx"), keys=(glob_escape(REGISTRY),)),
            ),
        ),
        User(
            "evaluator",
            "appends scores to the evaluations stream, resumes from its newest record, checks "
            "its task against the run's",
            Grant((*ping, "xadd", "xrevrange"), keys=(k.evaluations,)),
            (run_task,),
        ),
        User(
            "ingest",
            "adds authenticated updates once (its script), reads device keys, the policy "
            "(pause-ingest) and receipts",
            # durable mode: WAIT for the replicas before a device hears its update is in
            Grant((*ping, "wait")),
            (
                # its script: the marker, the stream, and the device's stored key (HMGET, granted
                # read-only below: the key it checked the signature with must still be the one)
                Grant(
                    ("evalsha", "script|load"),
                    keys=(k.ingested("*"), k.updates, k.device_keys, k.done),
                ),
                Grant(("get", "set"), keys=(k.ingested("*"),)),
                # the policy (pause-ingest); and for the body limit the newest version and the
                # layout at the head of its model (GETRANGE, services/ingest/body_limit.py)
                Grant(("get",), read=(k.policy, k.version)),
                Grant(("getrange",), read=(models,)),
                # its script deletes the entry it just added when signed outside the window
                Grant(("xadd", "xdel"), write=(k.updates,)),
                # its script takes nothing for a run that finished (the done flag's reason)
                Grant(("hget",), read=(k.done,)),
                device_keys,
                *receipts,
            ),
        ),
        User(
            "worker",
            "a device on a trusted network publishing straight to the stream, reading receipts "
            "and the run's task",
            Grant((*ping, "xadd", "wait"), write=(k.updates,)),
            (*receipts, run_task),
        ),
        User(
            "admin",
            "`fedasync ledger` (read-only audit), `fedasync devices` (keys written, never read) "
            "and `fedasync migrate` (rewrites the policy log once into today's format)",
            # UNWATCH: a migration that finds nothing to convert ends its WATCH without an EXEC
            Grant((*ping, "multi", "exec", "unwatch", "acl|log")),
            (
                # migrate (policy_store.migrate_policy_log): under a WATCH of the policy log, its
                # type and, if an earlier release's stream, its records; then in one transaction
                # the stream deleted and the same records appended to a list
                Grant(("watch", "type", "xrange"), read=(k.policy_log,)),
                Grant(("del", "rpush"), write=(k.policy_log,)),
                # verify reads the last commit's results in one transaction, under a WATCH of
                # what a commit writes (services/stores/committed.py)
                Grant(("watch",), read=(k.commit_seq, k.version, k.state)),
                Grant(("xrevrange",), read=(k.ledger,)),
                Grant(
                    ("xrange", "get", "hget", "hlen", "llen", "hgetall"),
                    read=(
                        k.ledger,
                        k.genesis,
                        k.policies,
                        k.updates,
                        k.version,
                        models,
                        k.receipts,
                        k.receipts_order,
                        # verify compares the committed state and memory with its replay
                        k.state,
                        k.memory,
                    ),
                ),
                # and the dedup ids the commits keep beside the state
                Grant(("zrangebyscore",), read=(k.dedup,)),
                # a DP run's noise secret, to replay its noise bit for bit (no other user but
                # the aggregator may read it)
                Grant(("get",), read=(k.dp_secret,)),
                # the run's recorded task, for a Zeno++ replay's validation gradient
                run_task,
                Grant(("hset", "hdel", "hkeys"), keys=(k.device_keys, k.device_revoked)),
            ),
        ),
    )


#: the user a replica logs in to its primary as (`masteruser`); and Sentinel's, on every server
REPLICA_USER = "replica"
SENTINEL_USER = "sentinel"
#: the Sentinels' user for the services, which only asks where the primary is
DISCOVERY_USER = "discovery"


def server_users() -> tuple[User, ...]:
    """The users of Redis's own processes on the data servers: replication and Sentinel."""
    return (
        User(
            REPLICA_USER,
            "a replica's link to its primary (masteruser/masterauth): the replication handshake",
            Grant(("ping", "replconf", "psync")),
        ),
        User(
            SENTINEL_USER,
            "Sentinel watching and reconfiguring each server: INFO, ROLE and hello messages, "
            "REPLICAOF (as SLAVEOF) with CONFIG REWRITE in a transaction, and CLIENT KILL of the "
            "clients of a demoted primary",
            Grant(
                (
                    "ping",
                    "info",
                    "role",
                    "client|setname",
                    "client|kill",
                    "subscribe",
                    "publish",
                    "multi",
                    "exec",
                    "slaveof",
                    "config|rewrite",
                    "script|kill",
                )
            ),
            channels=(SENTINEL_HELLO,),
        ),
    )


def sentinel_users() -> tuple[User, ...]:
    """The users of the Sentinels themselves (their configuration file: `sentinel_acl`)."""
    return (
        User(
            SENTINEL_USER,
            "one Sentinel asking another: PING, hello messages, the vote on a primary's failure",
            Grant(("ping", "client|setname", "publish", "sentinel|is-master-down-by-addr")),
            channels=(SENTINEL_HELLO,),
        ),
        User(
            DISCOVERY_USER,
            "the services asking where the primary (and its replicas) are, and hearing of a "
            "failover (`+switch-master`), and nothing else",
            Grant(
                (
                    "ping",
                    "sentinel|masters",
                    "sentinel|master",
                    "sentinel|get-master-addr-by-name",
                    "sentinel|slaves",
                    "sentinel|replicas",
                    "subscribe",
                    "unsubscribe",
                )
            ),
            channels=(SWITCH_MASTER,),
        ),
    )


def all_users(prefix: str) -> tuple[User, ...]:
    """Every user of the data servers' ACL file: the services', then replication's and
    Sentinel's."""
    return users(prefix) + server_users()


#: The default user is switched off (nobody can log in as it) but keeps every right. Redis replays
#: its append-only file as the default user, and Redis 7.0 (and 7.2 before redis/redis#14545)
#: re-checks that user's ACL at each EXEC of the replay: with a restricted default user every
#: MULTI/EXEC block in the AOF, which is how a script with several writes (every commit) is
#: logged, is refused and skipped, so a restart silently loses every commit. Off, it cannot be
#: used by a client; with all rights, the replay is allowed.
DEFAULT_USER_LINE = "user default off resetchannels ~* &* +@all"
#: health checks log in as this user (any password) and may only PING
HEALTH_USER = "health"
HEALTH_USER_LINE = f"user {HEALTH_USER} on nopass resetchannels -@all +ping"


def acl_file(prefix: str, passwords: Mapping[str, str] | None = None) -> str:
    """The ACL file: passwords from `passwords` (user → password), else placeholders."""
    lines = [DEFAULT_USER_LINE, HEALTH_USER_LINE]
    lines += [_user_line(user, passwords) for user in all_users(prefix)]
    return "\n".join(lines) + "\n"


#: the Sentinels' default user: off, nobody logs in as it (a Sentinel has no data to replay)
SENTINEL_DEFAULT_LINE = "user default off"


def sentinel_acl(passwords: Mapping[str, str] | None = None) -> str:
    """The `user` lines of a Sentinel's configuration file: passwords from `passwords`, else
    placeholders. Health checks log in as `health`, as on the data servers."""
    lines = [SENTINEL_DEFAULT_LINE, HEALTH_USER_LINE]
    lines += [_user_line(user, passwords) for user in sentinel_users()]
    return "\n".join(lines) + "\n"


def _user_line(user: User, passwords: Mapping[str, str] | None) -> str:
    if passwords is None:
        secret = "${" + user.password_variable + "}"
    else:
        secret = ">" + check_password(user.name, passwords.get(user.name))
    return f"user {user.name} on {secret} {user.rules()}"


def check_password(user: str, password: str | None) -> str:
    if password is None or not PASSWORD_RE.fullmatch(password):
        raise ValueError(
            f"password of Redis user {user}: 16 or more of A-Z a-z 0-9 . _ ~ - "
            "(it goes into a Redis URL)"
        )
    return password


def passwords_from_env(prefix: str, environ: Mapping[str, str]) -> dict[str, str]:
    """User → password from REDIS_PASSWORD_<USER>; every user's must be set and valid."""
    return passwords_of(all_users(prefix), environ)


def passwords_of(among: tuple[User, ...], environ: Mapping[str, str]) -> dict[str, str]:
    """User → password from REDIS_PASSWORD_<USER> for each of `among`, each set and valid."""
    out = {}
    for user in among:
        value = environ.get(user.password_variable)
        if value is None:
            raise ValueError(f"{user.password_variable} is not set")
        out[user.name] = check_password(user.name, value)
    return out


def password_variables(prefix: str) -> list[str]:
    """Every `REDIS_PASSWORD_<USER>` a deployment needs (compose requires each): the data
    servers' users and the Sentinels' (the `sentinel` user is the same on both sides)."""
    names = {u.name: u for u in (*all_users(prefix), *sentinel_users())}
    return [user.password_variable for user in names.values()]
