"""Hierarchical FedBuff's core (shared/tree.py): leaves, partials, the root's step."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.decision import Outcome
from fedasync.shared.layout import Layout
from fedasync.shared.policy import Policy
from fedasync.shared.tree import (
    Commit,
    LocalTree,
    Partial,
    Root,
    TreeError,
    TreeShape,
    shard_of,
    tree_problem,
)
from fedasync.shared.update import Update

SIZE = 16


def _policy(**overrides: object) -> Policy:
    values: dict[str, object] = {
        "mode": "fedbuff",
        "buffer_size": 5,
        "tau_max": 6,
        "server_optimizer": "momentum",
        "norm_bound": 1.5,
        "norm_action": "clip",
    }
    return Policy.configured(values | overrides)


def _stream(count: int, clients: int, seed: int) -> list[tuple[str, int, np.ndarray]]:
    """(client, how far behind the current version its base is, a noise vector) per update:
    the updates are built against the model in force, so both deciders get the same ones."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        client = f"c{int(rng.integers(clients))}"
        behind = int(rng.integers(0, 9))  # some beyond τ_max = 6: dropped as stale
        scale = 5.0 if rng.random() < 0.1 else 0.1  # a few beyond the norm bound: clipped
        out.append((client, behind, (scale * rng.standard_normal(SIZE)).astype(np.float32)))
    return out


def _update(index: int, client: str, base: int, weights: np.ndarray) -> Update:
    return Update(f"{client}-r{index}", client, base, 10, weights)


def _models(rng_seed: int = 0) -> np.ndarray:
    return np.random.default_rng(rng_seed).standard_normal(SIZE).astype(np.float32)


@pytest.mark.parametrize(
    ("shards", "bound"),
    [(1, 1.5), (4, None)],
    ids=["one-shard-with-the-bound", "four-shards-no-bound"],
)
def test_flushing_each_update_decides_bit_for_bit_as_single_fedbuff(
    shards: int, bound: float | None
) -> None:
    """leaf_flush = 1: the same τ, α, norms and outcome for every update, and after each the
    same version and the same weights, to the bit (momentum on). With one shard also under a
    clipping bound; with four, without one (the bound's median is per shard)."""
    policy = _policy(norm_bound=bound)
    init = _models()
    single = AggregationState(init.copy(), Layout.flat(SIZE))
    tree = LocalTree(init.copy(), Layout.flat(SIZE), TreeShape(shards=shards, leaf_flush=1))
    kept: dict[int, np.ndarray] = {0: init.copy()}  # version → weights, to build bases from
    steps = 0
    for index, (client, behind, noise) in enumerate(_stream(400, 7, seed=3)):
        base = max(0, single.version - behind)
        update = _update(index, client, base, kept[base] + noise)
        one = single.apply(update, policy)
        two = tree.apply(update, policy)
        assert (two.outcome, two.tau, two.alpha, two.delta_norm, two.clipped, two.reason) == (
            one.outcome,
            one.tau,
            one.alpha,
            one.delta_norm,
            one.clipped,
            one.reason,
        )
        assert tree.version == single.version
        assert tree.root.state.weights_view().tobytes() == single.weights_view().tobytes()
        steps += one.server_step
        kept.setdefault(single.version, single.weights_view().copy())
    assert steps > 50
    assert single.counters["applied"] > 250
    assert single.counters["dropped"] > 0
    assert any(c.stepped for c in tree.commits)
    assert tree.counters() == single.counters


def _keep(kept: dict[int, np.ndarray], tree: LocalTree) -> None:
    """Every version the root stepped to (a flush on a version move may step twice at once)."""
    for version, weights in tree.root.state.history:
        kept.setdefault(version, weights.copy())


def _run_tree(shape: TreeShape, policy: Policy) -> tuple[LocalTree, list[str]]:
    init = _models()
    tree = LocalTree(init.copy(), Layout.flat(SIZE), shape)
    kept = {0: init.copy()}
    partials = []
    for index, (client, behind, noise) in enumerate(_stream(600, 40, seed=5)):
        base = max(0, tree.version - behind)
        decision = tree.apply(_update(index, client, base, kept[base] + noise), policy)
        if decision.outcome is Outcome.APPLIED:
            assert decision.partial is not None
            partials.append(decision.partial)
        _keep(kept, tree)
    return tree, partials


def test_every_applied_update_is_in_exactly_one_committed_partial_and_one_step() -> None:
    """S = 4, leaf_flush = 3: each applied update names one partial, each partial is committed
    once, its ids are exactly the updates that name it, and a step takes at least K."""
    policy = _policy()
    tree, named = _run_tree(TreeShape(shards=4, leaf_flush=3), policy)
    commits = [c for c in tree.commits if not c.duplicate]
    assert len({c.partial for c in commits}) == len(commits)
    committed = {c.partial for c in commits}
    held = {f"{leaf.shard}-{leaf.seq}" for leaf in tree.leaves if leaf.held}
    assert set(named) <= committed | held
    by_partial = Counter(named)
    assert (
        sum(by_partial[p] for p in committed) + sum(leaf.held for leaf in tree.leaves)
        == (tree.counters()["applied"])
    )
    assert tree.counters()["server_steps"] == sum(c.stepped for c in commits) > 20


def test_a_partial_never_spans_two_versions_and_its_tau_is_the_leaf_version_minus_base() -> None:
    """The leaf flushes before it follows a new root version, so every τ in a partial was
    taken at the partial's version. In one process the leaf follows at once: a full partial
    lands in the step of its version, one flushed by the root's step lands in the next one."""
    policy = _policy()
    init = _models()
    tree = LocalTree(init.copy(), Layout.flat(SIZE), TreeShape(shards=3, leaf_flush=4))
    sent: list[Partial] = []
    commit = tree.root.commit

    def spy(partial: Partial, p: Policy) -> Commit:
        sent.append(partial)
        return commit(partial, p)

    tree.root.commit = spy  # type: ignore[method-assign,assignment]
    kept = {0: init.copy()}
    bases: dict[str, int] = {}
    for index, (client, behind, noise) in enumerate(_stream(300, 30, seed=8)):
        base = max(0, tree.version - behind)
        update = _update(index, client, base, kept[base] + noise)
        bases[update.update_id] = base
        tree.apply(update, policy)
        _keep(kept, tree)
    assert len(sent) > 30
    assert any(p.count < 4 for p in sent)
    for partial in sent:
        assert [partial.version - bases[i] for i in partial.update_ids] == list(partial.taus)
        assert partial.count == len(partial.update_ids) <= 4
    # full partials reach the root at their version; one flushed by a version move lags it by 1
    lags = {c.partial: c.lag for c in tree.commits}
    assert all(lags[p.id] == (0 if p.count == 4 else 1) for p in sent)


def test_the_tree_is_deterministic_to_the_bit() -> None:
    policy = _policy()
    shape = TreeShape(shards=4, leaf_flush=2)
    one, named_one = _run_tree(shape, policy)
    two, named_two = _run_tree(shape, policy)
    assert named_one == named_two
    assert one.root.state.weights_view().tobytes() == two.root.state.weights_view().tobytes()


def test_a_redelivered_partial_is_a_duplicate_and_changes_nothing() -> None:
    policy = _policy(buffer_size=2)
    root = Root(AggregationState(_models(), Layout.flat(SIZE)))
    ones = np.ones(SIZE)
    first = Partial(0, 0, 0, ones, 1, 1.0, ("a",), (0,))
    assert not root.commit(first, policy).duplicate
    total = root.state.buffer.total.copy()
    again = root.commit(first, policy)
    assert again.duplicate
    assert root.state.buffer.count == 1
    assert root.state.buffer.total.tobytes() == total.tobytes()
    stepped = root.commit(Partial(1, 0, 0, ones, 1, 1.0, ("b",), (0,)), policy)
    assert stepped.stepped
    assert root.state.version == 1


def test_a_gap_in_a_shards_partials_is_an_error_not_a_skip() -> None:
    root = Root(AggregationState(_models(), Layout.flat(SIZE)))
    with pytest.raises(TreeError, match="partial 0-1 after 0--1"):
        root.commit(Partial(0, 1, 0, np.ones(SIZE), 1, 1.0, ("a",), (0,)), _policy())


def test_shard_of_is_stable_across_processes_and_spreads_clients() -> None:
    """BLAKE2b, not Python's salted hash: pinned values, in range, roughly even."""
    assert [shard_of(f"device-{i}", 4) for i in range(8)] == [2, 3, 1, 1, 3, 2, 3, 0]
    counts = Counter(shard_of(f"device-{i}", 4) for i in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > 900
    with pytest.raises(TreeError):
        shard_of("a", 0)


def test_a_tree_refuses_what_it_cannot_step() -> None:
    assert tree_problem(_policy()) is None
    assert "fedbuff" in str(tree_problem(Policy.configured({"mode": "fedasync"})))
    assert "robust" in str(tree_problem(_policy(robust="median", norm_bound=None)))
    with pytest.raises(TreeError):
        TreeShape(shards=0)
