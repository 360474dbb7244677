"""Hierarchical FedBuff: leaves that take a shard's updates in, a root that takes the steps.

A run's devices are split over S shards by client id (`shard_of`). Each shard has a leaf: an
`AggregationState` of its own that decides its shard's updates with every check the core makes
(ids, dedup, shape, values, staleness, the base model's delta, the poisoning bound) and takes
each one in exactly as FedBuff does (`FedBuff.contribute`: Σ w·s(τ)·Δ, Σ w), but never steps
(`LeafStrategy`). When the leaf holds `leaf_flush` contributions, or the root's version moves,
it hands the sum to the root as a `Partial` (the sum, the count, the ids and τ it covers), in
its own order, numbered per shard (`seq`). The root (`Root`) adds partials to FedBuff's buffer
and takes FedBuff's server step (`FedBuff.step`) when the buffer holds K contributions; a
partial is atomic, so a step may take a few more than K (the mean divides by Σ w, as always).

τ: a leaf weights an update with s(τ), τ = v_leaf − base, where v_leaf is the root version the
leaf follows; a partial never spans two root versions (the leaf flushes before it follows), so
`Partial.version` is the v_leaf of every contribution it holds. In one process (the simulator,
`LocalTree`) the leaves follow each root step at once and v_leaf is the root's version, as a
single aggregator's; in production it may lag by the time a version takes to reach a leaf.
docs/plans/issue-29-tree.md has the design, and how this τ differs from one FedBuff's.

Exactly once: a partial's id is (shard, seq); the root commits a shard's partials in seq order
and remembers the last committed seq per shard (`Root.committed`), so a partial redelivered
after a crash is a duplicate, and a gap (a partial lost) is an error, never a silent skip.

Bit for bit: a partial's sum is the leaf's float64 buffer, added in the order the leaf decided
its updates, and the root adds partials in the order it commits them. With S = 1 and
`leaf_flush = 1` every partial is one contribution, 0.0 + c = c exactly, and the root's buffer
adds the very values a single FedBuff's adds, in the same order: the same model to the bit.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace

import numpy as np

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.decision import Decision, Outcome
from fedasync.shared.layout import Layout
from fedasync.shared.modes.base import State, sum_of_squares
from fedasync.shared.modes.delta import Taking, prune_history
from fedasync.shared.modes.fedbuff import FedBuff
from fedasync.shared.policy import Mode, Policy
from fedasync.shared.robust import RuleSpec
from fedasync.shared.server_optimizer import OptimizerState
from fedasync.shared.update import Update


class TreeError(ValueError):
    """A tree asked to do what it cannot: a policy it does not take, or a partial out of order."""


def shard_of(client_id: str, shards: int) -> int:
    """The shard a client's updates go to: BLAKE2b of its id, mod S.

    Not Python's `hash` (salted per process): the device, the ingest, every leaf and the
    simulator must agree on it across processes and machines, for the life of the run.
    """
    if shards < 1:
        raise TreeError(f"a tree has at least one shard, got {shards}")
    digest = hashlib.blake2b(client_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def tree_problem(policy: Policy) -> str | None:
    """Why a tree cannot run `policy`, or None. A tree is FedBuff's buffer split over leaves:
    fedbuff mode, the mean (a robust rule needs every contribution at the root, not their sum),
    and no differential privacy yet (its per-client accounting and noise are one aggregator's;
    docs/plans/issue-29-tree.md says what it takes)."""
    if policy.mode is not Mode.FEDBUFF:
        return f"a tree runs fedbuff, not {policy.mode.value}"
    if RuleSpec.of(policy) is not None:
        return f"a tree steps with the mean, not robust = {policy.robust.value}"
    if policy.private:
        return "a tree does not take differential privacy (dp_clip) yet"
    return None


@dataclass(frozen=True, slots=True)
class TreeShape:
    """How a run's tree is cut: S shards, and the leaf's flush at `leaf_flush` contributions."""

    shards: int = 1
    leaf_flush: int = 1

    def __post_init__(self) -> None:
        if self.shards < 1 or self.leaf_flush < 1:
            raise TreeError(
                f"shards and leaf_flush must be >= 1, got {self.shards} and {self.leaf_flush}"
            )


class LeafStrategy(FedBuff):
    """FedBuff's intake (the delta, the bound, s(τ), `contribute`) without its step: a leaf's
    buffer goes to the root as a partial, and only the root steps."""

    def fold(
        self,
        state: State,
        taking: Taking,
        taken: np.ndarray,
        x: np.ndarray,
        optimizer: OptimizerState,
    ) -> tuple[float, np.ndarray, OptimizerState, bool]:
        return self.contribute(state, taking, taken), x, optimizer, False


LEAF = LeafStrategy()
#: the root's strategy: FedBuff's own step and emptying of the buffer
_FEDBUFF = FedBuff()


@dataclass(frozen=True, slots=True, eq=False)
class Partial:
    """A leaf's partial aggregate: what the root commits, once, in each shard's seq order."""

    shard: int
    #: the leaf's partials numbered from 0: its place in the shard's stream of partials
    seq: int
    #: the root version the leaf weighted every contribution at (τ_i = version − base_i)
    version: int
    #: Σ w_i·s(τ_i)·Δ_i in float64, summed in the leaf's decision order
    total: np.ndarray
    count: int
    #: Σ w_i
    weight: float
    update_ids: tuple[str, ...]
    taus: tuple[int, ...]

    @property
    def id(self) -> str:
        return partial_id(self.shard, self.seq)


def partial_id(shard: int, seq: int) -> str:
    """A partial's name in decisions and commits: `<shard>-<seq>`."""
    return f"{shard}-{seq}"


@dataclass(frozen=True, slots=True)
class Commit:
    """What the root did with a partial: the version after it, and whether it stepped."""

    partial: str
    #: the root version after the commit (one higher when it stepped)
    version: int
    stepped: bool = False
    duplicate: bool = False
    #: ‖x_after − x_before‖ of the step, when it stepped
    step_norm: float | None = None
    #: the root version at the commit − the partial's version: how many steps its
    #: contributions' τ misses. In `LocalTree` 0 for a full partial, 1 for one flushed
    #: because the root stepped (docs/plans/issue-29-tree.md, "τ in a tree")
    lag: int = 0


class Leaf:
    """One shard's aggregator: decides the shard's updates and hands the root partials."""

    def __init__(self, shard: int, weights: np.ndarray, layout: Layout, version: int = 0) -> None:
        self.shard = shard
        self.state = AggregationState(weights, layout, version=version)
        #: the seq of the partial being gathered
        self.seq = 0
        self._ids: list[str] = []
        self._taus: list[int] = []

    @property
    def held(self) -> int:
        """Contributions taken in since the last flush."""
        return self.state.buffer.count

    def apply(self, update: Update, policy: Policy) -> Decision:
        """Decide `update` (of this leaf's shard) under `policy`: taken in, or refused."""
        problem = tree_problem(policy)
        if problem is not None:
            raise TreeError(problem)
        decision = self.state.apply(update, policy, strategy=LEAF)
        if decision.outcome is not Outcome.APPLIED:
            return decision
        assert decision.tau is not None
        self._ids.append(decision.update_id)
        self._taus.append(decision.tau)
        return _with_partial(decision, partial_id(self.shard, self.seq))

    def due(self, shape: TreeShape, root_version: int) -> bool:
        """The flush rule: it holds `leaf_flush` contributions, or it holds some and the root
        has moved past the version they were weighted at."""
        held = self.held
        return held > 0 and (held >= shape.leaf_flush or root_version != self.state.version)

    def flush(self) -> Partial:
        """The partial held so far (possibly empty), and a fresh one begun."""
        buffer = self.state.buffer
        partial = Partial(
            self.shard,
            self.seq,
            self.state.version,
            buffer.total.copy(),
            buffer.count,
            buffer.weight,
            tuple(self._ids),
            tuple(self._taus),
        )
        LEAF.empty(self.state)
        self.seq += 1
        self._ids, self._taus = [], []
        return partial

    def follow(self, history: list[tuple[int, np.ndarray]], policy: Policy) -> None:
        """The root stepped: its `history` ((version, read-only weights), oldest first) is
        newer than the leaf's. The leaf's model, the base models it may form deltas against
        (every version it missed) and its dedup horizon move with it. A leaf follows only when
        it holds nothing: its contributions were weighted at the version it had."""
        if self.held:
            raise TreeError(f"leaf {self.shard} follows the root holding {self.held}")
        state = self.state
        if not history or history[-1][0] <= state.version:
            return
        if not state.history:  # the model in force, kept as the first base (as `delta_from_base`)
            state.history.append((state.version, state.weights_view()))
        for version, weights in history:
            if version > state.version:
                state.history.append((version, weights))
        state.version, weights = history[-1]
        state.replace_weights(weights)
        state.dedup.advance(state.version)
        prune_history(state, policy.tau_max)


@dataclass
class Root:
    """The tree's root: FedBuff's buffer filled with partials, and FedBuff's server step."""

    state: AggregationState
    #: shard → the last seq committed: what makes a redelivered partial a duplicate
    committed: dict[int, int] = field(default_factory=dict)

    def commit(self, partial: Partial, policy: Policy) -> Commit:
        """Add `partial` to the buffer once (in its shard's seq order) and step at K."""
        state = self.state
        last = self.committed.get(partial.shard, -1)
        if partial.seq <= last:
            return Commit(partial.id, state.version, duplicate=True)
        if partial.seq != last + 1:
            raise TreeError(f"partial {partial.id} after {partial_id(partial.shard, last)}")
        if partial.version > state.version:
            raise TreeError(f"partial {partial.id} of version {partial.version} > {state.version}")
        lag = state.version - partial.version
        buffer = state.buffer
        buffer.total += partial.total
        buffer.count += partial.count
        buffer.weight += partial.weight
        self.committed[partial.shard] = partial.seq
        if buffer.count < policy.buffer_size:
            return Commit(partial.id, state.version, lag=lag)
        before = state.weights_view()
        weights, optimizer = _FEDBUFF.step(state, before, state.optimizer, policy)
        _FEDBUFF.empty(state)
        state.counters["server_steps"] += 1
        state.replace_weights(weights)
        state.optimizer = optimizer
        state.version += 1
        state.dedup.advance(state.version)
        state.history.append((state.version, state.weights_view()))
        prune_history(state, policy.tau_max)
        norm = math.sqrt(sum_of_squares(state.weights_view() - before))
        return Commit(partial.id, state.version, stepped=True, step_norm=norm, lag=lag)


class LocalTree:
    """A whole tree in one process: the simulator's, and the reference the services keep to.

    Partials reach the root the moment a leaf flushes, and every leaf follows each root step
    at once, flushing first what it holds (in shard order): the same rule a leaf service
    applies when it learns of a new version, with no delay between the two.
    """

    def __init__(self, weights: np.ndarray, layout: Layout, shape: TreeShape) -> None:
        self.shape = shape
        self.root = Root(AggregationState(weights, layout))
        self.leaves = [Leaf(i, weights, layout) for i in range(shape.shards)]
        #: every commit, in order: with the decisions' `partial`, which step took each update
        self.commits: list[Commit] = []
        self._shards: dict[str, int] = {}

    def leaf_of(self, client_id: str) -> Leaf:
        shard = self._shards.get(client_id)
        if shard is None:
            shard = self._shards[client_id] = shard_of(client_id, self.shape.shards)
        return self.leaves[shard]

    @property
    def version(self) -> int:
        return self.root.state.version

    def counters(self) -> dict[str, int]:
        """Decisions counted over the leaves, and the root's server steps."""
        total = {o.value: 0 for o in Outcome}
        for leaf in self.leaves:
            for name in total:
                total[name] += leaf.state.counters[name]
        total["server_steps"] = self.root.state.counters["server_steps"]
        return total

    def apply(self, update: Update, policy: Policy) -> Decision:
        """Decide `update` at its shard's leaf; flush and commit what the flush rule says."""
        leaf = self.leaf_of(str(update.client_id))
        decision = leaf.apply(update, policy)
        if leaf.due(self.shape, self.version):
            self._send(leaf.flush(), policy)
        return decision

    def _send(self, partial: Partial, policy: Policy) -> None:
        commit = self.root.commit(partial, policy)
        self.commits.append(commit)
        if not commit.stepped:
            return
        root = self.root.state
        for leaf in self.leaves:  # shard order: the same on every run
            if leaf.due(self.shape, root.version):
                self._send(leaf.flush(), policy)  # may step again: leaves follow the newest
            leaf.follow(root.history, policy)


def _with_partial(decision: Decision, partial: str) -> Decision:
    return replace(decision, partial=partial)
