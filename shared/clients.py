"""What the server remembers about each client: the book the fairness modes keep.

FedAsync and FedBuff forget a client the moment its update is decided. The three modes that keep a
slow client's data in the model (shared/modes/: `memory`, `tiered`, `fedbuff-fair`) need
something per client between its updates: its latest delta (memory), the staleness of its latest
update, which ranks it into a latency tier (tiered), how often it contributed (fedbuff-fair).

The book is bounded two ways, both deterministic (no clock: the core has none), so a restored
aggregator and `ledger verify` forget exactly the clients the original forgot:

- `memory_clients`: at most this many clients; a new client beyond it pushes out the one heard
  from least recently;
- `memory_idle`: a client not heard from for more than this many server steps is forgotten (a
  device that left the fleet must not steer the model for ever).

Entries are kept in the order they were last heard from (a dict re-inserted on every update), so
the least recently heard is always the first and an idle check looks at the head only.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class ClientEntry:
    """One client as the server last heard from it."""

    #: num_samples of its latest applied update (its weight in the memory's average)
    samples: int
    #: the model version when its latest update was decided (how long it has been silent)
    seen: int
    #: updates of this client applied while it has been in the book
    arrivals: int
    #: τ of its latest applied update, in server steps (its latency, for the tiers)
    tau: int
    #: memory mode: s(τ)·Δ of its latest update, float32, read-only; None otherwise
    delta: np.ndarray | None = None


class ClientBook:
    """Clients by id, least recently heard first; also ranked by their latest τ."""

    def __init__(self) -> None:
        self._entries: dict[str, ClientEntry] = {}
        #: (τ, client id) of every entry, sorted: a client's latency rank is its position here
        self._by_tau: list[tuple[int, str]] = []
        #: Σ arrivals over the entries (fedbuff-fair's total contribution count)
        self.arrivals = 0
        #: entries holding a delta (memory mode): the memory is this × parameters × 4 bytes
        self.deltas = 0
        #: clients whose delta was set or removed since the last `take_changes()` (not state:
        #: it tells a store which per-client records to write; see services/aggregator)
        self._changed: set[str] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, client: object) -> bool:
        return client in self._entries

    def get(self, client: str) -> ClientEntry | None:
        return self._entries.get(client)

    def items(self) -> Iterator[tuple[str, ClientEntry]]:
        """Entries, least recently heard first (the order a checkpoint keeps)."""
        return iter(list(self._entries.items()))

    def heard(self, client: str, *, samples: int, seen: int, tau: int) -> ClientEntry:
        """Record an applied update of `client`; it becomes the most recently heard."""
        entry = self._entries.pop(client, None)
        if entry is None:
            entry = ClientEntry(samples, seen, 0, tau)
        else:
            self._by_tau.remove((entry.tau, client))
        entry.samples, entry.seen, entry.tau = samples, seen, tau
        entry.arrivals += 1
        self.arrivals += 1
        self._entries[client] = entry
        bisect.insort(self._by_tau, (tau, client))
        return entry

    def set_delta(self, client: str, delta: np.ndarray | None) -> None:
        entry = self._entries[client]
        self.deltas += (delta is not None) - (entry.delta is not None)
        entry.delta = delta
        self._changed.add(client)

    def oldest(self) -> tuple[str, ClientEntry] | None:
        """The least recently heard client, or None for an empty book."""
        for item in self._entries.items():
            return item
        return None

    def forget(self, client: str) -> ClientEntry:
        entry = self._entries.pop(client)
        self._by_tau.remove((entry.tau, client))
        self.arrivals -= entry.arrivals
        if entry.delta is not None:
            self.deltas -= 1
            self._changed.add(client)
        return entry

    def rank(self, client: str) -> int:
        """How many clients have a smaller latest τ (ties broken by id): 0 is the fastest."""
        entry = self._entries[client]
        return bisect.bisect_left(self._by_tau, (entry.tau, client))

    def tier(self, client: str, tiers: int) -> int:
        """Equal-count latency tiers by rank: 0 the fastest, `tiers` − 1 the slowest."""
        return min(tiers - 1, self.rank(client) * tiers // len(self._entries))

    def take_changes(self) -> set[str]:
        """Clients whose delta changed (set, replaced or forgotten) since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def restore(self, client: str, entry: ClientEntry) -> None:
        """Append an entry read from a checkpoint (in the checkpoint's order)."""
        self._entries[client] = entry
        bisect.insort(self._by_tau, (entry.tau, client))
        self.arrivals += entry.arrivals
        self.deltas += entry.delta is not None
