"""The ledger: every decision the aggregator committed, exported or replayed to prove the model.

`verify` replays the recorded decisions through the core, from the genesis checkpoint, with the
payloads kept in the updates stream (or, once trimmed, in the payload archive) and the policy
version each decision names, and checks that every decision comes out the same and that the
committed model is reproduced bit for bit, that the committed state (dedup memory, buffers, the
client book, the memory's sum, the tiers, the optimizer) is the replay's byte for byte, and so is
every client's remembered delta in `{p}:memory`, and that every receipt still indexed names a
decision about its own update.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import redis.asyncio as aioredis

from fedasync.client.receipt_index import record_at as record_at
from fedasync.services.runtime.redis_conn import as_text, get_bytes, stream_entries
from fedasync.services.stores.archive import ADDRESS_MARK, PayloadArchive
from fedasync.services.stores.claim_check import ClaimError, ClaimSource
from fedasync.services.stores.committed import Committed, read_committed
from fedasync.services.stores.dp_secret import read_secret, uses_dp
from fedasync.services.stores.memory_store import remembered
from fedasync.services.stores.policy_store import every_policy, policy_version
from fedasync.shared import ledger_record, stream_entry
from fedasync.shared.aggregation import PRIVACY_BUDGET, AggregationState
from fedasync.shared.checkpoint import WRITTEN_FORMATS, load_state, save_state
from fedasync.shared.decision import DropReason
from fedasync.shared.device_privacy import RECORD_FIELDS
from fedasync.shared.keys import Keys, update_digest
from fedasync.shared.model_format import decode_model
from fedasync.shared.policy import Policy
from fedasync.shared.wire import WireError, decode_update, unpack

#: a record's fields beside the decision: where and when, and what the device reported of its
#: own DP-SGD (shared/device_privacy.py): the fields the replay does not reproduce
_CONTEXT = ("stream_id", "at", *RECORD_FIELDS.values())


async def records(
    redis: aioredis.Redis,
    keys: Keys,
    page: int = 1000,
    *,
    after: str = "0-0",
    until: str = "+",
) -> AsyncIterator[dict[str, Any]]:
    """Ledger records in commit order, each with its ledger entry id (`ledger_id`).

    The one reader of the ledger stream: export, verify, the run folder and the control
    service's window all go through it. `after` is an exclusive start, so a reader that keeps
    the last `ledger_id` it saw takes in only what was committed since (0-0: from the start);
    `until` an inclusive end (verify stops at the commit it compares with).
    """
    entries = stream_entries(redis, keys.ledger, after=after, until=until, page=page)
    async for entry_id, fields in entries:
        yield ledger_record.decode(entry_id, fields)


async def last_record(redis: aioredis.Redis, keys: Keys) -> dict[str, Any] | None:
    """The newest ledger record (with its `ledger_id`), None for an empty ledger: one XREVRANGE,
    whatever the ledger's length (the aggregator's start-up check reads only this)."""
    entries: Any = await redis.xrevrange(keys.ledger, count=1)
    if not entries:
        return None
    entry_id, fields = entries[0]
    return ledger_record.decode(as_text(entry_id), fields)


def export_line(record: dict[str, Any]) -> str:
    """One record as a line of the export (JSON, keys sorted, so the file diffs cleanly)."""
    return json.dumps(record, sort_keys=True) + "\n"


def write_export(ledger: Iterable[dict[str, Any]], out: TextIO) -> int:
    """Records already read, written as the export; returns the number of records."""
    count = 0
    for record in ledger:
        out.write(export_line(record))
        count += 1
    return count


async def export(redis: aioredis.Redis, keys: Keys, out: TextIO) -> int:
    """Write the ledger as JSON lines, as it is read; returns the number of records."""
    count = 0
    async for record in records(redis, keys):
        out.write(export_line(record))
        count += 1
    return count


@dataclass
class VerifyReport:
    replayed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    mismatches: list[str] = field(default_factory=list)
    version: int = 0
    model_matches: bool = False
    #: the committed state and the memory's deltas equal the replay's, byte for byte
    state_matches: bool = False
    #: clients whose remembered delta was compared (memory mode)
    remembered: int = 0
    #: decisions whose receipt is still indexed (the oldest are forgotten beyond the capacity)
    receipts: int = 0
    #: what was not checked, and why
    notes: list[str] = field(default_factory=list)
    #: no genesis checkpoint under the key prefix: no training to verify (a wrong prefix or
    #: database, more often than lost data)
    nothing_committed: bool = False

    @property
    def ok(self) -> bool:
        return self.model_matches and self.state_matches and not self.mismatches

    def describe(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        verdict = "OK" if self.ok else "FAILED"
        lines = [
            f"ledger verify: {verdict}: {self.replayed} decisions replayed ({counts})",
            f"  committed model version {self.version}: "
            + ("reproduced bit for bit" if self.model_matches else "NOT reproduced"),
            "  committed state: "
            + ("reproduced byte for byte" if self.state_matches else "NOT reproduced")
            + f", {self.remembered} remembered client deltas among it",
            f"  receipts: {self.receipts} indexed, each naming a decision about its own update",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  mismatch: {m}" for m in self.mismatches[:20]]
        return "\n".join(lines)


async def verify(
    redis: aioredis.Redis,
    keys: Keys,
    max_message_bytes: int,
    archive: PayloadArchive | None = None,
    claims: ClaimSource | None = None,
    gradient_at: Callable[[np.ndarray], np.ndarray] | None = None,
) -> VerifyReport:
    """Replay the ledger from genesis and compare decisions and the committed model.

    The replay ends at the last commit as it was when verify began, and is compared with that
    commit's results, read in the same step (services/stores/committed.py): an aggregator that
    goes on committing meanwhile changes neither. A payload no longer in the updates stream is
    read from `archive` (the aggregator's, when it has one: services/stores/archive.py); a
    claim-check update's message from `claims`. A run that ever had differential privacy on is
    replayed with its noise secret (services/stores/dp_secret.py): SecretUnreadable if this
    Redis user may not read it. A run with Zeno++ on (policy `zeno_margin`) replays its scores
    only with `gradient_at`, the aggregator's validation gradient
    (services/aggregator/deciding.py, `zeno_gradient_source`); without it nothing is scored and
    a Zeno++ rejection shows as a mismatch."""
    report = VerifyReport()
    genesis = await get_bytes(redis, keys.genesis)
    if genesis is None:
        report.nothing_committed = True
        report.mismatches.append("no genesis checkpoint: nothing was ever committed")
        return report
    committed = await read_committed(redis, keys)
    # a DP run's noise is drawn from the run's secret: the replay needs it (admin only), any
    # other run never reads it (SecretUnreadable if it cannot)
    dp_on = uses_dp(await every_policy(redis, keys))
    secret = None if dp_on is None else await read_secret(redis, keys, dp_on)
    state = load_state(genesis, dp_secret=secret)
    policies: dict[int, Policy] = {}
    # an empty ledger then: nothing to replay ("0-0" ends the range before its start)
    async for record in records(redis, keys, until=committed.last_ledger_id or "0-0"):
        number = int(record["policy_version"])
        if number not in policies:
            policies[number] = await policy_version(redis, keys, number)
        payload: Any = await redis.xrange(
            keys.updates, min=record["stream_id"], max=record["stream_id"]
        )
        fields = payload[0][1] if payload else None
        raw = stream_entry.message_of(fields)
        address = stream_entry.address_of(fields) if raw is None else None
        if raw is None and address is None and archive is not None:
            raw = archive.read(str(record["stream_id"]))
            if raw is not None and raw.startswith(ADDRESS_MARK):
                address, raw = raw[len(ADDRESS_MARK) :].decode(), None
        if address is not None:
            try:
                if claims is None:
                    raise ClaimError("claim_missing", "no claim-check store given")
                fetched = (await claims.fetch([address]))[address]
                if isinstance(fetched, ClaimError):
                    raise fetched
                raw = fetched
            except ClaimError as exc:
                report.mismatches.append(f"{record['update_id']}: claim check: {exc}")
                break
        if raw is None:
            report.mismatches.append(
                f"{record['update_id']}: payload {record['stream_id']} not kept "
                "(set FEDASYNC_AGGREGATOR__ARCHIVE_DIR, or KEEP_PAYLOADS=true, to audit)"
            )
            break
        # the aggregator closes on its budgets between two updates, which the replay cannot
        # know; the privacy budget the core closes itself, as it decides the update
        closed_here = record["detail"] == PRIVACY_BUDGET
        if record["reason"] == DropReason.CLOSED and state.closed is None and not closed_here:
            state.close(record["detail"])
        update = decode_update(raw, max_message_bytes)
        if gradient_at is not None:
            state.zeno_prepare(policies[number], gradient_at)
        replayed = state.apply(update, policies[number]).to_dict()
        recorded = {k: v for k, v in record.items() if k not in (*_CONTEXT, "ledger_id")}
        if replayed != recorded:
            report.mismatches.append(
                f"{record['ledger_id']}: recorded {recorded}, replayed {replayed}"
            )
        report.replayed += 1
        report.outcomes[record["outcome"]] += 1
        await _check_receipt(redis, keys, record, report)
    indexed, ordered = committed.receipts_indexed, committed.receipts_ordered
    if indexed != ordered:
        report.mismatches.append(f"receipts: {indexed} indexed but {ordered} in their order list")
    report.version = committed.version
    if committed.model is None:
        report.mismatches.append(f"model {report.version} is not kept")
        return report
    model = decode_model(committed.model, max_bytes=len(committed.model)).snapshot
    report.model_matches = state.version == model.version and np.array_equal(
        state.weights_view().view(np.uint32), model.weights.view(np.uint32)
    )
    _check_state(committed, state, report)
    return report


def _check_state(committed: Committed, state: AggregationState, report: VerifyReport) -> None:
    """The committed checkpoint and `{p}:memory` against the replay's, byte for byte.

    A budget of time can close training after the last decision (no record says so): the
    replay is closed the same way before comparing, the one thing it cannot know.
    """
    raw = committed.state
    if raw is None:
        report.mismatches.append("no committed state")
        return
    try:
        saved = unpack(raw, max_bytes=len(raw))
        closed, written_by = saved.get("closed"), saved.get("format")
    except (WireError, AttributeError):
        report.mismatches.append("the committed state is not a checkpoint")
        return
    if written_by not in WRITTEN_FORMATS:  # an earlier build's checkpoint has other fields
        report.state_matches = True
        report.notes.append(f"committed state in checkpoint format {written_by}: not compared")
        return
    if closed is not None and state.closed is None:
        state.close(str(closed))
    # the aggregator keeps the dedup ids by increments in `{p}:dedup`, not in the checkpoint
    ids_apart = saved.get("dedup", {}).get("ids") is None
    matches = (
        save_state(
            state, include_weights=False, include_dedup_ids=not ids_apart, include_memory=False
        )
        == raw
    )
    if not matches:
        report.mismatches.append("the committed state differs from the replay's")
    if ids_apart and sorted(committed.dedup_ids) != sorted(state.dedup.items()):
        report.mismatches.append("the dedup memory's ids differ from the replay's")
        matches = False
    memory, replayed = committed.memory, remembered(state)
    report.remembered = len(replayed)
    for client in sorted(set(memory) | set(replayed)):
        if memory.get(client) != replayed.get(client):
            report.mismatches.append(f"the remembered delta of client {client!r} differs")
            matches = False
    report.state_matches = matches


async def _check_receipt(
    redis: aioredis.Redis, keys: Keys, record: dict[str, Any], report: VerifyReport
) -> None:
    """The receipt of a record's update, if still indexed, names a ledger record of that same
    update: this one (its first decision) or, for a re-decided update, another of its own."""
    client_id, update_id = str(record["client_id"]), str(record["update_id"])
    named: Any = await redis.hget(keys.receipts, update_digest(client_id, update_id))
    if named is None:
        return  # forgotten, oldest first, beyond FEDASYNC_RECEIPTS__CAPACITY (or never written)
    ledger_id = as_text(named)
    if ledger_id == record["ledger_id"]:
        report.receipts += 1
        return
    other = await record_at(redis, keys, ledger_id)
    if other is None or not ledger_record.is_about(other, client_id, update_id):
        report.mismatches.append(
            f"{record['ledger_id']}: the receipt of {client_id}/{update_id} names {ledger_id}, "
            "a decision about another update"
        )
