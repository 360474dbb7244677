"""FedBuff's server optimizers: SGD, momentum and Adam on the buffer's mean delta, checkpointed."""

from __future__ import annotations

import numpy as np
import pytest

from fedasync.shared.checkpoint import load_state, save_state
from fedasync.shared.policy import Mode, Policy, ServerOptimizer
from tests.unit.helpers import make_state, make_update

MEANS = [np.array([1.0, -2.0]), np.array([0.5, 0.5]), np.array([-1.0, 3.0])]


def run(policy: Policy, means: list[np.ndarray]) -> list[np.ndarray]:
    """Weights after each server step of K = 1 fresh updates whose delta is `means[i]`."""
    state = make_state(size=2, value=0.0)
    out = []
    for i, mean in enumerate(means):
        target = state.weights_view().astype(np.float64) + mean
        update = make_update(f"u{i}", state.version, target.astype(np.float32), size=2)
        assert state.apply(update, policy).server_step
        out.append(state.weights_view().astype(np.float64))
    return out


def deltas(policy: Policy, means: list[np.ndarray]) -> list[np.ndarray]:
    """The deltas the devices actually sent (their weights are float32)."""
    x = np.zeros(2)
    out = []
    for got, mean in zip(run(policy, means), means, strict=True):
        out.append((x + mean).astype(np.float32).astype(np.float64) - x)
        x = got
    return out


def test_momentum_is_heavy_ball_on_the_mean_delta() -> None:
    policy = Policy.fedbuff(
        buffer_size=1, server_optimizer=ServerOptimizer.MOMENTUM, server_lr=0.5, server_momentum=0.8
    )
    got = run(policy, MEANS)
    x, m = np.zeros(2), np.zeros(2)
    for step, delta in zip(got, deltas(policy, MEANS), strict=True):
        m = 0.8 * m + delta
        x = (x + 0.5 * m).astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(step, x, rtol=1e-6)


def test_adam_is_bias_corrected_adam_on_the_mean_delta() -> None:
    policy = Policy.fedbuff(
        buffer_size=1,
        server_optimizer=ServerOptimizer.ADAM,
        server_lr=0.1,
        server_beta1=0.9,
        server_beta2=0.99,
        server_eps=1e-6,
    )
    got = run(policy, MEANS)
    x, m, v = np.zeros(2), np.zeros(2), np.zeros(2)
    for t, (step, delta) in enumerate(zip(got, deltas(policy, MEANS), strict=True), start=1):
        m = 0.9 * m + 0.1 * delta
        v = 0.99 * v + 0.01 * delta**2
        update = (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.99**t)) + 1e-6)
        x = (x + 0.1 * update).astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(step, x, rtol=1e-6)
    # Adam's first step moves every coordinate by about η whatever the delta's scale
    np.testing.assert_allclose(np.abs(got[0]), [0.1, 0.1], rtol=1e-4)


@pytest.mark.parametrize("kind", ["momentum", "adam"])
def test_matches_torch_on_the_pseudo_gradient(kind: str) -> None:
    """FLSim hands −Δ̄ to torch.optim.SGD(momentum) or torch.optim.Adam: the same steps."""
    torch = pytest.importorskip("torch")
    policy = Policy.fedbuff(buffer_size=1, server_optimizer=ServerOptimizer(kind), server_lr=0.3)
    got = run(policy, MEANS)
    param = torch.zeros(2, dtype=torch.float64, requires_grad=True)
    optimizer = (
        torch.optim.SGD([param], lr=0.3, momentum=0.9)
        if kind == "momentum"
        else torch.optim.Adam([param], lr=0.3, betas=(0.9, 0.999), eps=1e-8)
    )
    for step, delta in zip(got, deltas(policy, MEANS), strict=True):
        param.grad = torch.from_numpy(-delta)
        optimizer.step()
        with torch.no_grad():  # the model is float32 between steps, as in the core
            param.copy_(param.float().double())
        np.testing.assert_allclose(step, param.detach().numpy(), rtol=1e-6)


def test_sgd_is_the_plain_fedbuff_step() -> None:
    sgd = run(Policy.fedbuff(buffer_size=1, server_lr=0.5), MEANS)
    x = np.zeros(2)
    for step, mean in zip(sgd, MEANS, strict=True):
        x = (x + 0.5 * mean).astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(step, x, rtol=1e-6)


@pytest.mark.parametrize("kind", list(ServerOptimizer))
def test_moments_survive_save_and_restore(kind: ServerOptimizer) -> None:
    policy = Policy.fedbuff(buffer_size=2, server_optimizer=kind, server_lr=0.2)
    straight, resumed = make_state(size=3), make_state(size=3)
    script = [make_update(f"u{i}", i // 2, float(i % 5) - 2, size=3) for i in range(12)]
    for state in (straight, resumed):
        for update in script[:7]:
            state.apply(update, policy)
    resumed = load_state(save_state(resumed))
    assert resumed.optimizer.kind is straight.optimizer.kind is kind
    for update in script[7:]:
        assert resumed.apply(update, policy) == straight.apply(update, policy)
    assert resumed.weights_view().tobytes() == straight.weights_view().tobytes()
    assert save_state(resumed) == save_state(straight)


def test_changing_the_optimizer_starts_its_moments_afresh() -> None:
    adam = Policy.fedbuff(buffer_size=1, server_optimizer=ServerOptimizer.ADAM, server_lr=0.1)
    state = make_state(size=2)
    for i in range(3):
        state.apply(make_update(f"a{i}", state.version, 1.0, size=2), adam)
    assert (state.optimizer.kind, state.optimizer.steps) == (ServerOptimizer.ADAM, 3)
    momentum = adam.evolve(server_optimizer=ServerOptimizer.MOMENTUM)
    state.apply(make_update("m", state.version, 1.0, size=2), momentum)
    assert (state.optimizer.kind, state.optimizer.steps) == (ServerOptimizer.MOMENTUM, 1)


def test_fedasync_ignores_the_server_optimizer() -> None:
    """FedAsync mixes; the optimizer fields never touch it (its results stay bit for bit)."""
    plain, adam = make_state(size=2), make_state(size=2)
    with_adam = Policy(server_optimizer=ServerOptimizer.ADAM, server_lr=0.01)
    assert with_adam.mode is Mode.FEDASYNC
    for i in range(5):
        update = make_update(f"u{i}", max(i - 2, 0), float(i), size=2)
        assert plain.apply(update, Policy()).alpha == adam.apply(update, with_adam).alpha
    assert plain.weights_view().tobytes() == adam.weights_view().tobytes()
    assert adam.optimizer.kind is None
