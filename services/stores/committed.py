"""What the last commit left, read in one step, so that an audit of a running system is honest.

`ledger verify` compares the replay of the ledger with the committed model, state, dedup ids,
memory and receipts. Read one by one while the aggregator commits, they may belong to different
commits: a ledger read before a commit and a state read after it disagree, and verify would call
a sound system broken. So every one of them, with the id of the newest ledger entry (the replay's
end), is read in one MULTI under a WATCH of what every commit writes: the EXEC either sees one
commit's results, or is refused because a commit landed between the WATCH and the EXEC, and the
read starts again. A commit is one Lua script (services/aggregator/commit.py), which Redis never
interleaves with a transaction, so no half-written commit can be seen either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from fedasync.services.runtime.redis_conn import as_text
from fedasync.shared.keys import Keys

#: tries before giving up on a system that commits faster than one transaction round trip
ATTEMPTS = 100


class CommitsTooFast(RuntimeError):
    """Every attempt to read one commit's results was overtaken by the next commit."""


@dataclass(frozen=True, slots=True)
class Committed:
    """One commit's results, as verify compares them with its replay."""

    #: the newest ledger entry's id (the replay stops there); None for an empty ledger
    last_ledger_id: str | None
    version: int
    #: the model snapshot of `version`; None if it is not kept
    model: bytes | None
    state: bytes | None
    #: the dedup memory's ids, (id, key)
    dedup_ids: list[tuple[str, int]]
    #: the memory mode's per-client deltas, client id → float32 bytes
    memory: dict[str, bytes]
    receipts_indexed: int
    receipts_ordered: int


async def dedup_ids(redis: aioredis.Redis, keys: Keys) -> list[tuple[str, int]]:
    """The dedup memory's ids as the commits left them in `{p}:dedup`, (id, key)."""
    return dedup_ids_from(await redis.zrangebyscore(keys.dedup, "-inf", "+inf", withscores=True))


def dedup_ids_from(reply: Any) -> list[tuple[str, int]]:
    """A `ZRANGEBYSCORE {p}:dedup -inf +inf WITHSCORES` reply as (id, key) pairs."""
    return [(as_text(i), int(k)) for i, k in reply]


def memory_from(reply: Any) -> dict[str, bytes]:
    """An `HGETALL {p}:memory` reply as client id → delta bytes."""
    return {as_text(client): bytes(delta) for client, delta in reply.items()}


async def read_committed(redis: aioredis.Redis, keys: Keys, attempts: int = ATTEMPTS) -> Committed:
    """The last commit's results, all from the same commit (see the module's docstring)."""
    async with redis.pipeline(transaction=True) as pipe:
        for _ in range(attempts):
            try:
                # every commit rewrites the sequence number; the version and state are watched
                # too, for the writes that happen outside a commit (the first start's genesis)
                await pipe.watch(keys.commit_seq, keys.version, keys.state)
                raw_version: Any = await pipe.get(keys.version)
                version = int(raw_version or 0)
                pipe.multi()  # type: ignore[no-untyped-call]
                pipe.xrevrange(keys.ledger, count=1)
                pipe.get(keys.model(version))
                pipe.get(keys.state)
                pipe.zrangebyscore(keys.dedup, "-inf", "+inf", withscores=True)
                pipe.hgetall(keys.memory)
                pipe.hlen(keys.receipts)
                pipe.llen(keys.receipts_order)
                last, model, state, dedup, memory, indexed, ordered = await pipe.execute()
            except WatchError:
                continue
            return Committed(
                last_ledger_id=as_text(last[0][0]) if last else None,
                version=version,
                model=model,
                state=state,
                dedup_ids=dedup_ids_from(dedup),
                memory=memory_from(memory),
                receipts_indexed=int(indexed),
                receipts_ordered=int(ordered),
            )
    raise CommitsTooFast(
        f"{attempts} reads of the last commit were each overtaken by a newer commit; "
        "run the audit when the aggregator is idle or stopped"
    )
