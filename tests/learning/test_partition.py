"""Partitioners: disjoint, non-empty, deterministic, and with the skew each one promises."""

from __future__ import annotations

import numpy as np
import pytest

from fedasync.learning import partition
from fedasync.learning.partition import PartitionError

LABELS = np.repeat(np.arange(10), 50)  # 500 samples, 10 balanced classes


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def assert_disjoint_non_empty(parts: list[np.ndarray]) -> np.ndarray:
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined)), "an index is given to two devices"
    assert all(len(p) > 0 for p in parts)
    return joined


def test_iid_covers_everything_evenly() -> None:
    parts = partition.iid(LABELS, 7, rng())
    joined = assert_disjoint_non_empty(parts)
    assert sorted(joined) == list(range(len(LABELS)))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


@pytest.mark.parametrize("beta", [0.05, 0.5, 100.0])
def test_dirichlet_covers_everything_and_skews_more_for_small_beta(beta: float) -> None:
    parts = partition.dirichlet(LABELS, 20, rng(), beta=beta)
    joined = assert_disjoint_non_empty(parts)
    assert sorted(joined) == list(range(len(LABELS)))


def dominant_share(parts: list[np.ndarray]) -> float:
    return float(np.mean([np.bincount(LABELS[p]).max() / len(p) for p in parts]))


def test_dirichlet_skew_grows_as_beta_shrinks() -> None:
    skewed = dominant_share(partition.dirichlet(LABELS, 20, rng(), beta=0.05))
    mild = dominant_share(partition.dirichlet(LABELS, 20, rng(), beta=100.0))
    assert skewed > 0.6 > 0.25 > mild


@pytest.mark.parametrize("per_device", [1, 2])
def test_shards_give_each_device_exactly_its_classes(per_device: int) -> None:
    parts = partition.shards(LABELS, 25, rng(), classes_per_device=per_device)
    joined = assert_disjoint_non_empty(parts)
    assert all(len(np.unique(LABELS[p])) == per_device for p in parts)
    assert set(LABELS[joined]) == set(range(10))  # every class is held by someone
    holders = [sum(c in LABELS[p] for p in parts) for c in range(10)]
    # dealt from decks: a partial last deck and collision shifts cost at most a few holders
    assert max(holders) - min(holders) <= 3


def test_rare_class_lives_only_on_the_slow_devices() -> None:
    slow = [3, 11, 17]
    parts = partition.rare_class_on_slow(LABELS, 20, rng(), slow=slow, rare_class=4, keep=0.3)
    assert_disjoint_non_empty(parts)
    holders = [d for d, p in enumerate(parts) if 4 in LABELS[p]]
    assert holders == slow
    assert sum(int(np.sum(LABELS[p] == 4)) for p in parts) == 15  # 30% of 50 kept
    others = np.concatenate(parts)
    assert np.sum(LABELS[others] != 4) == 450  # every other sample is used


@pytest.mark.parametrize(
    "split",
    [
        lambda r: partition.iid(LABELS, 9, r),
        lambda r: partition.dirichlet(LABELS, 9, r, beta=0.3),
        lambda r: partition.shards(LABELS, 9, r, classes_per_device=2),
        lambda r: partition.rare_class_on_slow(LABELS, 9, r, slow=[1], rare_class=0),
    ],
)
def test_the_same_generator_gives_the_same_split(split: object) -> None:
    first, second = split(rng(5)), split(rng(5))  # type: ignore[operator]
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(first, split(rng(6)), strict=True))  # type: ignore[operator]


def test_impossible_partitions_are_refused() -> None:
    with pytest.raises(PartitionError, match="devices"):
        partition.iid(LABELS[:5], 6, rng())
    with pytest.raises(PartitionError, match="beta"):
        partition.dirichlet(LABELS, 4, rng(), beta=0.0)
    with pytest.raises(PartitionError, match="classes_per_device"):
        partition.shards(LABELS, 4, rng(), classes_per_device=11)
    with pytest.raises(PartitionError, match="slow"):
        partition.rare_class_on_slow(LABELS, 4, rng(), slow=[9], rare_class=1)
    with pytest.raises(PartitionError, match="rare class"):
        partition.rare_class_on_slow(LABELS, 4, rng(), slow=[1], rare_class=42)
