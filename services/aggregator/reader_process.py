"""The reader process: reads the updates stream, prepares each entry, hands it over in order.

Process mode (`aggregator.reader = "process"`): this process does the XREADGROUP (RESP parsed
by hiredis), the finding, signature checks and msgpack decoding (services/aggregator/
preparing.py) and publishes each prepared entry into a shared-memory ring
(services/aggregator/ring.py) that the deciding process consumes (services/aggregator/feed.py).
So the reading and the deciding each hold a GIL of their own.

It only reads: it never acknowledges (the commit does, for what it decided) and never claims.
Within one run of this process the ids it publishes strictly increase: its own pending entries
first, from "0", then new ones (">"); after a read whose reply was lost it re-reads from "0" and
skips what it already published. It dies with the aggregator: it watches a pipe whose other end
only the aggregator holds (EOF: the aggregator is gone, killed or fenced off) and its parent's
pid, between reads and while it waits for a free slot.

Items: a prepared entry (`Ready`: the update's small fields in msgpack, its weights' bytes as they
are, then the message's dead-letter prefix, or the whole message when archiving; `Refused`: the
dead letter), `SPILL` (an entry too large for a slot: the decider fetches and prepares it
itself). When a read of new entries finds none, the reader sets the ring's mark to 1 + head
("caught up"): what an empty read tells the one-process loop, which the decider may ask again
and again (a batch ends, the next begins) while nothing new arrives.

Kept light (no torch: tests/unit/test_reader_imports.py): it is started with the spawn method
and imports only this module's dependencies.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from fedasync.services.aggregator.preparing import Prepared, Preparer, Ready, Refused
from fedasync.services.aggregator.reader import Entry, Reader
from fedasync.services.aggregator.ring import Ring, wait_for_slot, wake
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings
from fedasync.services.stores.claim_check import claim_source
from fedasync.services.stores.device_keys import KeyCache
from fedasync.services.stores.ingest_markers import IngestMarkers
from fedasync.shared.keys import Keys
from fedasync.shared.update import Update
from fedasync.shared.wire import DTYPES

log = logging.getLogger("fedasync.services.aggregator.reader_process")

READY, REFUSED, SPILL = range(3)
#: room in a slot for an item's small fields (ids, metrics, shape), beyond its bytes
META_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Spill:
    """An entry whose prepared form does not fit a slot: decided from Redis by the decider."""

    stream_id: bytes


Item = Prepared | Spill


def slot_bytes(settings: Settings, size: int, archiving: bool) -> int:
    """A slot's size from the model's layout (`size` float parameters): float32 weights (a
    float16 update takes half), the dead-letter prefix, the small fields; when payloads are
    archived, the whole message too (about the weights' size)."""
    weights = size * 4
    kept = weights + META_BYTES if archiving else settings.aggregator.deadletter_payload_bytes
    return weights + kept + META_BYTES


def encode(item: Item, archiving: bool, keep: int) -> tuple[bytes, list[Any]]:
    """An item as the ring carries it: msgpack of its small fields, and its buffers."""
    if isinstance(item, Spill):
        return msgpack.packb([SPILL, item.stream_id]), []
    if isinstance(item, Refused):
        meta = [REFUSED, item.stream_id, item.reason, item.detail, item.warning]
        return msgpack.packb([*meta, item.authenticated]), [item.payload]
    update = item.update
    weights = np.ascontiguousarray(update.weights)
    raw = memoryview(item.raw) if archiving else memoryview(item.raw)[:keep]
    meta = [
        READY,
        item.stream_id,
        update.update_id,
        update.client_id,
        update.base_version,
        update.num_samples,
        update.created_at,
        dict(update.metrics),
        weights.dtype.name,
        list(weights.shape),
        weights.nbytes,
        item.address,
        item.authenticated,
    ]
    return msgpack.packb(meta), [weights.reshape(-1).data.cast("B"), raw]


def decode(meta: bytes, body: memoryview) -> Item:
    """An item out of its slot, copied (the slot is released right after)."""
    fields = msgpack.unpackb(meta)
    kind = fields[0]
    if kind == SPILL:
        return Spill(fields[1])
    if kind == REFUSED:
        _, stream_id, reason, detail, warning, authenticated = fields
        return Refused(stream_id, reason, detail, bytes(body), warning, authenticated)
    (_, stream_id, update_id, client_id, base, samples, created, metrics, dtype, shape, n) = fields[
        :11
    ]
    address, authenticated = fields[11], fields[12]
    weights = np.frombuffer(body, dtype=DTYPES[dtype], count=n // DTYPES[dtype].itemsize)
    weights = weights.reshape(shape).copy()
    weights.flags.writeable = False  # as decode_update gives it: read-only
    update = Update(update_id, client_id, base, samples, weights, created, metrics)
    return Ready(stream_id, update, bytes(body[n:]), address, authenticated)


def publish(ring: Ring, item: Item, archiving: bool, keep: int) -> None:
    """Into the next slot (the caller waited for one); as a `Spill` if it does not fit."""
    meta, body = encode(item, archiving, keep)
    if not ring.fits(len(meta), sum(memoryview(b).nbytes for b in body)):
        meta, body = encode(Spill(item.stream_id), archiving, keep)
    ring.publish(meta, body)


def id_key(stream_id: bytes) -> tuple[int, int]:
    """A stream id's order: (milliseconds, sequence)."""
    ms, _, seq = stream_id.partition(b"-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True, slots=True)
class Pipes:
    """The reader's ends: it rings `data` after publishing, waits on `space` when the ring is
    full, and `parent` reaches EOF when the aggregator is gone."""

    data: int
    space: int
    parent: int


def main(settings: Settings, ring_name: str, pipes: Any, archiving: bool, parent_pid: int) -> None:
    """The process's entry (spawn): `pipes` are multiprocessing connections, used as fds."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s reader %(levelname)s %(message)s")
    fds = Pipes(*(conn.fileno() for conn in pipes))
    for fd in (fds.data, fds.space, fds.parent):
        os.set_blocking(fd, False)
    ring = Ring.attach(ring_name)
    try:
        asyncio.run(serve(settings, ring, fds, archiving, parent_pid))
    finally:
        ring.close()


def parent_alive(fds: Pipes, parent_pid: int) -> bool:
    if os.getppid() != parent_pid:
        return False
    ready, _, _ = select.select([fds.parent], [], [], 0)
    return not ready  # readable only at EOF: the aggregator never writes to it


async def serve(
    settings: Settings, ring: Ring, fds: Pipes, archiving: bool, parent_pid: int
) -> None:
    """Read, prepare, publish, until the aggregator is gone."""
    redis = connect(settings.redis)
    keys = Keys(settings.redis.key_prefix)
    cfg, wire = settings.aggregator, settings.wire
    reader = Reader(redis, keys, settings)
    preparer = Preparer(
        settings,
        KeyCache(redis, keys, settings.auth.key_refresh_s),
        IngestMarkers(redis, keys),
        claim_source(wire.claim_check_store, wire.claim_check_dir, redis, keys.prefix),
    )
    keep = cfg.deadletter_payload_bytes
    last: tuple[int, int] | None = None  # the last id published
    try:
        while parent_alive(fds, parent_pid):
            if not wait_for_slot(ring, fds.space, also=[fds.parent]):
                return
            if reader.reread_pending:  # a read's reply was lost: what it delivered is pending
                reader.reread_backlog()
            backlog = reader.in_backlog
            caught_up = ring.mark == ring.head + 1
            block = cfg.block_ms if caught_up and not backlog else None
            count = min(cfg.read_count, ring.free())
            entries: list[Entry] = await reader.read_once(count, block, None)
            if backlog and not entries:
                reader.backlog_done()
                continue
            fresh = [e for e in entries if last is None or id_key(e[0]) > last]
            if not fresh:
                if not backlog and not caught_up:
                    ring.mark = ring.head + 1
                    wake(fds.data)
                continue
            prepared, _ = await preparer.prepare(fresh, None)
            for item in prepared:
                publish(ring, item, archiving, keep)
            last = id_key(fresh[-1][0])
            wake(fds.data)
    finally:
        await redis.aclose()
