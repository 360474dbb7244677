"""The accountant: ε equal to dp-accounting's own RdpAccountant for the same events, Opacus's
RDP accountant within 5%, PLD no looser than RDP, cheap per decision, and never imported by a
run without DP (it costs over a second to import)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from fedasync.shared.aggregation import AggregationState
from fedasync.shared.layout import Layout
from fedasync.shared.policy import Mode, Policy, PrivacyModel
from fedasync.shared.privacy import accounting
from fedasync.shared.privacy.spent import PrivacySpent
from fedasync.shared.update import Update

DELTA = 1e-5


def their_epsilon(steps: accounting.Steps, delta: float = DELTA) -> float:
    """dp-accounting's own computation: an RdpAccountant composing each event `count` times."""
    accountant = rdp_privacy_accountant.RdpAccountant()
    for q, z, count in steps:
        gaussian = dp_accounting.GaussianDpEvent(z)
        event = gaussian if q >= 1.0 else dp_accounting.PoissonSampledDpEvent(q, gaussian)
        accountant.compose(event, count)
    return float(accountant.get_epsilon(delta))


@pytest.mark.parametrize(
    "steps",
    [
        ((0.01, 1.1, 1),),
        ((0.05, 1.0, 1000),),
        ((1.0, 2.0, 37),),
        ((0.1, 0.8, 200), (0.1, 1.2, 300), (0.02, 1.2, 50)),
    ],
)
def test_our_epsilon_equals_dp_accountings_own_for_the_same_events(
    steps: accounting.Steps,
) -> None:
    assert accounting.rdp_epsilon(steps, DELTA) == their_epsilon(steps)


def test_a_runs_spent_privacy_is_dp_accountings_epsilon_of_its_steps() -> None:
    """A DP-FedBuff run whose K and z change: the state's ε, both models, are dp-accounting's
    figure for the events it recorded."""
    secret = b"s" * 32
    state = AggregationState(np.zeros(3, np.float32), Layout.flat(3), dp_secret=secret)
    policy = Policy.fedbuff(buffer_size=4, dp_clip=1.0, dp_noise=1.0, dp_population=50)
    rng = np.random.default_rng(3)
    for i in range(120):
        if i == 60:
            policy = policy.evolve(dp_noise=1.5, buffer_size=2)
        weights = rng.standard_normal(3).astype(np.float32)
        state.apply(Update(f"u{i}", f"c{i % 7}", state.version, 1, weights), policy)
    sampled, conservative = state.epsilon(policy)
    assert sampled == their_epsilon(((4 / 50, 1.0, 15), (2 / 50, 1.5, 30)))
    most = max(state.privacy.contributions.values())
    assert conservative == their_epsilon(((1.0, 1.0, most),))  # the smallest z seen: 1.0


@pytest.mark.parametrize(("z", "q", "steps"), [(1.0, 0.05, 1000), (1.1, 0.01, 10_000)])
def test_opacus_rdp_accountant_agrees_within_5_percent(z: float, q: float, steps: int) -> None:
    from opacus.accountants import RDPAccountant

    theirs = RDPAccountant()
    for _ in range(steps):
        theirs.step(noise_multiplier=z, sample_rate=q)
    opacus_epsilon = theirs.get_epsilon(DELTA)
    ours = accounting.rdp_epsilon(((q, z, steps),), DELTA)
    print(f"z={z} q={q} steps={steps}: ours {ours:.4f}, opacus {opacus_epsilon:.4f}")
    assert abs(ours - opacus_epsilon) / opacus_epsilon < 0.05


def test_pld_is_no_looser_than_rdp() -> None:
    steps = ((0.05, 1.0, 500),)
    assert accounting.pld_epsilon(steps, DELTA) <= accounting.rdp_epsilon(steps, DELTA)


def test_nothing_released_is_zero_epsilon() -> None:
    assert accounting.rdp_epsilon((), DELTA) == 0.0
    assert PrivacySpent().epsilon(Policy(dp_clip=1.0, dp_population=10)) == (0.0, 0.0)


def test_epsilon_after_each_decision_costs_well_under_a_millisecond() -> None:
    """Counted in operations, not seconds: a step's ε is one cached curve times a count and one
    compute_epsilon; composing an event (the costly part, ~28 ms) happens once per distinct
    (q, z), however many steps and decisions there are."""
    accounting.event_rdp.cache_clear()
    policy = Policy(
        dp_clip=1.0, dp_population=1000, privacy_model=PrivacyModel.SAMPLED, mode=Mode.FEDASYNC
    )
    state = AggregationState(np.zeros(2, np.float32), Layout.flat(2), dp_secret=b"k" * 32)
    for i in range(300):
        weights = np.full(2, 0.01 * i, np.float32)
        state.apply(Update(f"u{i}", f"c{i}", state.version, 1, weights), policy)
    info = accounting.event_rdp.cache_info()
    assert info.misses == 2  # (1/1000, 1.0) for the sampled model, (1, 1.0) for the other


def test_a_run_without_dp_never_imports_dp_accounting() -> None:
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        from fedasync.shared.aggregation import AggregationState
        from fedasync.shared.checkpoint import load_state, save_state
        from fedasync.shared.layout import Layout
        from fedasync.shared.policy import Policy
        from fedasync.shared.update import Update
        from fedasync.sim.runner import simulate
        from fedasync.sim.summary import build_summary
        from tests.sim.helpers import config
        build_summary(simulate(config(budget={"max_updates": 20})))
        for policy in (Policy(), Policy.fedbuff(buffer_size=2)):
            state = AggregationState(np.zeros(3, np.float32), Layout.flat(3))
            for i in range(5):
                w = np.full(3, float(i), np.float32)
                d = state.apply(Update(f"u{i}", "c", state.version, 1, w), policy)
                d.to_dict()
            load_state(save_state(state))
        assert "dp_accounting" not in sys.modules, "dp_accounting was imported"
        print("clean")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"
