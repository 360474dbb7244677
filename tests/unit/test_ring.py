"""The reader's shared-memory ring: order, wrap-around, back-pressure, a writer killed mid-slot."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from fedasync.services.aggregator.ring import Ring, RingError, drain, wait_for_slot, wake


@pytest.fixture
def ring() -> Iterator[Ring]:
    made = Ring.create(slots=4, slot_bytes=256)
    try:
        yield made
    finally:
        made.close()


def take(ring: Ring) -> tuple[bytes, bytes]:
    item = ring.peek()
    assert item is not None
    meta, body = item[0], bytes(item[1])
    item[1].release()
    ring.release()
    return meta, body


def test_items_come_out_in_the_order_they_were_published(ring: Ring) -> None:
    for i in range(4):
        ring.publish(f"m{i}".encode(), [bytes([i]) * 10, b"tail"])
    assert [take(ring) for _ in range(4)] == [
        (f"m{i}".encode(), bytes([i]) * 10 + b"tail") for i in range(4)
    ]
    assert ring.peek() is None


def test_slots_are_reused_round_the_ring(ring: Ring) -> None:
    out = []
    for i in range(23):  # nearly six times round 4 slots, 3 in flight at a time
        ring.publish(str(i).encode(), [os.urandom(i % 7) + bytes([i])])
        if ring.pending() == 3:
            out.append(take(ring)[0])
    while ring.pending():
        out.append(take(ring)[0])
    assert out == [str(i).encode() for i in range(23)]
    assert (ring.head, ring.tail) == (23, 23)


def test_a_full_ring_refuses_and_an_item_larger_than_a_slot_does_not_fit(ring: Ring) -> None:
    for i in range(4):
        ring.publish(b"m", [bytes([i])])
    with pytest.raises(RingError, match="full"):
        ring.publish(b"m", [b"x"])
    take(ring)
    assert not ring.fits(1, ring.capacity)
    with pytest.raises(RingError, match="do not fit"):
        ring.publish(b"m", [b"x" * ring.capacity])


def test_a_full_ring_blocks_the_writer_until_the_consumer_releases_a_slot(ring: Ring) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    published: list[int] = []

    def writer() -> None:
        for i in range(5):
            assert wait_for_slot(ring, wake_r)
            ring.publish(str(i).encode(), [b"x"])
            published.append(i)

    thread = threading.Thread(target=writer)
    thread.start()
    deadline = time.monotonic() + 30
    while not ring.waiting:  # the writer says it waits (a condition, not a time)
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert published == [0, 1, 2, 3]  # blocked on the fifth: four slots
    assert ring.head == 4
    assert take(ring)[0] == b"0"
    wake(wake_w)
    thread.join(30)
    assert not thread.is_alive()
    assert published == [0, 1, 2, 3, 4]
    assert [take(ring)[0] for _ in range(4)] == [b"1", b"2", b"3", b"4"]
    os.close(wake_r)
    os.close(wake_w)


def test_a_blocked_writer_gives_up_when_its_parent_pipe_closes(ring: Ring) -> None:
    for _ in range(4):
        ring.publish(b"m", [b"x"])
    wake_r, wake_w = os.pipe()
    parent_r, parent_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.close(parent_w)  # the parent is gone: its end is closed
    assert wait_for_slot(ring, wake_r, also=[parent_r]) is False
    assert not drain(parent_r)
    for fd in (wake_r, wake_w, parent_r):
        os.close(fd)


def _write_then_die(name: str) -> None:
    """Publish item 0, then fill half of item 1's slot and die by SIGKILL before its commit."""
    ring = Ring.attach(name)
    ring.publish(b"whole", [b"A" * 100])
    body = ring.reserve(b"half", 100)
    body[:50] = b"B" * 50
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_writer_killed_mid_slot_never_exposes_the_half_written_slot(ring: Ring) -> None:
    child = multiprocessing.get_context("spawn").Process(target=_write_then_die, args=(ring.name,))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL  # the kill happened
    # the half-written slot is in memory (the write happened) but not published
    assert b"half" + b"B" * 50 in ring._buf.tobytes()
    assert ring.head == 1
    assert take(ring) == (b"whole", b"A" * 100)
    assert ring.peek() is None
    # a new writer carries on from head: the half-written slot is overwritten whole
    ring2 = Ring.attach(ring.name)
    ring2.publish(b"next", [b"C" * 60])
    ring2.close()
    assert take(ring) == (b"next", b"C" * 60)
    assert ring.peek() is None


def test_memory_that_is_not_a_ring_is_refused() -> None:
    from multiprocessing import shared_memory

    block = shared_memory.SharedMemory(create=True, size=128)
    try:
        with pytest.raises(RingError, match="not a ring"):
            Ring.attach(block.name)
    finally:
        block.close()
        block.unlink()
