"""What the aggregator finds in Redis at start, read cheaply and checked before anything is decided.

The reads cost the same whatever the run's length: GETs of the commit sequence, the version, the
state and that version's model (the restore needs them anyway), XLEN and the last entry of the
ledger, XINFO GROUPS of the updates stream, EXISTS of the training's start time; and the dedup
memory's ids, bounded by its capacity, which the restore needs too. They run after
the epoch was raised, when no older aggregator's commit can land any more, so they see one
commit's state, not two halves. shared/continuity.py decides whether the values agree; a
disagreement is a StateMismatch and the aggregator refuses to go on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from fedasync.services.runtime.redis_conn import as_text, get_bytes
from fedasync.services.stores.committed import dedup_ids
from fedasync.services.stores.ledger import last_record
from fedasync.services.stores.memory_store import read_memory
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import load_state, saved_version
from fedasync.shared.continuity import Found, GroupPosition, Mismatch
from fedasync.shared.keys import AGGREGATOR_GROUP, Keys
from fedasync.shared.model_format import decode_model


class StateMismatch(RuntimeError):
    """The state in Redis contradicts its ledger or consumer group (Redis lost writes): the
    aggregator refuses to decide anything from it (exit code 4, docs/operations.md)."""

    def __init__(self, problems: list[Mismatch]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class Inspection:
    found: Found
    raw_state: bytes | None
    raw_model: bytes | None
    #: the memory mode's per-client deltas (`{p}:memory`), client id → bytes
    memory: dict[str, bytes]
    #: the dedup memory's ids as the commits left them, (id, key)
    dedup_ids: list[tuple[str, int]] = field(default_factory=list)

    def restore(self, *, dp_secret: bytes | None = None) -> AggregationState:
        """The state of the last commit, with the weights of its model, the dedup ids and the
        clients' remembered deltas the commits keep beside it (call only once `found` passed the
        checks: then all exist).

        A checkpoint written before the ids moved out of it still carries them; those are
        used, and journaled so that the next commit moves them into the sorted set. `dp_secret`
        is the run's noise secret (never in a checkpoint: services/stores/dp_secret.py)."""
        if self.raw_state is None or self.raw_model is None:
            raise RuntimeError("no committed state to restore")
        model = decode_model(self.raw_model, max_bytes=len(self.raw_model))
        state = load_state(
            self.raw_state,
            weights=model.snapshot.weights,
            dedup_ids=self.dedup_ids,
            memory_deltas=self.memory,
            dp_secret=dp_secret,
        )
        state.dedup.keep_journal(with_current=not self.dedup_ids and len(state.dedup) > 0)
        return state


async def inspect(redis: aioredis.Redis, keys: Keys) -> Inspection:
    """Read what the last commit left (see the module's docstring for the cost)."""
    seq = int(await get_bytes(redis, keys.commit_seq) or 0)
    raw_version = await get_bytes(redis, keys.version)
    version = None if raw_version is None else int(raw_version)
    raw_state = await get_bytes(redis, keys.state)
    raw_model = None if version is None else await get_bytes(redis, keys.model(version))
    last = await last_record(redis, keys)
    found = Found(
        commit_seq=seq,
        state_version=None if raw_state is None else saved_version(raw_state),
        version=version,
        model_kept=raw_model is not None,
        ledger_length=int(await redis.xlen(keys.ledger)),
        last_decision_version=None if last is None else int(last["version"]),
        last_decision_entry=None if last is None else str(last["stream_id"]),
        group=await group_position(redis, keys),
        started=bool(await redis.exists(keys.started)),
    )
    return Inspection(
        found,
        raw_state,
        raw_model,
        await read_memory(redis, keys),
        [] if raw_state is None else await dedup_ids(redis, keys),
    )


async def group_position(redis: aioredis.Redis, keys: Keys) -> GroupPosition | None:
    """The aggregator group's position on the updates stream; None if stream or group is absent."""
    try:
        groups: Any = await redis.xinfo_groups(keys.updates)
    except ResponseError as exc:
        if "no such key" in str(exc).lower():
            return None
        raise
    for group in groups:
        if as_text(group["name"]) == AGGREGATOR_GROUP:
            read = group.get("entries-read")
            return GroupPosition(
                as_text(group["last-delivered-id"]),
                None if read is None else int(read),
                int(group["pending"]),
            )
    return None
