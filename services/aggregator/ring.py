"""A ring of fixed slots in shared memory: the reader process hands items to the decider.

Single producer (the reader process), single consumer (the deciding process). The aggregator
creates the block and unlinks it; the reader only attaches. Two counters in the header, each
with exactly one writer: `head`, the items published (the reader's), and `tail`, the items
released (the decider's). Item `i` lives in slot `i % slots`:

    header (64 bytes): magic, slots, slot_bytes, head, tail, waiting, mark   (u64 each)
    slot:  seq, meta_len, body_len (u64 each) | meta | body

A writer fills a slot's meta and body, then its slot header, and only then stores `head + 1`,
one aligned 8-byte store (ctypes, not struct: struct packs byte by byte). A writer killed
anywhere before that store has published nothing, so a half-written slot is never exposed: the
consumer never reads at or past `head`. The consumer checks each slot's `seq` against the item
it expects (a mismatch is a bug, raised, never decided) and stores `tail + 1` once it no longer
needs the slot, which is what lets the writer reuse it.

Ordering relies on the stores reaching memory in program order (x86-64's total store order; the
copies and the counter's store are separate C calls, which no compiler reorders). The wake-ups
(pipes, services/aggregator/reader_process.py) carry no data: they only end a wait early, and
every wait is bounded, so a wake-up lost to a race costs latency, never an item.

No pickling: meta is the caller's bytes (msgpack), body is copied from buffers as they are.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
from collections.abc import Sequence
from multiprocessing import shared_memory
from typing import Any

MAGIC = 0x31474E4952414446  # "FDARING1", little-endian
HEADER_BYTES = 64
SLOT_HEADER_BYTES = 24
_MAGIC, _SLOTS, _SLOT_BYTES, _HEAD, _TAIL, _WAITING, _MARK = range(7)

Buffer = bytes | bytearray | memoryview


class RingError(RuntimeError):
    """A ring that is not ours, or a slot that is not the item expected (never decided)."""


class Ring:
    """One shared-memory ring; `create` in the aggregator, `attach` in the reader."""

    def __init__(self, shm: shared_memory.SharedMemory, owner: bool) -> None:
        self._shm = shm
        self._owner = owner
        buf = shm.buf
        assert buf is not None
        self._buf: memoryview = buf
        self._words = [ctypes.c_uint64.from_buffer(buf, 8 * i) for i in range(7)]
        if self._words[_MAGIC].value != MAGIC:
            self._drop_views()
            shm.close()
            raise RingError(f"shared memory {shm.name!r} is not a ring")
        self.slots = int(self._words[_SLOTS].value)
        self.slot_bytes = int(self._words[_SLOT_BYTES].value)
        #: the largest meta + body one slot holds
        self.capacity = self.slot_bytes - SLOT_HEADER_BYTES

    @classmethod
    def create(cls, slots: int, slot_bytes: int) -> Ring:
        """A new ring of `slots` slots of `slot_bytes` each (its header included)."""
        if slots < 1 or slot_bytes <= SLOT_HEADER_BYTES:
            raise ValueError(f"a ring needs slots ≥ 1 and slot_bytes > {SLOT_HEADER_BYTES}")
        slot_bytes = -(-slot_bytes // 8) * 8  # each slot header 8-byte aligned
        shm = shared_memory.SharedMemory(create=True, size=HEADER_BYTES + slots * slot_bytes)
        assert shm.buf is not None
        words = (ctypes.c_uint64 * 7).from_buffer(shm.buf)
        words[_SLOTS], words[_SLOT_BYTES] = slots, slot_bytes
        words[_HEAD] = words[_TAIL] = words[_WAITING] = words[_MARK] = 0
        words[_MAGIC] = MAGIC
        del words
        return cls(shm, owner=True)

    @classmethod
    def attach(cls, name: str) -> Ring:
        """The ring the aggregator made, by its name (the reader's side)."""
        # track=False: the reader must not have the resource tracker unlink the aggregator's
        # block when it exits (it never owned it)
        shm = _attach(name)
        return cls(shm, owner=False)

    @property
    def name(self) -> str:
        return self._shm.name

    # ------------------------------------------------------------------------------ counters
    @property
    def head(self) -> int:
        """Items published so far (written by the writer only)."""
        return int(self._words[_HEAD].value)

    @property
    def tail(self) -> int:
        """Items released so far (written by the consumer only)."""
        return int(self._words[_TAIL].value)

    def free(self) -> int:
        """Slots the writer may fill now."""
        return self.slots - (self.head - self.tail)

    def pending(self) -> int:
        """Items published and not yet released."""
        return self.head - self.tail

    @property
    def waiting(self) -> bool:
        """Whether the writer waits for a slot (so the consumer wakes it after a release)."""
        return bool(self._words[_WAITING].value)

    @waiting.setter
    def waiting(self, value: bool) -> None:
        self._words[_WAITING].value = int(value)

    @property
    def mark(self) -> int:
        """A word the writer sets for the consumer (the reader: 1 + `head` when its last read
        found nothing new, so "caught up" is `mark == head + 1`); 0 until set."""
        return int(self._words[_MARK].value)

    @mark.setter
    def mark(self, value: int) -> None:
        self._words[_MARK].value = value

    # ------------------------------------------------------------------------------ writer
    def fits(self, meta_len: int, body_len: int) -> bool:
        return meta_len + body_len <= self.capacity

    def reserve(self, meta: bytes, body_len: int) -> memoryview:
        """The next slot's body, `body_len` bytes, to fill before `commit`; `meta` is written
        now. Raises RingError when the ring is full or the item does not fit (the caller
        checks `free` and `fits` first)."""
        if self.free() <= 0:
            raise RingError("the ring is full")
        if not self.fits(len(meta), body_len):
            raise RingError(f"{len(meta)} + {body_len} bytes do not fit a slot of {self.capacity}")
        start = self._slot_start(self.head) + SLOT_HEADER_BYTES
        self._buf[start : start + len(meta)] = meta
        self._reserved = (len(meta), body_len)
        body = start + len(meta)
        return self._buf[body : body + body_len]

    def commit(self) -> None:
        """Publish the slot `reserve` gave: its header, then `head + 1` (the one store that
        exposes it)."""
        meta_len, body_len = self._reserved
        head = self.head
        start = self._slot_start(head)
        header = (ctypes.c_uint64 * 3).from_buffer(self._buf, start)
        header[0], header[1], header[2] = head, meta_len, body_len
        del header
        self._words[_HEAD].value = head + 1

    def publish(self, meta: bytes, body: Sequence[Buffer]) -> None:
        """`reserve`, copy each of `body`'s buffers in order, `commit`."""
        views = [memoryview(part).cast("B") for part in body]
        target = self.reserve(meta, sum(v.nbytes for v in views))
        offset = 0
        for view in views:
            target[offset : offset + view.nbytes] = view
            offset += view.nbytes
        target.release()
        self.commit()

    # ------------------------------------------------------------------------------ consumer
    def peek(self) -> tuple[bytes, memoryview] | None:
        """The oldest unreleased item: its meta (a copy) and its body (a view into the slot,
        valid until `release`); None when nothing is published."""
        tail = self.tail
        if tail >= self.head:
            return None
        start = self._slot_start(tail)
        header = (ctypes.c_uint64 * 3).from_buffer(self._buf, start)
        seq, meta_len, body_len = int(header[0]), int(header[1]), int(header[2])
        del header
        if seq != tail or meta_len + body_len > self.capacity:
            raise RingError(f"slot {tail % self.slots} holds item {seq}, expected {tail}")
        meta = start + SLOT_HEADER_BYTES
        body = meta + meta_len
        return bytes(self._buf[meta:body]), self._buf[body : body + body_len]

    def peek_at(self, item: int) -> bytes | None:
        """The meta of published item `item` (the consumer's look at what the ring holds);
        None if it is not published, released, or its slot was reused meanwhile."""
        if not self.tail <= item < self.head:
            return None
        start = self._slot_start(item)
        header = (ctypes.c_uint64 * 3).from_buffer(self._buf, start)
        seq, meta_len = int(header[0]), int(header[1])
        del header
        if seq != item or meta_len > self.capacity:
            return None
        meta = start + SLOT_HEADER_BYTES
        return bytes(self._buf[meta : meta + meta_len])

    def release(self) -> None:
        """The oldest item is no longer needed: its slot is the writer's again."""
        if self.tail >= self.head:
            raise RingError("nothing to release")
        self._words[_TAIL].value = self.tail + 1

    # ------------------------------------------------------------------------------ end
    def close(self) -> None:
        """Detach (and, for the aggregator's ring, unlink: the name goes away)."""
        self._drop_views()
        self._shm.close()
        if self._owner:
            self._shm.unlink()

    def _drop_views(self) -> None:
        # the counters are exports of the block's buffer: it cannot close while they live
        self._words = []

    def _slot_start(self, item: int) -> int:
        return HEADER_BYTES + (item % self.slots) * self.slot_bytes


def wait_for_slot(ring: Ring, wake_fd: int, also: Sequence[int] = (), poll_s: float = 0.05) -> bool:
    """Block the writer until a slot is free (True), or until one of `also` is readable (False:
    the aggregator's pipe at EOF, it is gone). The consumer rings `wake_fd` after a release
    when `waiting` is set; the poll bounds the wait, so a wake-up lost to the race between the
    flag and the counters (each side stores one and loads the other) costs `poll_s`, never a
    slot."""
    while ring.free() <= 0:
        ring.waiting = True
        if ring.free() > 0:
            break
        ready, _, _ = select.select([wake_fd, *also], [], [], poll_s)
        if any(fd in ready for fd in also):
            ring.waiting = False
            return False
        if wake_fd in ready:
            drain(wake_fd)
    ring.waiting = False
    return True


def wake(fd: int) -> None:
    """Ring a doorbell: one byte on a non-blocking pipe (a full pipe already rings)."""
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(fd, b"\0")


def drain(fd: int) -> bool:
    """Empty a doorbell; False once its writer is gone (EOF)."""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return True
        if not chunk:
            return False


def _attach(name: str) -> shared_memory.SharedMemory:
    """Attach without registering with the resource tracker (Python 3.11 has no `track=`): the
    aggregator owns the block; a reader's tracker would unlink it when the reader exits."""
    from multiprocessing import resource_tracker

    register: Any = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register
