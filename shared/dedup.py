"""Bounded memory of which updates have been decided, so none is decided twice.

An id is remembered under the version it was trained from (or the version at decision time, if
that is older, as for a forged base from the future). Ids are forgotten once that key falls below
the *floor*; any update trained from a version below the floor is too stale for every valid policy
and is dropped without looking it up, so forgetting never lets an update be applied twice.
The floor is `version − horizon`, raised further when more than `capacity` ids are held, which
bounds memory even if the version stalls while updates keep arriving.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedasync.shared.params import TAU_MAX_LIMIT

#: Versions of ids kept by default; at least TAU_MAX_LIMIT so that "beyond the horizon" implies
#: "stale under any policy".
DEFAULT_HORIZON = 4 * TAU_MAX_LIMIT
#: Ids held at most by default (about 100 bytes each in memory).
DEFAULT_CAPACITY = 500_000


class DedupMemory:
    """Decided update ids, grouped by key so that whole versions can be forgotten at once."""

    __slots__ = ("_buckets", "_floor", "_journal", "_key_of", "capacity", "horizon")

    def __init__(self, horizon: int = DEFAULT_HORIZON, capacity: int = DEFAULT_CAPACITY) -> None:
        if horizon < TAU_MAX_LIMIT:
            raise ValueError(f"dedup horizon must be at least {TAU_MAX_LIMIT}, got {horizon}")
        if capacity < 1:
            raise ValueError(f"dedup capacity must be at least 1, got {capacity}")
        self.horizon = horizon
        self.capacity = capacity
        self._floor = 0
        self._key_of: dict[str, int] = {}
        self._buckets: dict[int, list[str]] = {}
        #: ids remembered since the last `drain`, once `keep_journal` was called
        self._journal: list[tuple[str, int]] | None = None

    def keep_journal(self, *, with_current: bool = False) -> None:
        """Record every id remembered from now on, for a store kept in step by increments (the
        aggregator's commit adds them and forgets below the floor, instead of saving the whole
        memory each time); `with_current` starts the journal with what is held already."""
        self._journal = list(self._key_of.items()) if with_current else []

    def drain(self) -> list[tuple[str, int]]:
        """(id, key) remembered since the last drain, oldest first; some may be below the floor
        already (forgotten in the same step), which the store forgets along with the rest."""
        if self._journal is None:
            return []
        drained, self._journal = self._journal, []
        return drained

    @property
    def floor(self) -> int:
        """Updates trained from a version below this are beyond the horizon."""
        return self._floor

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, update_id: str) -> bool:
        return update_id in self._key_of

    def remember(self, update_id: str, key: int) -> None:
        """Record a decided id; `key` must be at or above the floor."""
        self._key_of[update_id] = key
        self._buckets.setdefault(key, []).append(update_id)
        if self._journal is not None:
            self._journal.append((update_id, key))
        while len(self._key_of) > self.capacity:
            self._forget_below(min(self._buckets) + 1)

    def advance(self, version: int) -> None:
        """The model reached `version`: forget what is now beyond the horizon."""
        self._forget_below(version - self.horizon)

    def _forget_below(self, floor: int) -> None:
        if floor <= self._floor:
            return
        if floor - self._floor > len(self._buckets):
            stale = [k for k in self._buckets if k < floor]
        else:
            stale = [k for k in range(self._floor, floor) if k in self._buckets]
        for key in stale:
            for update_id in self._buckets.pop(key):
                del self._key_of[update_id]
        self._floor = floor

    def items(self) -> Iterable[tuple[str, int]]:
        """(id, key) pairs in insertion order, for saving."""
        return self._key_of.items()

    @classmethod
    def restore(
        cls, horizon: int, capacity: int, floor: int, items: Iterable[tuple[str, int]]
    ) -> DedupMemory:
        memory = cls(horizon, capacity)
        memory._floor = floor
        for update_id, key in items:
            memory._key_of[update_id] = key
            memory._buckets.setdefault(key, []).append(update_id)
        return memory
