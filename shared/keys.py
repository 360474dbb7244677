"""Every Redis name fedasync uses, in one place.

All keys share one hash tag (`{prefix}`), so they live in one slot: the commit script may touch
them together even on a Redis Cluster.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

#: Consumer group of the aggregator on the updates stream.
AGGREGATOR_GROUP = "aggregators"

#: Hash: run id → JSON {created_at, by} of every run created in this deployment (the directory
#: the control API lists and the supervisor follows). Its tag holds a `:`, which no run id may,
#: so no run's keys share its slot; each run's own truth stays in its own slot (`{run}:run`).
REGISTRY = "{fedasync:runs}:index"


def update_digest(client_id: str, update_id: str) -> str:
    """Hex SHA-256 naming one device's update: bounded in length whatever the ids, and the
    same in the ingest marker's name and the receipts index."""
    return hashlib.sha256(f"{client_id}\n{update_id}".encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = "fedasync"

    def _k(self, name: str) -> str:
        return f"{{{self.prefix}}}:{name}"

    @property
    def updates(self) -> str:
        """Stream: one entry per published update, field `m` = the msgpack message."""
        return self._k("updates")

    @property
    def deadletter(self) -> str:
        """Stream: messages that could not be decoded, with the reason."""
        return self._k("deadletter")

    @property
    def ledger(self) -> str:
        """Stream: one entry per decision, field `d` = msgpack of the decision record."""
        return self._k("ledger")

    @property
    def state(self) -> str:
        """String: the aggregation checkpoint of the last commit (fedasync.shared.checkpoint)."""
        return self._k("state")

    @property
    def memory(self) -> str:
        """Hash: client id → its remembered delta (float32 bytes) in the `memory` mode; written
        by the commit for the clients whose delta changed, with the state that names them."""
        return self._k("memory")

    @property
    def genesis(self) -> str:
        """String: the full checkpoint training started from (replayed by `ledger verify`)."""
        return self._k("genesis")

    @property
    def commit_seq(self) -> str:
        """String int: commits made so far; each commit is a compare-and-set on it."""
        return self._k("commit-seq")

    @property
    def epoch(self) -> str:
        """String int: fencing token; a starting aggregator raises it, fencing off older ones."""
        return self._k("aggregator-epoch")

    @property
    def version(self) -> str:
        """String int: the latest committed model version."""
        return self._k("version")

    @property
    def announced(self) -> str:
        """String int: the newest version offered to devices (what the snapshot services
        serve as `latest`). The commit that makes a version sets it, or, in durable mode, the
        aggregator once the replicas hold that commit: it may then lag `version` briefly."""
        return self._k("announced")

    def claim(self, hex_digest: str) -> str:
        """String: one claim-check payload in Redis (stores/claim_check.RedisClaimStore). The
        tag is the payload's SHA-256, not the run, so on a Redis Cluster each payload has its
        own slot and large models spread over every primary; `claim:<run>:` keeps them the
        run's (ACL pattern, retirement by SCAN). Outside the run's slot: never touched by a
        script together with the run's keys."""
        return f"claim:{self.prefix}:{{{hex_digest}}}"

    def model(self, version: int) -> str:
        """String: the model snapshot message of a committed version (immutable)."""
        return self._k(f"model:{version}")

    @property
    def models(self) -> str:
        """Sorted set: versions whose snapshots are kept (score = version)."""
        return self._k("models")

    @property
    def versions_channel(self) -> str:
        """Pub/sub channel: the new version number, published as it is announced."""
        return self._k("versions")

    @property
    def done(self) -> str:
        """Hash: set when training ended (reason, version, at)."""
        return self._k("done")

    @property
    def started(self) -> str:
        """String float: when training started (wall clock), for the time budget.

        Written once the first commit is acknowledged, outside any transaction: commit 0 beside
        it means Redis lost commits (shared/continuity.py)."""
        return self._k("started-at")

    @property
    def run(self) -> str:
        """Hash: what the run is, as its aggregator recorded it: `task` (JSON of the task's name,
        params and seed; set once) and `budget` (JSON of its budget; at each of its starts).
        Read by every process that builds the task, and by control (stores/run_record.py)."""
        return self._k("run")

    @property
    def policy(self) -> str:
        """String: JSON of the policy in force (fedasync.shared.policy.Policy.to_dict)."""
        return self._k("policy")

    @property
    def policies(self) -> str:
        """Hash, append-only (HSETNX): policy version → JSON, every version ever in force (for
        ledger replay)."""
        return self._k("policies")

    @property
    def alerts(self) -> str:
        """Stream: alerts raised by the automatic rules (rule, message, client, at)."""
        return self._k("alerts")

    @property
    def switches(self) -> str:
        """Hash: switch name → JSON {reason, who, at, saved} while the switch is on."""
        return self._k("switches")

    @property
    def evaluations(self) -> str:
        """Stream: one entry per evaluated version, field `e` = JSON of the scores."""
        return self._k("evaluations")

    @property
    def policy_log(self) -> str:
        """List, append-only (RPUSH): one JSON entry per policy change: version, policy, who,
        when (`at`) and why."""
        return self._k("policy-log")

    @property
    def device_keys(self) -> str:
        """Hash: client id → that device's secret key (64 hex); managed by `fedasync devices`."""
        return self._k("device-keys")

    @property
    def device_revoked(self) -> str:
        """Hash: client id → Unix ms of its key's revocation, so a refusal can say `revoked`."""
        return self._k("device-revoked")

    def ingested(self, digest: str) -> str:
        """String: stream entry id + body digest of an update the ingest service accepted.

        `digest` is `update_digest(client id, update id)`, so the name stays bounded.
        """
        return self._k(f"ingested:{digest}")

    @property
    def receipts(self) -> str:
        """Hash: `update_digest(client id, update id)` → the ledger entry id of the first
        decision about that update (the receipt); written by the commit, bounded by
        `receipts_order`."""
        return self._k("receipts")

    @property
    def dedup(self) -> str:
        """Sorted set: the update ids the dedup memory holds, scored by their key (the version
        they are remembered under); the commit adds each batch's and removes those below the
        floor, so the checkpoint does not carry them (shared/dedup.py)."""
        return self._k("dedup")

    @property
    def dp_secret(self) -> str:
        """String: 32 random bytes, the run's differential-privacy noise secret (the core keys
        each server step's Gaussian noise from HMAC-SHA256 of it). Made once per run (SET NX)
        by the aggregator; readable by the aggregator and admin Redis users only, so
        `ledger verify` as admin reproduces the noise and nobody else can subtract it. Never
        copied into the ledger, a checkpoint, a status route or a log."""
        return self._k("dp-secret")

    @property
    def receipts_order(self) -> str:
        """List: the fields of `receipts` in the order they were written; the commit pops the
        oldest beyond FEDASYNC_RECEIPTS__CAPACITY and deletes them from `receipts`."""
        return self._k("receipts-order")
