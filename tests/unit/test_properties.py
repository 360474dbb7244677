"""Laws of the core, checked on hundreds of generated cases each (hypothesis, derandomized)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import load_state, save_state
from fedasync.shared.decision import Decision, DropReason, Outcome
from fedasync.shared.layout import Layout
from fedasync.shared.params import TAU_MAX_LIMIT, Range
from fedasync.shared.policy import POLICY_RANGES, Mode, NormAction, Policy, ServerOptimizer
from fedasync.shared.staleness import Decay
from fedasync.shared.update import Update
from fedasync.shared.wire import WireError, WireReason, decode_update, encode_update, pack

SIZE = 5


def in_range(r: Range) -> st.SearchStrategy[Any]:
    values: st.SearchStrategy[Any]
    if r.integer:
        values = st.integers(int(r.low) + r.low_open, int(r.high) - r.high_open)
    else:
        values = st.floats(
            r.low, r.high, exclude_min=r.low_open, exclude_max=r.high_open, allow_nan=False
        )
    return st.none() | values if r.optional else values


def policies(**fixed: st.SearchStrategy[Any]) -> st.SearchStrategy[Policy]:
    """Any valid policy: every parameter drawn from the core's own allowed range. DP stays
    off: its fields combine under rules of their own (tests/unit/test_privacy_core.py)."""
    params: dict[str, st.SearchStrategy[Any]] = {
        name: in_range(r)
        for name, r in POLICY_RANGES.items()
        if not name.startswith(("dp_", "privacy_"))
    }
    params["mode"] = st.sampled_from(Mode)
    params["decay"] = st.sampled_from(Decay)
    params["norm_action"] = st.sampled_from(NormAction)
    params["server_optimizer"] = st.sampled_from(ServerOptimizer)
    params.update(fixed)
    return st.builds(_valid_policy, **params)


def _valid_policy(**values: Any) -> Policy:
    """A policy of these values, Zeno++'s margin dropped outside FedAsync (it is refused there)."""
    if values["mode"] is not Mode.FEDASYNC:
        values["zeno_margin"] = None
    return Policy(**values)


# --------------------------------------------------------------------------------- staleness
@given(
    policy=policies(),
    tau=st.integers(0, TAU_MAX_LIMIT),
    t=st.integers(0, 10**12),
)
def test_alpha_is_in_zero_alpha0(policy: Policy, tau: int, t: int) -> None:
    alpha = policy.alpha(tau, t)
    assert 0.0 < alpha <= policy.alpha0


@given(
    policy=policies(),
    taus=st.tuples(st.integers(0, TAU_MAX_LIMIT), st.integers(0, TAU_MAX_LIMIT)),
    t=st.integers(0, 10**12),
)
def test_alpha_never_increases_with_tau(policy: Policy, taus: tuple[int, int], t: int) -> None:
    low, high = sorted(taus)
    assert policy.alpha(high, t) <= policy.alpha(low, t)
    assert policy.alpha(low + 1, t) <= policy.alpha(low, t)


# --------------------------------------------------------------------------------- state machine
@dataclass(frozen=True)
class Op:
    lag: int  # how many versions behind the current one the device trained from
    reuse: int | None  # index of an earlier update id to re-publish, or None for a fresh id
    value: float
    policy: int  # which of the scenario's policies is in force
    invalid: bool


ops = st.lists(
    st.builds(
        Op,
        lag=st.integers(0, 14),
        reuse=st.one_of(st.none(), st.none(), st.integers(0, 200)),
        value=st.floats(-4, 4, allow_nan=False, width=32),
        policy=st.integers(0, 2),
        invalid=st.sampled_from([False] * 9 + [True]),
    ),
    max_size=60,
)
scenario_policies = st.lists(
    policies(
        version=st.just(0),
        tau_max=st.integers(0, 12),
        buffer_size=st.integers(1, 4),
        server_lr=st.floats(0.1, 2.0),
        # a bound that fires within a 60-step script: short history, small factor
        norm_bound=st.none() | st.floats(1.0, 3.0),
        norm_window=st.integers(5, 8),
    ),
    min_size=3,
    max_size=3,
).map(lambda ps: [dataclasses.replace(p, version=i) for i, p in enumerate(ps)])


def fresh_state() -> AggregationState:
    return AggregationState(np.linspace(-1, 1, SIZE, dtype=np.float32), Layout.flat(SIZE))


def step(state: AggregationState, op: Op, index: int, plan: list[Policy]) -> Decision:
    update_id = f"u{op.reuse % index}" if op.reuse is not None and index else f"u{index}"
    weights = np.full(SIZE, op.value, np.float32) + np.arange(SIZE, dtype=np.float32)
    if op.invalid:
        weights[0] = np.inf
    base = max(state.version - op.lag, 0)
    return state.apply(Update(update_id, f"c{index % 3}", base, 1, weights), plan[op.policy])


def fingerprint(state: AggregationState) -> dict[str, Any]:
    """Everything the state holds except its decision counters."""
    data: dict[str, Any] = msgpack.unpackb(save_state(state), raw=False)
    del data["counters"]
    return data


@given(plan=scenario_policies, script=ops)
def test_drop_iff_tau_above_tau_max(plan: list[Policy], script: list[Op]) -> None:
    state = fresh_state()
    for i, op in enumerate(script):
        seen = f"u{op.reuse % i}" if op.reuse is not None and i else f"u{i}"
        duplicate = seen in state.dedup
        version = state.version
        decision = step(state, op, i, plan)
        stale = decision.outcome is Outcome.DROPPED and decision.reason == DropReason.STALE
        if duplicate:
            assert decision.outcome is Outcome.DUPLICATE
        elif not op.invalid:
            tau = version - max(version - op.lag, 0)
            assert stale == (tau > plan[op.policy].tau_max)


@given(plan=scenario_policies, script=ops)
def test_version_increments_exactly_on_server_steps(plan: list[Policy], script: list[Op]) -> None:
    """Every applied FedAsync update is a server step; in FedBuff the K-th buffered one is.
    Each decision records the version after it, and the weights change only with the version."""
    state = fresh_state()
    steps = 0
    for i, op in enumerate(script):
        before, weights = state.version, state.weights_view()
        decision = step(state, op, i, plan)
        assert decision.server_step == (state.version == before + 1)
        assert state.version in (before, before + 1)
        assert decision.server_step <= decision.applied
        if decision.applied and plan[op.policy].mode is Mode.FEDASYNC:
            assert decision.server_step
        if not decision.server_step:
            assert state.weights_view() is weights
        assert decision.version == state.version
        steps += decision.server_step
    assert state.version == steps


@given(plan=scenario_policies, script=ops)
def test_duplicate_never_changes_state(plan: list[Policy], script: list[Op]) -> None:
    state = fresh_state()
    for i, op in enumerate(script):
        before = fingerprint(state)
        counters = dict(state.counters)
        decision = step(state, op, i, plan)
        if decision.outcome is Outcome.DUPLICATE:
            assert fingerprint(state) == before
            assert state.counters == counters | {"duplicate": counters["duplicate"] + 1}


@given(plan=scenario_policies, script=ops, cut=st.integers(0, 60))
def test_save_restore_continue_equals_never_stopping(
    plan: list[Policy], script: list[Op], cut: int
) -> None:
    straight = fresh_state()
    expected = [step(straight, op, i, plan) for i, op in enumerate(script)]

    resumed = fresh_state()
    got = [step(resumed, op, i, plan) for i, op in enumerate(script[:cut])]
    resumed = load_state(save_state(resumed))
    got += [step(resumed, op, i, plan) for i, op in enumerate(script) if i >= cut]

    assert got == expected
    assert save_state(resumed) == save_state(straight)
    assert resumed.weights_view().tobytes() == straight.weights_view().tobytes()


@given(
    k=st.floats(1.0, 3.0),
    window=st.integers(5, 8),
    action=st.sampled_from(NormAction),
    script=st.lists(
        st.tuples(st.integers(0, 3), st.floats(-6, 3), st.integers(0, 2**32 - 1)),
        max_size=60,
    ),
)
def test_with_the_bound_on_no_applied_update_moves_the_model_beyond_it(
    k: float, window: int, action: NormAction, script: list[tuple[int, float, int]]
) -> None:
    """FedAsync: ‖x_after − x_before‖ ≤ α · k · median(recent delta norms), checked against an
    oracle that measures every delta itself in float64 and keeps its own history."""
    policy = Policy(norm_bound=k, norm_window=window, norm_action=action, tau_max=1000)
    state = fresh_state()
    history: list[float] = []
    for i, (lag, log_scale, seed) in enumerate(script):
        direction = np.random.default_rng(seed).standard_normal(SIZE)
        before = state.weights_view().astype(np.float64)
        new = (before + direction * 10.0**log_scale).astype(np.float32)
        raw = float(np.linalg.norm(new.astype(np.float64) - before))
        recent = history[-window:]
        bound = k * float(np.median(recent)) if len(recent) >= 5 else None
        decision = state.apply(Update(f"u{i}", "c", max(state.version - lag, 0), 1, new), policy)
        moved = float(np.linalg.norm(state.weights_view().astype(np.float64) - before))
        # the weights are float32: rounding them may move them by a few ulps of their magnitude
        ulps = 1e-6 * (float(np.linalg.norm(before)) + float(np.linalg.norm(new)))
        if decision.applied:
            assert decision.alpha is not None
            if bound is not None:
                assert moved <= decision.alpha * bound * (1 + 1e-6) + ulps
                assert decision.clipped == (raw > bound) or raw == pytest.approx(bound)
            else:
                assert not decision.clipped
            history.append(raw if bound is None else min(raw, bound))
        else:
            assert decision.reason == "norm_bound"
            assert action is NormAction.REJECT
            assert bound is not None
            assert raw >= bound * (1 - 1e-6)
            assert moved == 0.0


# --------------------------------------------------------------------------------- codec
printable_ids = st.text(
    st.characters(codec="utf-8", categories=["L", "N", "P", "S"]) | st.just(" "),
    min_size=1,
    max_size=128,
)
updates = st.builds(
    Update,
    update_id=printable_ids,
    client_id=printable_ids,
    base_version=st.integers(0, 2**63 - 1),
    num_samples=st.integers(1, 2**31 - 1),
    weights=st.lists(
        st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=0, max_size=64
    ).map(lambda xs: np.array(xs, np.float32)),
    created_at=st.floats(0, 4e9, allow_nan=False),
    metrics=st.dictionaries(
        st.text(min_size=1, max_size=64),
        st.floats(allow_nan=False, allow_infinity=False),
        max_size=32,
    ),
)


@given(update=updates)
def test_codec_round_trip(update: Update) -> None:
    raw = encode_update(update)
    decoded = decode_update(raw)
    assert (decoded.update_id, decoded.client_id) == (update.update_id, update.client_id)
    assert (decoded.base_version, decoded.num_samples) == (update.base_version, update.num_samples)
    assert decoded.created_at == update.created_at
    assert dict(decoded.metrics) == dict(update.metrics)
    assert decoded.weights.tobytes() == update.weights.tobytes()
    assert encode_update(decoded) == raw


@given(update=updates, data=st.data())
def test_every_truncation_is_refused(update: Update, data: st.DataObject) -> None:
    raw = encode_update(update)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(WireError) as info:
        decode_update(raw[:cut])
    assert info.value.reason is WireReason.MALFORMED


@given(update=updates, data=st.data())
def test_every_oversized_message_is_refused(update: Update, data: st.DataObject) -> None:
    raw = encode_update(update)
    limit = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(WireError) as info:
        decode_update(raw, max_bytes=limit)
    assert info.value.reason is WireReason.TOO_LARGE


@given(update=updates, data=st.data())
def test_random_byte_mutations_are_refused_or_decode_to_a_valid_update(
    update: Update, data: st.DataObject
) -> None:
    raw = bytearray(encode_update(update))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        decoded = decode_update(bytes(raw))
    except WireError as exc:  # the only exception decoding may raise
        refused = exc
    else:
        refused = None
    if refused is not None:
        assert refused.reason in set(WireReason)
        return
    # a flip inside a float or a string can still give a well-formed message: it must be valid
    assert decode_update(encode_update(decoded)).update_id == decoded.update_id
    assert np.isfinite(decoded.weights).all()


WRONG_VALUES: dict[str, list[tuple[Any, WireReason]]] = {
    "schema": [(2, WireReason.UNKNOWN_SCHEMA), ("1", WireReason.WRONG_TYPE)],
    "update_id": [("", WireReason.BAD_VALUE), (7, WireReason.WRONG_TYPE)],
    "client_id": [(b"c", WireReason.WRONG_TYPE), ("x" * 200, WireReason.BAD_VALUE)],
    "base_version": [(-5, WireReason.BAD_VALUE), (None, WireReason.WRONG_TYPE)],
    "num_samples": [(0, WireReason.BAD_VALUE), (2.5, WireReason.WRONG_TYPE)],
    "created_at": [(float("nan"), WireReason.BAD_VALUE), ([], WireReason.WRONG_TYPE)],
    "weights": [({}, WireReason.MISSING_FIELD), ("w", WireReason.WRONG_TYPE)],
    "metrics": [({"a": float("inf")}, WireReason.NON_FINITE), (1, WireReason.WRONG_TYPE)],
}


@given(update=updates, data=st.data())
def test_targeted_field_mutations_are_refused_with_their_reason(
    update: Update, data: st.DataObject
) -> None:
    message = msgpack.unpackb(encode_update(update), raw=False)
    field = data.draw(st.sampled_from(sorted(WRONG_VALUES)))
    action = data.draw(st.sampled_from(["replace", "drop", "add"]))
    if action == "replace":
        value, reason = data.draw(st.sampled_from(WRONG_VALUES[field]))
        message[field] = value
    elif action == "drop":
        if field == "metrics":
            message["metrics"] = 1
            reason = WireReason.WRONG_TYPE
        else:
            del message[field]
            reason = WireReason.MISSING_FIELD
    else:
        message[field + "_x"] = 1
        reason = WireReason.UNKNOWN_FIELD
    if field == "schema" and action == "drop":
        reason = WireReason.MISSING_FIELD
    with pytest.raises(WireError) as info:
        decode_update(pack(message))
    assert info.value.reason is reason


# --------------------------------------------------------------------------------- decoder fuzz
_FIELD_NAMES = [*sorted(WRONG_VALUES), "dtype", "shape", "data", "x"]
_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
msgpack_trees = st.recursive(
    _leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(_FIELD_NAMES) | st.text(max_size=6), children, max_size=5)
    ),
    max_leaves=12,
)
#: for each field, values of a type it can never take
_WRONG_TYPE = {
    "schema": lambda v: not (isinstance(v, int) and not isinstance(v, bool) and v == 1),
    "update_id": lambda v: not isinstance(v, str),
    "client_id": lambda v: not isinstance(v, str),
    "base_version": lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 0,
    "num_samples": lambda v: not isinstance(v, int) or isinstance(v, bool) or v < 1,
    "weights": lambda v: not isinstance(v, dict),
    "created_at": lambda v: isinstance(v, (bool, str, bytes, list, dict)) or v is None,
    "metrics": lambda v: not isinstance(v, dict),
}


@st.composite
def malformed_messages(draw: st.DrawFn) -> bytes:
    """Bytes that are not a valid update, by construction, in many different ways."""
    kind = draw(st.sampled_from(["bytes", "tree", "field", "ext", "trailing", "duplicate"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "tree":  # any msgpack value that lacks the update's structure
        tree = draw(msgpack_trees.filter(lambda t: not isinstance(t, dict) or "weights" not in t))
        return bytes(msgpack.packb(tree, use_bin_type=True))
    valid = msgpack.unpackb(encode_update(draw(updates)), raw=False)
    if kind == "field":  # one field replaced by a value of a type it cannot take
        name = draw(st.sampled_from(sorted(_WRONG_TYPE)))
        valid[name] = draw(msgpack_trees.filter(_WRONG_TYPE[name]))
        return pack(valid)
    if kind == "ext":  # an extension type somewhere
        ext = msgpack.ExtType(draw(st.integers(0, 127)), draw(st.binary(max_size=8)))
        valid[draw(st.sampled_from(sorted(valid)))] = ext
        return bytes(msgpack.packb(valid, use_bin_type=True))
    if kind == "trailing":
        return encode_update(draw(updates)) + draw(st.binary(min_size=1, max_size=8))
    # duplicate: the map header says one more entry, and a key is written twice
    raw = bytearray(pack(valid))
    raw[0] += 1
    name = draw(st.sampled_from(sorted(valid)))
    return bytes(raw) + pack({name: valid[name]})[1:]


@settings(max_examples=1000)
@given(raw=malformed_messages())
def test_decoder_refuses_1000_malformed_messages_with_a_reason(raw: bytes) -> None:
    with pytest.raises(WireError) as info:
        decode_update(raw)
    assert info.value.reason in set(WireReason)
