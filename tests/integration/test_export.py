"""`fedasync export`: a trained version out as ONNX, a torch state_dict or safetensors.

Each model is trained for real: device updates made by the task's own `train` on its training
split, published to a real redis-server and applied by the aggregator (burst mode), so the
version exported is a mix the aggregator committed, not the initial model. The digits model is
read from a live Redis (FEDASYNC_REDIS__URL), examples/custom-model's CNN (an out-of-tree
package, put on sys.path as a user's PYTHONPATH would) from a `fedasync up`-style run folder.
The ONNX file the command wrote is then checked here on its own: `onnx.checker`, and ONNX Runtime
against the torch module rebuilt from the version's weights on every test sample.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from fedasync.learning.tasks import get_task, task_data
from fedasync.learning.torch_task import TorchTask
from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.cli import main
from fedasync.services.commands.redis_launch.server import RedisServer
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.shared.keys import Keys
from fedasync.shared.model_format import ModelMessage, decode_model, to_safetensors
from fedasync.shared.seeds import Stream, stream
from fedasync.shared.update import Update
from fedasync.shared.wire import encode_update
from tests.integration.helpers import (
    ACL_PREFIX,
    OBSERVER,
    acl_redis,
    acl_url,
    publish,
    start_snapshot,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom-model"
CNN = "custom_model.task:make"
SEED = 7
#: device updates trained from version 0 and applied: the version exported is UPDATES
UPDATES = 4


def settings_for(url: str, prefix: str, task: str) -> Settings:
    return load_settings(
        redis={"url": url, "key_prefix": prefix},
        task={"name": task, "seed": SEED},
        # one commit per update, so every version has its model stored (a group commit
        # stores the last of its versions only)
        aggregator={"batch_ms": 20, "block_ms": 100, "port": 0, "batch_max": 1},
    )


def train(settings: Settings) -> None:
    """UPDATES real device updates from version 0 (the aggregator's own initial model: the task's
    init_weights on the run seed's model stream), each on its share of the training split."""
    task = settings.task.build()
    start = task.init_weights(stream(SEED, Stream.MODEL))
    train_split, _ = task_data(settings.task.name, task, stream(SEED, Stream.DATA))
    params = task.suggested
    updates = []
    for device in range(UPDATES):
        share = train_split.subset(np.arange(device, len(train_split), UPDATES))
        weights, metrics = task.train(
            start, share, stream(SEED, Stream.DEVICE, device),
            epochs=params.epochs, lr=params.lr, batch_size=params.batch_size,
        )  # fmt: skip
        updates.append(Update(f"u{device}", f"d{device}", 0, len(share), weights, 1.0, metrics))
    asyncio.run(_apply(settings, updates))


async def _apply(settings: Settings, updates: list[Update]) -> None:
    redis = connect(settings.redis)
    try:
        for update in updates:
            await publish(redis, Keys(settings.redis.key_prefix), encode_update(update))
        await run_aggregator(settings, redis=redis, handle_signals=False, burst=True)
    finally:
        await redis.aclose()


def stored(server: RedisServer, prefix: str, version: int) -> ModelMessage:
    import redis

    client = redis.Redis(port=server.port)
    try:
        raw = client.get(Keys(prefix).model(version))
    finally:
        client.close()
    assert isinstance(raw, bytes), version
    return decode_model(raw, len(raw))


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A user's shell: no FEDASYNC_ variable."""
    for name in [n for n in os.environ if n.startswith("FEDASYNC_")]:
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(scope="module")
def digits_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A live Redis holding a digits training: versions 0 to UPDATES."""
    server = RedisServer(tmp_path_factory.mktemp("digits-redis"))
    server.start()
    try:
        train(settings_for(server.url, "digits-run", "digits"))
        yield server
    finally:
        server.stop()


@pytest.fixture
def live(digits_redis: RedisServer, clean_env: pytest.MonkeyPatch) -> RedisServer:
    clean_env.setenv("FEDASYNC_REDIS__URL", digits_redis.url)
    clean_env.setenv("FEDASYNC_REDIS__KEY_PREFIX", "digits-run")
    return digits_redis


def onnx_against_torch(path: Path, task: TorchTask, message: ModelMessage) -> tuple[int, float]:
    """The ONNX file at `path` checked here on its own: onnx.checker, then ONNX Runtime and the
    torch module holding `message`'s weights on every sample of the run's test split; (samples
    with equal argmax, which must be all, and the largest |logit difference|)."""
    onnx.checker.check_model(onnx.load(path), full_check=True)
    _, test = task_data(task.name, task, stream(SEED, Stream.DATA))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    [ours] = session.run(None, {session.get_inputs()[0].name: test.X.astype(np.float32)})
    with task.forked(0), torch.no_grad():
        module = task.load(message.snapshot.weights)
        module.eval()
        theirs = module(torch.from_numpy(test.X.astype(np.float32))).numpy()
    assert ours.shape == theirs.shape == (len(test), task.num_classes)
    equal = int(np.count_nonzero(ours.argmax(axis=1) == theirs.argmax(axis=1)))
    return equal, float(np.max(np.abs(ours - theirs)))


def test_the_digits_model_exports_as_onnx_that_predicts_as_torch_on_every_test_sample(
    live: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "digits.onnx"
    assert main(["export", "--version", "latest", "--format", "onnx", "--out", str(out)]) == 0
    message = stored(live, "digits-run", UPDATES)
    start = stored(live, "digits-run", 0)
    assert not np.array_equal(message.snapshot.weights, start.snapshot.weights)  # trained
    task = get_task("digits")
    assert isinstance(task, TorchTask)
    equal, largest = onnx_against_torch(out, task, message)
    samples = 359  # 20% of sklearn's 1,797 digits
    assert equal == samples
    assert largest < 1e-4
    props = {p.key: p.value for p in onnx.load(out).metadata_props}
    assert props == {"fedasync.version": str(UPDATES), "fedasync.task": "digits"}
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"wrote {out}: version {UPDATES} of task 'digits' as ONNX")
    assert f"on {samples} test samples: {samples} equal predictions" in line


def test_the_torch_state_dict_loads_into_the_tasks_module_and_holds_the_versions_weights(
    live: RedisServer, tmp_path: Path
) -> None:
    out = tmp_path / "digits.pt"
    assert main(["export", "--format", "torch", "--version", "2", "--out", str(out)]) == 0
    task = get_task("digits")
    assert isinstance(task, TorchTask)
    state = torch.load(io.BytesIO(out.read_bytes()), weights_only=True)
    module = task.model()
    module.load_state_dict(state)
    weights = stored(live, "digits-run", 2).snapshot.weights
    np.testing.assert_array_equal(task.vector(module), weights)


def test_the_safetensors_file_is_the_bytes_the_snapshot_service_serves(
    live: RedisServer, tmp_path: Path
) -> None:
    latest, second = tmp_path / "latest.safetensors", tmp_path / "v1.safetensors"
    assert main(["export", "--format", "safetensors", "--out", str(latest)]) == 0
    assert main(["export", "--format", "safetensors", "--version", "1", "--out", str(second)]) == 0
    # latest as a device asks for it: a long-poll answered once the service holds version UPDATES
    served = asyncio.run(_served(live.url, [f"latest?newer_than={UPDATES - 1}&wait=60&", "1?"]))
    assert latest.read_bytes() == served[0]
    assert second.read_bytes() == served[1]
    assert served[0] == to_safetensors(stored(live, "digits-run", UPDATES).snapshot)


async def _served(url: str, versions: list[str]) -> list[bytes]:
    settings = settings_for(url, "digits-run", "digits")
    redis = connect(settings.redis)
    stopping = asyncio.Event()
    service, base = await start_snapshot(settings, redis, stopping)
    try:
        bodies = []
        async with aiohttp.ClientSession() as session:
            for version in versions:
                path = f"/v1/models/{version}format=safetensors"
                async with session.get(base + path) as response:
                    assert response.status == 200, await response.text()
                    bodies.append(await response.read())
        return bodies
    finally:
        stopping.set()
        await service
        await redis.aclose()


def fingerprint(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_custom_model_cnn_exports_from_a_run_folder_and_predicts_as_torch_on_every_sample(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """examples/custom-model's CNN (convolutions, BatchNorm whose running statistics travel in
    the weights, pooling), trained in what `fedasync up` leaves: a Redis under run/redis/."""
    clean_env.syspath_prepend(str(EXAMPLE))
    run = tmp_path / "up-20261203-120000"
    server = RedisServer(run / "redis")
    server.start()
    try:
        train(settings_for(server.url, "cnn-run", CNN))
        message = stored(server, "cnn-run", UPDATES)
    finally:
        server.stop()
    (run / "summary.json").write_text("{}\n")
    before = fingerprint(run)
    out = tmp_path / "cnn.onnx"
    assert main(["export", "--run", str(run), "--out", str(out)]) == 0  # onnx, latest: defaults
    assert fingerprint(run) == before  # the run folder is read, never written
    task = get_task(CNN)
    assert isinstance(task, TorchTask)
    equal, largest = onnx_against_torch(out, task, message)
    samples = 480  # 20% of the example's 2,400 images
    assert equal == samples
    assert largest < 1e-4
    line = capsys.readouterr().out.strip()
    assert f"version {UPDATES} of task {CNN!r} as ONNX" in line
    assert f"on {samples} test samples: {samples} equal predictions" in line


@pytest.fixture
def linear_run(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> Iterator[RedisServer]:
    """A live Redis holding version 0 of the numpy `linear` task (no torch module)."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        asyncio.run(_apply(settings_for(server.url, "linear-run", "linear"), []))
        clean_env.setenv("FEDASYNC_REDIS__URL", server.url)
        clean_env.setenv("FEDASYNC_REDIS__KEY_PREFIX", "linear-run")
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("form", ["onnx", "torch"])
def test_a_task_that_is_no_torch_module_is_refused_in_one_line_and_exit_2(
    linear_run: RedisServer, form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "linear.model"
    assert main(["export", "--format", form, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    assert line == (
        f"fedasync export --format {form}: task 'linear': LinearRegression is not a "
        "fedasync.TorchTask, so its model is no torch module to export (its weights still "
        "leave as safetensors)"
    )
    assert not out.exists()
    # and its weights do leave as safetensors
    assert main(["export", "--format", "safetensors", "--out", str(out)]) == 0
    assert out.read_bytes() == to_safetensors(stored(linear_run, "linear-run", 0).snapshot)


def test_a_version_not_kept_is_one_line_naming_those_kept_and_exit_2(
    live: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.onnx"
    assert main(["export", "--version", "99", "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "fedasync export: version 99 is not kept under the key prefix 'digits-run' (kept: 0, "
        f"1 … {UPDATES}; FEDASYNC_AGGREGATOR__KEEP_VERSIONS sets how many are)"
    )
    assert not out.exists()


def test_without_the_export_extra_onnx_is_refused_in_one_line_and_exit_2(
    live: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "m.onnx"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
        assert main(["export", "--out", str(out)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == (
        "fedasync export: ONNX export needs onnxruntime: pip install 'fedasync[export]' "
        "(onnx and onnxruntime)"
    )
    assert not out.exists()


def test_without_a_redis_or_a_run_folder_one_line_says_what_to_give(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("fedasync export: no Redis configured: set FEDASYNC_REDIS__URL")
    assert line.endswith("or give --run runs/up-… to export a model of a `fedasync up` run")


def test_the_admin_user_of_the_acl_file_may_export(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deployment under the generated ACL file: `fedasync export` runs as `admin`, the user
    of the other audit commands, and reads all it needs (GETs, the kept versions, the task)."""
    with acl_redis(tmp_path) as server:
        train(settings_for(acl_url(server, OBSERVER), ACL_PREFIX, "digits"))
        clean_env.setenv("FEDASYNC_REDIS__URL", acl_url(server, "admin"))
        out = tmp_path / "m.onnx"
        assert main(["export", "--out", str(out)]) == 0, capsys.readouterr().err
        assert f"version {UPDATES} of task 'digits' as ONNX" in capsys.readouterr().out
        assert main(["export", "--version", "99"]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert f"(kept: 0, 1 … {UPDATES};" in line  # the kept versions, read as admin
