"""The simulator's hierarchical FedBuff (`[algorithms.tree]`): the same core as production."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fedasync.sim.config import ConfigError
from fedasync.sim.runner import simulate
from fedasync.sim.summary import build_summary, dumps
from tests.sim.helpers import config

FEDBUFF: dict[str, Any] = {"kind": "fedbuff", "buffer_size": 4, "tau_max": 6}
FLEET: dict[str, Any] = {"devices": 24, "latency": {"kind": "longtail", "jitter": 0.3}}


def _run(*algorithms: dict[str, Any]) -> Any:
    return simulate(config(fleet=FLEET, algorithms=list(algorithms)))


def test_a_tree_of_one_shard_flushing_each_update_is_single_fedbuff_to_the_bit() -> None:
    single, tree = _run(
        FEDBUFF | {"name": "single"},
        FEDBUFF | {"name": "tree", "tree": {"shards": 1, "leaf_flush": 1}},
    ).results
    assert single.counters["applied"] >= 60
    assert tree.weights.tobytes() == single.weights.tobytes()
    assert tree.counters == single.counters
    assert tree.version == single.version
    assert [(e.time_s, e.score) for e in tree.recorder.evals] == [
        (e.time_s, e.score) for e in single.recorder.evals
    ]


def test_a_tree_of_four_shards_runs_the_budget_and_is_deterministic() -> None:
    spec = FEDBUFF | {"name": "tree", "tree": {"shards": 4, "leaf_flush": 2}}
    one = _run(spec).results[0]
    two = _run(spec).results[0]
    assert one.weights.tobytes() == two.weights.tobytes()
    assert one.counters == two.counters
    assert one.counters["applied"] == 60  # the budget: applied updates, counted at the leaves
    assert 0 < one.counters["server_steps"] <= 60 // 4


def test_a_config_without_a_tree_dumps_no_tree_key() -> None:
    """A FedBuff config that does not use the tree keeps the summary bytes it always had."""
    sim = _run(FEDBUFF)
    assert '"tree"' not in dumps(build_summary(sim))
    dumped = config(fleet=FLEET, algorithms=[FEDBUFF | {"tree": {"shards": 2}}]).dump()
    assert dumped["algorithms"][0]["tree"] == {"shards": 2, "leaf_flush": 1}
    assert json.dumps(dumped)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"robust": "median"}, "mean, not robust = median"),
        ({"dp_clip": 0.5}, "differential privacy"),
        ({"decide_s": 0.5}, "decide_s"),
    ],
)
def test_a_tree_refuses_what_it_does_not_model(extra: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        config(algorithms=[FEDBUFF | extra | {"tree": {"shards": 2}}])
