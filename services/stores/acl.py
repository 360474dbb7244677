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
from dataclasses import dataclass, replace

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
        """`REDIS_PASSWORD_<USER>`, the name a shell variable can have (`-` as `_`)."""
        return PASSWORD_ENV_PREFIX + self.name.upper().replace("-", "_")


def glob_escape(text: str) -> str:
    """`text` matched literally by Redis's glob patterns (keys and channels in ACL rules)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


#: the hash tag that matches every run's keys (`{*}:state`, ...): run ids hold no glob character
#: and no `{}` (shared/runs.py RUN_ID), so `*` inside the braces matches exactly the runs' tags
ALL_RUNS = "*"

#: what redis-py's cluster client sends besides a command's own (redis/asyncio/cluster.py): CLUSTER
#: SLOTS to learn the slot map (at its first command and after every connection error), a bare
#: COMMAND to learn where each command's keys are (and COMMAND GETKEYS for those whose keys move,
#: such as XREADGROUP), and ASKING before a command redirected while a slot migrates
CLUSTER_CLIENT = ("cluster|slots", "command", "asking")


def users(prefix: str, *, all_runs: bool = False, cluster: bool = False) -> tuple[User, ...]:
    """Every fedasync user, for keys under `prefix` (the setting FEDASYNC_REDIS__KEY_PREFIX);
    with `all_runs`, for the keys of every run (`{*}:...`, whatever `prefix`), plus the
    supervisor, which follows them all; with `cluster`, each user may also send what a Redis
    Cluster client sends (`CLUSTER_CLIENT`)."""
    if not prefix or re.search(r"\s", prefix) or not prefix.isprintable():
        raise ValueError(f"key prefix {prefix!r} cannot be written into an ACL rule")
    made = _users(ALL_RUNS if all_runs else glob_escape(prefix), all_runs)
    if not cluster:
        return made
    return tuple(with_cluster_client(user) for user in made)


def with_cluster_client(user: User) -> User:
    """`user`, allowed what a cluster client sends besides its commands (CLUSTER_CLIENT)."""
    return replace(user, root=replace(user.root, commands=user.root.commands + CLUSTER_CLIENT))


def _users(tag: str, all_runs: bool) -> tuple[User, ...]:
    """The users for keys under the hash tag `tag` (a glob pattern: an escaped prefix, or
    ALL_RUNS)."""
    k = Keys(tag)
    registry = glob_escape(REGISTRY)
    # a run's claim-check payloads (stores/claim_check.RedisClaimStore: `claim:<run>:{<hex>}`)
    claims = k.claim("*")
    models = k.model(0).removesuffix("0") + "*"
    device_keys = Grant(("hmget",), read=(k.device_keys, k.device_revoked))
    # appends an alert and can do nothing else to the stream (XADD's MAXLEN trims it at most)
    alert = Grant(("xadd",), write=(k.alerts,))
    # a receipt: the index names a ledger entry, read by its id (fedasync/client/receipt_index.py)
    receipts = (Grant(("hget",), read=(k.receipts,)), Grant(("xrange",), read=(k.ledger,)))
    # what the run is (stores/run_record.py): the task every process builds, the budget
    run_task = Grant(("hget",), read=(k.run,))
    # whether a run other than the default exists (stores/runs.run_exists: EXISTS on its
    # record), as ingest, snapshot and control ask it before serving it
    # (runtime/run_routes.KnownRuns) and `devices add --run` before adding a key: only for
    # every run's users (for one prefix there is no other run to ask about)
    run_known = (Grant(("exists",), read=(k.run,)),) if all_runs else ()
    ping = ("ping",)
    made = (
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
                # start-up: its run in the directory of runs (stores/runs.register: HSETNX, the
                # first entry stays), so a run whose entry was lost is listed again
                Grant(("hsetnx",), keys=(registry,)),
                # claim-check payloads in Redis (stores/claim_check.RedisClaimStore.fetch: MGET,
                # one per node on a cluster), read and never written
                Grant(("mget",), read=(claims,)),
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
            (alert, *run_known),
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
                Grant(("hkeys", "hsetnx"), keys=(registry,)),
                # where a run stands (stores/runs.run_status: EXISTS done, GET version, GET
                # policy), for GET /v1/runs[/{run}]
                Grant(("exists",), read=(k.done,)),
                # a run created (stores/runs.create_run: its spec, HSETNX, never rewritten)
                *((Grant(("hsetnx",), keys=(k.run,)),) if all_runs else ()),
                *run_known,
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
                *run_known,
            ),
        ),
        User(
            "worker",
            "a device on a trusted network publishing straight to the stream, reading receipts "
            "and the run's task",
            Grant((*ping, "xadd", "wait"), write=(k.updates,)),
            (
                *receipts,
                run_task,
                # a publisher with the claim-check store in Redis puts each payload before the
                # XADD that names it (stores/claim_check.RedisClaimStore.put: SET NX), never
                # reading or deleting one
                Grant(("set",), write=(claims,)),
            ),
        ),
        User(
            "admin",
            "`fedasync ledger` (read-only audit), `fedasync export` (a model version, read-only), "
            "`fedasync devices` (keys written, never read) "
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
                # `fedasync export`: the version served as latest, and for a version not kept
                # the ones that are (services/commands/export_cli.py)
                Grant(("get",), read=(k.announced,)),
                Grant(("zrangebyscore",), read=(k.models,)),
                Grant(("hset", "hdel", "hkeys"), keys=(k.device_keys, k.device_revoked)),
                # `devices add --run R` checks that R exists (stores/runs.run_exists)
                *run_known,
            ),
        ),
    )
    if not all_runs:
        return made
    admin = made[-1]
    every_key = k.run.removesuffix("run") + "*"  # `{*}:*`: any key of any run
    retire = (
        # `runs retire` (stores/runs.retire_run): where the run stands, and whether its policy
        # stopped it, first; then SCAN for its keys (on its slot's primary on a cluster) and
        # the claim payloads (on every primary), DEL them, and HDEL its directory entry. SCAN
        # names no key (the ACL cannot limit its MATCH), so it may list every key's name
        Grant(("scan",)),
        Grant(("exists",), read=(k.done,)),
        Grant(("get",), read=(k.policy,)),
        Grant(("del",), write=(every_key, claims)),
        Grant(("hdel",), write=(registry,)),
    )
    supervisor = User(
        "supervisor",
        "follows the directory of runs and where each run stands, to keep each active run's "
        "processes running; reads, never writes",
        Grant((*ping,)),
        (
            Grant(("hkeys",), read=(registry,)),
            # each run's spec (stores/runs.read_spec) and status (run_status)
            Grant(("hget",), read=(k.run,)),
            Grant(("exists",), read=(k.done,)),
            Grant(("get",), read=(k.version, k.policy)),
        ),
    )
    return (*made[:-1], replace(admin, selectors=admin.selectors + retire), supervisor)


#: the user a replica logs in to its primary as (`masteruser`); and Sentinel's, on every server
REPLICA_USER = "replica"
SENTINEL_USER = "sentinel"
#: the Sentinels' user for the services, which only asks where the primary is
DISCOVERY_USER = "discovery"


#: the user `redis-cli --cluster create` (and an operator's other `--cluster` commands) runs as
CLUSTER_ADMIN_USER = "cluster-admin"


def server_users(*, cluster: bool = False) -> tuple[User, ...]:
    """The users of Redis's own processes on the data servers: replication and Sentinel; with
    `cluster`, the cluster's making (`cluster-admin`), and Sentinel's user is left out (a
    cluster fails over by itself)."""
    replica = User(
        REPLICA_USER,
        "a replica's link to its primary (masteruser/masterauth): the replication handshake",
        Grant(("ping", "replconf", "psync")),
    )
    if cluster:
        return (replica, _cluster_admin())
    return (
        replica,
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


def _cluster_admin() -> User:
    """What `redis-cli --cluster create` sends to every node, no more: read off the nodes'
    command statistics around a create by redis-cli 7.0, and proven by making the cluster under
    this file (tests/integration/test_cluster_acl.py). No key at all."""
    return User(
        CLUSTER_ADMIN_USER,
        "makes the cluster (`redis-cli --cluster create`): asks each node about itself and "
        "the cluster, assigns slots and epochs, introduces the nodes, names each replica's "
        "primary",
        Grant(
            (
                "info",
                "cluster|info",
                "cluster|nodes",
                "cluster|addslots",
                "cluster|set-config-epoch",
                "cluster|meet",
                "cluster|replicate",
            )
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


def all_users(prefix: str, *, all_runs: bool = False, cluster: bool = False) -> tuple[User, ...]:
    """Every user of the data servers' ACL file: the services', then Redis's own (replication,
    and Sentinel's or the cluster's making). `all_runs`, `cluster`: as `users` takes them."""
    return users(prefix, all_runs=all_runs, cluster=cluster) + server_users(cluster=cluster)


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


def acl_file(
    prefix: str,
    passwords: Mapping[str, str] | None = None,
    *,
    all_runs: bool = False,
    cluster: bool = False,
) -> str:
    """The ACL file: passwords from `passwords` (user → password), else placeholders; for every
    run (`all_runs`) and a Redis Cluster's nodes (`cluster`) if asked (`users`)."""
    lines = [DEFAULT_USER_LINE, HEALTH_USER_LINE]
    among = all_users(prefix, all_runs=all_runs, cluster=cluster)
    lines += [_user_line(user, passwords) for user in among]
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


def passwords_from_env(
    prefix: str, environ: Mapping[str, str], *, all_runs: bool = False, cluster: bool = False
) -> dict[str, str]:
    """User → password from REDIS_PASSWORD_<USER>; every user's must be set and valid."""
    return passwords_of(all_users(prefix, all_runs=all_runs, cluster=cluster), environ)


def passwords_of(among: tuple[User, ...], environ: Mapping[str, str]) -> dict[str, str]:
    """User → password from REDIS_PASSWORD_<USER> for each of `among`, each set and valid."""
    out = {}
    for user in among:
        value = environ.get(user.password_variable)
        if value is None:
            raise ValueError(f"{user.password_variable} is not set")
        out[user.name] = check_password(user.name, value)
    return out


def password_variables(prefix: str, *, all_runs: bool = False, cluster: bool = False) -> list[str]:
    """Every `REDIS_PASSWORD_<USER>` a deployment needs (compose requires each): the data
    servers' users and the Sentinels' (the `sentinel` user is the same on both sides); on a
    cluster, which has no Sentinels, the data servers' only."""
    servers = all_users(prefix, all_runs=all_runs, cluster=cluster)
    names = {u.name: u for u in (*servers, *(() if cluster else sentinel_users()))}
    return [user.password_variable for user in names.values()]
