"""Robust rules of the buffered modes (shared/robust.py): each exact on numbers small enough to
follow by hand, through the core as FedBuff steps with them, resisting a malicious minority that
the mean follows, and across a checkpoint taken mid-buffer."""

from __future__ import annotations

import functools
import operator
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedasync.shared import robust
from fedasync.shared.aggregation import AggregationState
from fedasync.shared.checkpoint import CheckpointError, load_state, save_state
from fedasync.shared.decision import Decision, Outcome
from fedasync.shared.params import ParamError
from fedasync.shared.policy import FIELDS, Mode, Policy, RobustRule
from fedasync.shared.robust import Kept, RuleSpec
from fedasync.shared.wire import pack, unpack
from tests.unit.helpers import make_state, make_update

# Krum's hand-computed example: five points in the plane, f = 1, so each is scored by its
# n − f − 2 = 2 nearest others. Squared distances:
#   ab 1, ac 4, ad 2, ae 200, bc 5, bd 1, be 181, cd 2, ce 164, de 162
# scores: a 1+2 = 3, b 1+1 = 2, c 2+4 = 6, d 1+2 = 3, e 162+164 = 326
POINTS = np.array([[0, 0], [1, 0], [0, 2], [1, 1], [10, 10]], np.float64)
IDS = ("a", "b", "c", "d", "e")


def fedbuff(**changes: object) -> Policy:
    return Policy.fedbuff(**changes)


# ------------------------------------------------------------------------------------ the rules
def test_median_of_an_odd_number_is_the_middle_value_of_each_coordinate() -> None:
    rows = np.array([[1.0, 9.0], [5.0, -3.0], [2.0, 4.0]])
    np.testing.assert_array_equal(robust.median(rows), [2.0, 4.0])


def test_median_of_an_even_number_is_the_mean_of_the_two_middle_values() -> None:
    rows = np.array([[1.0, 9.0], [5.0, -3.0], [2.0, 4.0], [100.0, 0.0]])
    np.testing.assert_array_equal(robust.median(rows), [(2.0 + 5.0) / 2, (0.0 + 4.0) / 2])


def test_trimmed_mean_leaves_out_beta_n_values_at_each_end_of_each_coordinate() -> None:
    rows = np.array([[1.0, 50.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [100.0, -50.0]])
    # β = 0.2, n = 5: t = 1 at each end; coordinate 0 keeps 2, 3, 4; coordinate 1 keeps 0, 1, 2
    np.testing.assert_array_equal(robust.trimmed_mean(rows, 0.2), [3.0, 1.0])
    # β = 0.1: t = ⌊0.5⌋ = 0, the plain mean
    np.testing.assert_allclose(robust.trimmed_mean(rows, 0.1), rows.mean(axis=0))


def test_krum_scores_each_point_by_its_n_minus_f_minus_2_nearest() -> None:
    np.testing.assert_array_equal(robust.krum_scores(POINTS, 1), [3.0, 2.0, 6.0, 3.0, 326.0])
    assert robust.krum_select(POINTS, 1, 1) == [1]  # b
    assert robust.krum_select(POINTS, 1, 3) == [1, 0, 3]  # b, then the tie a/d to the earlier


def test_krum_refuses_too_few_points_for_its_f() -> None:
    with pytest.raises(ValueError, match="n > 2f"):
        robust.krum_scores(POINTS[:3], 1)


def kept(points: np.ndarray, weights: tuple[float, ...] | None = None) -> list[Kept]:
    weights = weights or (1.0,) * len(points)
    ids = [IDS[i] if i < len(IDS) else f"x{i}" for i in range(len(points))]
    return [
        Kept(i, w, w * p) for i, w, p in zip(ids, weights, points.astype(np.float64), strict=True)
    ]


def test_krum_takes_the_best_scored_delta_and_excludes_the_others() -> None:
    taken = robust.step(kept(POINTS), RuleSpec(RobustRule.KRUM, byzantine=1))
    np.testing.assert_array_equal(taken.total, [1.0, 0.0])
    assert taken.count == 1.0
    assert taken.excluded == ("a", "c", "d", "e")
    assert taken.detail == "krum: kept 1 of 5"


def test_multi_krum_averages_the_m_best_and_by_default_n_minus_f() -> None:
    three = robust.step(kept(POINTS), RuleSpec(RobustRule.MULTI_KRUM, byzantine=1, select=3))
    np.testing.assert_allclose(three.total, [(0 + 1 + 1) / 3, (0 + 0 + 1) / 3], rtol=0, atol=0)
    assert three.excluded == ("c", "e")
    every = robust.step(kept(POINTS), RuleSpec(RobustRule.MULTI_KRUM, byzantine=1))
    np.testing.assert_array_equal(every.total, [(0 + 1 + 0 + 1) / 4, (0 + 0 + 2 + 1) / 4])
    assert every.excluded == ("e",)
    assert every.detail == "multi_krum: kept 4 of 5"


def test_weights_scale_the_rule_back_by_the_mean_weight() -> None:
    """v_i = w_i·u_i; the step divides R(v) by w̄, so equal weights give R(u) exactly."""
    taken = robust.step(kept(POINTS, (2.0,) * 5), RuleSpec(RobustRule.MEDIAN))
    assert taken.count == 2.0
    np.testing.assert_array_equal(taken.total / taken.count, robust.median(POINTS))


def test_a_partial_buffer_too_small_for_krum_takes_the_median_and_says_so() -> None:
    taken = robust.step(kept(POINTS[:4]), RuleSpec(RobustRule.KRUM, byzantine=1))
    np.testing.assert_array_equal(taken.total, robust.median(POINTS[:4]))
    assert taken.excluded == ()
    assert "4 buffered ≤ 2f + 2 = 4, coordinate-wise median of 4 instead" in taken.detail


# ------------------------------------------------------------------------------------ exactness
# The rules decide what the aggregator, the simulator and `ledger verify` must agree on to the
# bit (golden ledgers pin the bytes): each is compared, byte for byte, with the plainest way of
# computing it, one pair or one coordinate per step, on seeded buffers whose scales span 1e-8
# to 1e8, with duplicated rows (ties) and sizes on either side of numpy's pairwise-sum blocks.
def reference_distances(rows: np.ndarray) -> np.ndarray:
    n = rows.shape[0]
    out = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        for j in range(i + 1, n):
            out[i, j] = out[j, i] = float(np.sum(np.square(rows[i] - rows[j])))
    return out


def reference_scores(rows: np.ndarray, byzantine: int) -> np.ndarray:
    distances = reference_distances(rows)
    nearest = len(rows) - byzantine - 2
    return np.array(
        [float(np.sum(np.sort(np.delete(d, i))[:nearest])) for i, d in enumerate(distances)]
    )


def reference_step(rows: np.ndarray, spec: RuleSpec) -> tuple[bytes, tuple[int, ...]]:
    """(the rule's Δ̄·w̄ bytes, the rows it left out), a coordinate or a pair at a time."""
    n = len(rows)
    columns = [sorted(float(v) for v in rows[:, j]) for j in range(rows.shape[1])]
    if spec.rule is RobustRule.MEDIAN:
        middle = n // 2
        value = [c[middle] if n % 2 else (c[middle - 1] + c[middle]) / 2.0 for c in columns]
        return np.array(value).tobytes(), ()
    if spec.rule is RobustRule.TRIMMED_MEAN:
        t = robust.trimmed_count(n, spec.trim)
        value = [functools.reduce(operator.add, c[t : n - t]) / (n - 2 * t) for c in columns]
        return np.array(value).tobytes(), ()
    scores = reference_scores(rows, spec.byzantine)
    m = 1 if spec.rule is RobustRule.KRUM else min(spec.select or n - spec.byzantine, n)
    chosen = sorted(sorted(range(n), key=lambda i: scores[i])[:m])  # Python's sort is stable
    if m == 1:
        return rows[chosen[0]].tobytes(), tuple(i for i in range(n) if i not in chosen)
    total = functools.reduce(operator.add, [rows[i] for i in chosen]) / m
    return total.tobytes(), tuple(i for i in range(n) if i not in chosen)


def seeded_rows(seed: int, n: int, size: int) -> np.ndarray:
    """n contributions s·Δ (float64 from float32 deltas, as FedBuff keeps them), some repeated."""
    rng = np.random.default_rng(seed)
    scale = 10.0 ** float(rng.integers(-8, 9))
    rows: np.ndarray = rng.standard_normal((n, size)).astype(np.float32).astype(np.float64)
    rows *= scale / np.sqrt(1.0 + rng.integers(0, 5, size=(n, 1)))
    if seed % 3 == 0:
        rows[n - 1] = rows[0]  # a tie in every coordinate and two equal Krum scores
    return rows


SHAPES = [(3, 1), (5, 7), (6, 8), (9, 9), (12, 127), (13, 128), (20, 129), (31, 300), (40, 2410)]


@pytest.mark.parametrize("block", [robust._BLOCK, 1000], ids=["shipped-block", "small-block"])
@pytest.mark.parametrize(("n", "size"), SHAPES)
def test_krum_distances_and_scores_have_the_bits_of_one_pair_at_a_time(
    n: int, size: int, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(robust, "_BLOCK", block)  # a small block splits each row's others
    for seed in range(6):
        rows = seeded_rows(seed, n, size)
        distances = robust.squared_distances(rows)
        assert distances.tobytes() == reference_distances(rows).tobytes()
        for byzantine in range(0, (n - 3) // 2 + 1):
            scores = robust.krum_scores(rows, byzantine)
            assert scores.tobytes() == reference_scores(rows, byzantine).tobytes()


@pytest.mark.parametrize(("n", "size"), [s for s in SHAPES if s[0] >= 5])
def test_every_rule_steps_with_the_bits_and_exclusions_of_the_plainest_computation(
    n: int, size: int
) -> None:
    f = (n - 3) // 2
    rules = [
        RuleSpec(RobustRule.MEDIAN),
        RuleSpec(RobustRule.TRIMMED_MEAN, trim=0.2),
        RuleSpec(RobustRule.KRUM, byzantine=f),
        RuleSpec(RobustRule.MULTI_KRUM, byzantine=1),
        RuleSpec(RobustRule.MULTI_KRUM, byzantine=f, select=3),
    ]
    for seed in range(4):
        rows = seeded_rows(seed, n, size)
        buffered = kept(rows)
        for spec in rules:
            taken = robust.step(buffered, spec)
            total, left_out = reference_step(rows, spec)
            assert taken.total.tobytes() == total, (spec, seed)
            assert taken.excluded == tuple(buffered[i].update_id for i in left_out), (spec, seed)


# ------------------------------------------------------------------------------------ the policy
def test_robust_fields_default_to_todays_mean() -> None:
    assert Policy().robust is RobustRule.MEAN
    assert FIELDS["robust"].default == "mean"
    assert RuleSpec.of(Policy.fedbuff()) is None


@pytest.mark.parametrize(
    ("changes", "named", "says"),
    [
        ({"mode": "fedasync", "robust": "median"}, "robust", "mean unless mode is one of"),
        ({"mode": "memory", "robust": "krum"}, "robust", "mean unless mode is one of"),
        ({"robust": "krum", "buffer_size": 6, "robust_byzantine": 2}, "robust_byzantine", "K > 2f"),
        ({"robust": "multi_krum", "buffer_size": 2}, "robust_byzantine", "none with buffer_size 2"),
        ({"robust": "multi_krum", "robust_select": 11}, "robust_select", "at most buffer_size"),
        ({"robust": "trimmed_mean", "robust_trim": 0.5}, "robust_trim", "[0, 0.5)"),
    ],
)
def test_what_a_rule_cannot_do_is_a_clear_error_naming_the_field(
    changes: dict[str, object], named: str, says: str
) -> None:
    with pytest.raises(ParamError, match=r".*") as raised:
        Policy.configured({"mode": "fedbuff"} | changes)
    assert raised.value.param == named
    assert says in str(raised.value)


def test_krum_with_the_smallest_buffer_its_f_allows_is_accepted() -> None:
    assert Policy.fedbuff(robust="krum", buffer_size=7, robust_byzantine=2).robust_byzantine == 2


def test_switching_mode_at_runtime_away_from_a_buffer_needs_the_mean_too() -> None:
    policy = Policy.fedbuff(robust="median")
    with pytest.raises(ParamError, match="set robust = mean with the mode"):
        policy.evolve(mode=Mode.FEDASYNC)
    assert policy.evolve(mode=Mode.FEDASYNC, robust=RobustRule.MEAN).mode is Mode.FEDASYNC


def test_a_robust_rule_with_dp_is_refused() -> None:
    with pytest.raises(ParamError, match="DP is on"):
        Policy.configured({"mode": "fedbuff", "robust": "median", "dp_clip": 1.0})


# ------------------------------------------------------------------------------------ the core
def apply_points(state: AggregationState, policy: Policy) -> list[Decision]:
    """One buffer of the five points as deltas from the current model (τ = 0, s = 1)."""
    x = state.weights_view().copy()
    return [
        state.apply(make_update(i, state.version, x + p.astype(np.float32), size=2), policy)
        for i, p in zip(IDS, POINTS, strict=True)
    ]


def test_fedbuff_with_krum_steps_with_the_chosen_delta_and_records_who_was_left_out() -> None:
    state = make_state(size=2)
    decisions = apply_points(state, fedbuff(buffer_size=5, robust="krum"))
    assert [d.server_step for d in decisions] == [False] * 4 + [True]
    np.testing.assert_array_equal(state.weights_view(), [1.0, 0.0])  # b, at η = 1
    last = decisions[-1]
    assert last.excluded == ("a", "c", "d", "e")
    assert last.detail == "krum: kept 1 of 5"
    assert last.to_dict()["excluded"] == ["a", "c", "d", "e"]
    assert Decision.from_dict(last.to_dict()) == last
    assert all("excluded" not in d.to_dict() and d.detail == "" for d in decisions[:4])


@pytest.mark.parametrize("mode", ["fedbuff", "fedbuff-fair"])
def test_fedbuff_with_the_median_steps_with_it(mode: str) -> None:
    state = make_state(size=2)
    decisions = apply_points(
        state, Policy.configured({"mode": mode, "buffer_size": 5}).evolve(robust=RobustRule.MEDIAN)
    )
    np.testing.assert_allclose(state.weights_view(), robust.median(POINTS), rtol=1e-6)
    assert decisions[-1].excluded == ()
    assert decisions[-1].detail == "median: coordinate-wise of 5"


def test_the_mean_keeps_no_update_and_records_nothing_new() -> None:
    state = make_state(size=2)
    decisions = apply_points(state, fedbuff(buffer_size=5))
    assert state.buffer.kept == []
    assert state.buffer.rule is None
    assert all("excluded" not in d.to_dict() and d.detail == "" for d in decisions)
    np.testing.assert_allclose(state.weights_view(), POINTS.mean(axis=0), rtol=1e-6)


def test_a_switch_away_settles_a_partial_buffer_under_its_rule() -> None:
    state = make_state(size=2)
    policy = fedbuff(buffer_size=10, robust="median")
    apply_points(state, policy)  # five of ten buffered, no step
    assert state.version == 0
    assert len(state.buffer.kept) == 5
    switched = policy.evolve(mode=Mode.FEDASYNC, robust=RobustRule.MEAN)
    # trained from the settled model and back at it: FedAsync's own mixing moves nothing
    settled = robust.median(POINTS).astype(np.float32)
    decision = state.apply(make_update("f", 0, settled, size=2), switched)
    assert decision.server_step
    assert decision.detail == "median: coordinate-wise of 5"
    np.testing.assert_allclose(state.weights_view(), robust.median(POINTS), rtol=1e-6)
    assert state.buffer.count == 0
    assert state.buffer.kept == []


def test_a_change_of_rule_mid_buffer_settles_it_under_the_rule_it_was_gathered_under() -> None:
    state = make_state(size=2)
    policy = fedbuff(buffer_size=10, robust="multi_krum", robust_byzantine=1, robust_select=3)
    apply_points(state, policy)
    changed = policy.evolve(robust_select=4)
    decision = state.apply(make_update("f", 0, state.weights_view().copy(), size=2), changed)
    assert decision.server_step
    assert decision.excluded == ("c", "e")
    np.testing.assert_allclose(state.weights_view(), [2 / 3, 1 / 3], rtol=1e-6)
    assert state.buffer.count == 1
    assert state.buffer.rule == RuleSpec.of(changed)


def test_a_refused_update_after_a_settlement_carries_no_exclusions() -> None:
    state = make_state(size=2)
    policy = fedbuff(buffer_size=10, robust="krum")
    apply_points(state, policy)
    switched = policy.evolve(mode=Mode.FEDASYNC, robust=RobustRule.MEAN)
    bad = make_update("nan", 0, np.array([np.nan, 0.0], np.float32), size=2)
    refused = state.apply(bad, switched)
    assert refused.outcome is Outcome.REJECTED
    assert refused.excluded == ()
    assert state.buffer.count == 5  # nothing settled: the next update settles it
    taken = state.apply(make_update("g", 0, state.weights_view().copy(), size=2), switched)
    assert taken.server_step
    assert taken.excluded == ("a", "c", "d", "e")


# ------------------------------------------------------------------------------------ checkpoint
def test_a_checkpoint_mid_buffer_keeps_the_rules_updates_and_decides_the_same() -> None:
    policy = fedbuff(buffer_size=5, robust="krum")
    state = make_state(size=2)
    apply_points(state, policy)  # one step first: the history and optimizer are not empty
    x = state.weights_view().copy()
    updates = [
        make_update(i, 1, x + p.astype(np.float32), size=2)
        for i, p in zip(("p", "q", "r", "s", "t"), POINTS, strict=True)
    ]
    first, rest = updates[:3], updates[3:]
    for update in first:
        state.apply(update, policy)
    raw = save_state(state)
    assert unpack(raw, max_bytes=len(raw))["format"] == 4
    again = load_state(raw)
    assert [k.update_id for k in again.buffer.kept] == ["p", "q", "r"]
    assert again.buffer.rule == RuleSpec.of(policy)
    assert save_state(again) == raw
    decisions = [state.apply(u, policy) for u in rest]
    restored = [again.apply(u, policy) for u in rest]
    assert restored == decisions
    assert decisions[-1].excluded == ("p", "r", "s", "t")
    np.testing.assert_array_equal(again.weights_view(), state.weights_view())
    assert save_state(again) == save_state(state)


def test_a_checkpoint_without_robust_updates_is_format_3_as_before() -> None:
    state = make_state(size=2)
    policy = fedbuff(buffer_size=10, robust="median")
    raw = save_state(state)
    assert unpack(raw, max_bytes=len(raw))["format"] == 3  # an empty buffer keeps nothing
    apply_points(state, fedbuff(buffer_size=10))
    raw = save_state(state)
    data = unpack(raw, max_bytes=len(raw))
    assert data["format"] == 3
    assert set(data["buffer"]) == {"count", "total", "weight"}
    assert policy.robust is RobustRule.MEDIAN


# ------------------------------------------------------------------------------------ attacks
def run_attack(rule: str, attack: str, *, steps: int = 30, seed: int = 7) -> float:
    """FedBuff (K = 10, η = 1) on f(x) = ½‖x − c‖²: 8 honest devices a buffer take a local step
    x − 0.8·(x − c) + noise; 2 attackers send the honest step flipped ×10 ("flip") or scaled
    ×10 ("scale"). Returns ‖x − c‖ / ‖c‖ after `steps` server steps."""
    rng = np.random.default_rng(seed)
    size = 10
    c = rng.normal(size=size).astype(np.float32)
    policy = Policy.fedbuff(buffer_size=10, robust=rule, robust_byzantine=2, robust_trim=0.2)
    state = AggregationState(np.zeros(size, np.float32), make_state(size).layout)
    factor = -10.0 if attack == "flip" else 10.0
    for step in range(steps):
        x = state.weights_view().astype(np.float64)
        honest_step = -0.8 * (x - c)
        attackers = set(rng.choice(10, size=2, replace=False).tolist())
        for i in range(10):
            delta = (
                factor * honest_step
                if i in attackers
                else honest_step + rng.normal(scale=0.01, size=size)
            )
            update = make_update(f"{step}-{i}", state.version, (x + delta).astype(np.float32))
            assert state.apply(update, policy).outcome is Outcome.APPLIED
    return float(np.linalg.norm(state.weights_view() - c) / np.linalg.norm(c))


@pytest.mark.parametrize("attack", ["flip", "scale"])
def test_a_malicious_fifth_drives_the_mean_away_and_no_robust_rule(attack: str) -> None:
    assert run_attack("mean", attack) > 10.0  # diverged: further than it started (1.0)
    for rule in ("median", "trimmed_mean", "krum", "multi_krum"):
        assert run_attack(rule, attack) < 0.05, rule


# ------------------------------------------------------------------------------------ laws
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def buffers(draw: st.DrawFn, least: int = 1) -> np.ndarray:
    n = draw(st.integers(least, 9))
    p = draw(st.integers(1, 4))
    return np.array(
        draw(st.lists(st.lists(finite, min_size=p, max_size=p), min_size=n, max_size=n)), np.float64
    )


@given(buffers(), st.randoms(use_true_random=False))
def test_the_coordinate_rules_lie_within_the_values_and_ignore_their_order(
    rows: np.ndarray, rnd: random.Random
) -> None:
    order = list(range(len(rows)))
    rnd.shuffle(order)
    slack = 1e-12 * (np.abs(rows).max(axis=0) + 1.0)  # a mean's own rounding
    low, high = rows.min(axis=0) - slack, rows.max(axis=0) + slack
    for rule in (robust.median, lambda r: robust.trimmed_mean(r, 0.2)):
        value = rule(rows)
        assert np.all(low <= value)
        assert np.all(value <= high)
        assert rule(rows[order]).tobytes() == value.tobytes()


@given(buffers(least=5))
def test_krum_takes_one_of_the_buffered_deltas(rows: np.ndarray) -> None:
    taken = robust.step(kept(rows), RuleSpec(RobustRule.KRUM, byzantine=1))
    assert any(taken.total.tobytes() == row.tobytes() for row in rows)
    assert len(taken.excluded) == len(rows) - 1


def test_a_checkpoint_whose_kept_updates_do_not_match_its_buffer_is_refused() -> None:
    state = make_state(size=2)
    apply_points(state, fedbuff(buffer_size=10, robust="median"))
    data = unpack(save_state(state), max_bytes=1 << 20)
    data["buffer"]["kept"] = data["buffer"]["kept"][:4]
    with pytest.raises(CheckpointError, match="4 kept updates for a buffer of 5"):
        load_state(pack(data))
