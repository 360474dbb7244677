"""Save and restore the whole aggregation state as bytes.

Restoring a saved state and continuing must be indistinguishable from never having stopped: the
aggregator commits this after each batch, the simulator can pause and resume with it, and the
property tests check the equality bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.clients import ClientEntry
from fedasync.shared.dedup import DedupMemory
from fedasync.shared.layout import Layout
from fedasync.shared.modes.holdings import FedBuffBuffer, Tier
from fedasync.shared.policy import ServerOptimizer
from fedasync.shared.privacy.spent import PrivacySpent
from fedasync.shared.robust import Kept, RuleSpec
from fedasync.shared.server_optimizer import OptimizerState
from fedasync.shared.wire import WireError, pack, unpack
from fedasync.shared.zeno import ValidationGradient

#: 2 added FedBuff's server optimizer state; a build that cannot step it must not restore it.
#: Format 1 (no optimizer state) is still read: its FedBuff versions were numbered per update,
#: and go on one per server step from there (`base_weights` in shared/modes/delta.py finds their
#: models).
#: 3 added the client book, the memory and the tiers (modes memory, tiered, fedbuff-fair) and
#: the buffer's weight sum; formats 1 and 2 are read with all of them empty. A format-3 checkpoint
#: may also leave the dedup ids to the caller (`"ids": None`, the aggregator's sorted set).
#: 4 added two sections, each present only when it holds something: a robust rule's buffered
#: updates (policy `robust`, shared/robust.py: the buffer's rule and each update's id, weight and
#: contribution), and privacy (shared/privacy/spent.py: what a DP run has spent, the adaptive
#: clip). A state with neither is still written as format 3, byte for byte as before: a format-3
#: build restores it faithfully, and must refuse one it would step with the mean or could not
#: account privacy for. Zeno++'s validation gradient (`zeno`) may be in either format: a build
#: without it restores the rest and computes the gradient afresh.
FORMAT_VERSION = 4
_PLAIN_FORMAT = 3
_READABLE = (1, 2, _PLAIN_FORMAT, FORMAT_VERSION)
#: the formats this build writes (a replay's checkpoint compares byte for byte with these)
WRITTEN_FORMATS = (_PLAIN_FORMAT, FORMAT_VERSION)
_F32 = np.dtype("<f4")
_F64 = np.dtype("<f8")


class CheckpointError(ValueError):
    """Bytes that are not a checkpoint this build can restore."""


class MemoryMissing(CheckpointError):
    """The checkpoint names a client's remembered delta that the caller did not hand back."""


def save_state(
    state: AggregationState,
    *,
    include_weights: bool = True,
    include_dedup_ids: bool = True,
    include_memory: bool = True,
) -> bytes:
    """Everything `apply` depends on, in a deterministic byte string.

    `include_weights=False` leaves out the current weights, for a store that already keeps them
    (the aggregator's model snapshot of the same version); pass them back to load_state.
    `include_dedup_ids=False` leaves out the remembered update ids (their floor, horizon and
    capacity stay), for a store that keeps them by increments (the aggregator's commit); pass
    them back to load_state as `dedup_ids`.
    `include_memory=False` leaves out the clients' remembered deltas (memory mode), for a store
    that keeps them per client (the aggregator's `{p}:memory` hash); each client entry still
    says whether it has one, and load_state wants them back (`memory_deltas`).
    """
    buffer = state.buffer
    memory = state.memory
    robust = buffer.rule is not None and buffer.count > 0
    private = not state.privacy.empty
    privacy = {"privacy": state.privacy.to_dict()} if private else {}
    return pack(
        {
            "format": FORMAT_VERSION if robust or private else _PLAIN_FORMAT,
            "version": state.version,
            "layout": state.layout.to_list(),
            "weights": _bytes(state.weights_view(), _F32) if include_weights else None,
            "counters": dict(state.counters),
            "closed": state.closed,
            "dedup": {
                "horizon": state.dedup.horizon,
                "capacity": state.dedup.capacity,
                "floor": state.dedup.floor,
                "ids": [[update_id, key] for update_id, key in state.dedup.items()]
                if include_dedup_ids
                else None,
            },
            # an empty FedBuff buffer is all zeros: not worth 8 bytes a parameter
            "buffer": {
                "count": buffer.count,
                "total": _bytes(buffer.total, _F64) if buffer.count else None,
                "weight": buffer.weight,
            }
            | (_robust(buffer) if robust else {}),
            # least recently heard first: [id, samples, seen, arrivals, τ, delta]; delta is
            # its bytes, True when kept elsewhere (include_memory=False), or None
            "clients": [
                [
                    client,
                    entry.samples,
                    entry.seen,
                    entry.arrivals,
                    entry.tau,
                    None
                    if entry.delta is None
                    else (_bytes(entry.delta, _F32) if include_memory else True),
                ]
                for client, entry in state.clients.items()
            ],
            "memory": {
                "weight": memory.weight,
                "pending": memory.pending,
                "total": _bytes(memory.total, _F64) if memory.weight else None,
            },
            "tiers": [
                [
                    tier.weight,
                    tier.count,
                    tier.rounds,
                    _bytes(tier.total, _F64) if tier.count else None,
                    None if tier.model is None else _bytes(tier.model, _F32),
                ]
                for tier in state.tiers
            ],
            "history": [[first, _bytes(w, _F32)] for first, w in state.history],
            # the poisoning bound's memory; absent from checkpoints written before it existed
            "norms": list(state.norms),
            "optimizer": _optimizer(state.optimizer),
            **privacy,
        }
        # Zeno++'s validation gradient, only when there is one: a run without it saves the
        # bytes it always saved; a build before it restores without it and computes it afresh
        | (
            {}
            if state.zeno_gradient is None
            else {"zeno": [state.zeno_gradient.version, _bytes(state.zeno_gradient.gradient, _F32)]}
        )
    )


def load_state(
    raw: bytes,
    weights: np.ndarray | None = None,
    *,
    dedup_ids: Iterable[tuple[str, int]] | None = None,
    memory_deltas: Mapping[str, bytes] | None = None,
    dp_secret: bytes | None = None,
) -> AggregationState:
    """Inverse of save_state; refuses anything it does not recognise.

    `weights` must be given exactly when the checkpoint was saved without them; `dedup_ids` is
    used only when the checkpoint was saved without its ids (none when not given);
    `memory_deltas` (client id → its delta's bytes) is wanted when it was saved without the
    memory and names clients with a delta; a missing or malformed one is a CheckpointError.
    `dp_secret` is the run's DP secret (never in a checkpoint), for a state that decides DP.
    """
    try:
        data = unpack(raw, max_bytes=len(raw))
    except WireError as exc:
        raise CheckpointError(f"not a checkpoint: {exc}") from None
    found = data.get("format") if isinstance(data, dict) else None
    if found not in _READABLE:
        raise CheckpointError(f"checkpoint format {found!r}, this build reads {_READABLE}")
    try:
        layout = Layout.from_list(data["layout"])
        dedup_data = data["dedup"]
        dedup = DedupMemory.restore(
            dedup_data["horizon"],
            dedup_data["capacity"],
            dedup_data["floor"],
            ((str(i), int(k)) for i, k in dedup_data["ids"])
            if dedup_data["ids"] is not None
            else (dedup_ids or ()),
        )
        saved = data["weights"]
        if (saved is None) == (weights is None):
            raise CheckpointError("weights must come from the checkpoint or the caller, not both")
        state = AggregationState(
            _array(saved, _F32, layout.size) if weights is None else weights,
            layout,
            version=int(data["version"]),
            dedup=dedup,
            dp_secret=dp_secret,
        )
        state.counters = {str(k): int(v) for k, v in data["counters"].items()}
        closed = data["closed"]
        state.closed = None if closed is None else str(closed)
        state.buffer.count = int(data["buffer"]["count"])
        if state.buffer.count:
            state.buffer.total = _array(data["buffer"]["total"], _F64, layout.size).copy()
        # format 2 and before: FedBuff's weights were all 1
        state.buffer.weight = float(data["buffer"].get("weight", state.buffer.count))
        if "rule" in data["buffer"]:
            _restore_robust(state.buffer, data["buffer"], layout.size)
        _restore_book(state, data.get("clients", ()), memory_deltas or {}, layout.size)
        saved_memory = data.get("memory", {"weight": 0, "pending": 0, "total": None})
        state.memory.weight = int(saved_memory["weight"])
        state.memory.pending = int(saved_memory["pending"])
        if state.memory.weight:
            state.memory.total = _array(saved_memory["total"], _F64, layout.size).copy()
        state.tiers = [_restore_tier(t, layout.size) for t in data.get("tiers", ())]
        state.history = [(int(first), _array(w, _F32, layout.size)) for first, w in data["history"]]
        state.norms.extend(float(n) for n in data.get("norms", ()))
        if "optimizer" in data:
            state.optimizer = _restore_optimizer(data["optimizer"], layout.size)
        if "privacy" in data:
            state.privacy = PrivacySpent.from_dict(data["privacy"])
        if "zeno" in data:
            zeno_version, gradient = data["zeno"]
            state.zeno_gradient = ValidationGradient.at(
                int(zeno_version), _array(gradient, _F32, layout.size)
            )
    except MemoryMissing:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"corrupt checkpoint: {exc!r}") from None
    return state


def saved_version(raw: bytes) -> int:
    """The version a checkpoint was taken at, without restoring it (nor needing its weights)."""
    try:
        data = unpack(raw, max_bytes=len(raw))
        return int(data["version"])
    except (WireError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"not a checkpoint: {exc!r}") from None


def _restore_book(
    state: AggregationState, saved: Any, deltas: Mapping[str, bytes], size: int
) -> None:
    for client, samples, seen, arrivals, tau, delta in saved:
        name = str(client)
        if delta is True:
            if name not in deltas:
                raise MemoryMissing(f"the remembered delta of client {name!r} is missing")
            delta = deltas[name]
        state.clients.restore(
            name,
            ClientEntry(
                int(samples),
                int(seen),
                int(arrivals),
                int(tau),
                None if delta is None else _array(delta, _F32, size),
            ),
        )


def _robust(buffer: FedBuffBuffer) -> dict[str, Any]:
    """The buffer's robust rule and its updates: [id, w_i, v_i's bytes] in buffering order."""
    assert buffer.rule is not None
    return {
        "rule": buffer.rule.to_list(),
        "kept": [[k.update_id, k.weight, _bytes(k.contribution, _F64)] for k in buffer.kept],
    }


def _restore_robust(buffer: FedBuffBuffer, saved: Any, size: int) -> None:
    buffer.rule = RuleSpec.from_list(saved["rule"])
    buffer.kept = [
        Kept(str(update_id), float(weight), _array(contribution, _F64, size))
        for update_id, weight, contribution in saved["kept"]
    ]
    if len(buffer.kept) != buffer.count:
        raise CheckpointError(f"{len(buffer.kept)} kept updates for a buffer of {buffer.count}")


def _restore_tier(saved: Any, size: int) -> Tier:
    weight, count, rounds, total, model = saved
    return Tier(
        np.zeros(size, np.float64) if total is None else _array(total, _F64, size).copy(),
        int(weight),
        int(count),
        int(rounds),
        None if model is None else _array(model, _F32, size),
    )


def _optimizer(optimizer: OptimizerState) -> dict[str, Any]:
    first, second = optimizer.first, optimizer.second
    return {
        "kind": None if optimizer.kind is None else optimizer.kind.value,
        "steps": optimizer.steps,
        "first": None if first is None else _bytes(first, _F64),
        "second": None if second is None else _bytes(second, _F64),
    }


def _restore_optimizer(data: Any, size: int) -> OptimizerState:
    kind, first, second = data["kind"], data["first"], data["second"]
    return OptimizerState(
        None if kind is None else ServerOptimizer(kind),
        int(data["steps"]),
        None if first is None else _array(first, _F64, size),
        None if second is None else _array(second, _F64, size),
    )


def _bytes(array: np.ndarray, dtype: np.dtype[Any]) -> bytes:
    return np.ascontiguousarray(array, dtype=dtype).tobytes()


def _array(data: Any, dtype: np.dtype[Any], size: int) -> np.ndarray:
    if not isinstance(data, bytes) or len(data) != size * dtype.itemsize:
        raise CheckpointError(f"array of {size} {dtype} has the wrong byte length")
    return np.frombuffer(data, dtype=dtype)  # read-only: bytes are immutable
