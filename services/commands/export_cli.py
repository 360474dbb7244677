"""`fedasync export`: a trained model out, for serving or on-device inference.

    fedasync export [--run RUN_FOLDER] [--version N|latest] [--format onnx|torch|safetensors]
                    [--out FILE]

The model is read where `ledger verify` reads it (services/commands/redis_target.py): a copy of
a `fedasync up` run's saved Redis (`--run`), or the configured Redis of a live deployment. A
version is the snapshot message the snapshot service serves (`{p}:model:N`); `latest` is the
version it serves as latest (`{p}:announced`, else `{p}:version`, as services/snapshot/app.py).

- `safetensors`: the bytes the snapshot service answers `?format=safetensors` with
  (shared/model_format.to_safetensors); no task, no torch.
- `torch`: the state_dict of the run's task's module holding the version's weights.
- `onnx`: that module through `torch.onnx`, written only once `onnx.checker` passed and ONNX
  Runtime predicted what torch predicts on every sample of the task's test split (the split the
  evaluator scores: the run's task and seed), with the figures printed.

The task is the run's, as its aggregator recorded it (`{p}:run`), not this shell's
FEDASYNC_TASK__*: an export from a run folder needs no settings. Exit 0: written; 1: Redis
unreachable, or the ONNX model did not agree with torch (nothing written); 2: nothing to export
as asked (no Redis, no such version, a task that is not a torch module, a package missing), each
one line.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from fedasync.learning.dataset import Dataset
    from fedasync.learning.task import Task
    from fedasync.services.runtime.settings import RedisSettings, TaskSettings
    from fedasync.shared.keys import Keys
    from fedasync.shared.layout import Layout
    from fedasync.shared.model_format import ModelMessage

COMMAND = "export"
FORMATS = ("onnx", "torch", "safetensors")
#: the file name's ending of each format
SUFFIX = {"onnx": ".onnx", "torch": ".pt", "safetensors": ".safetensors"}
#: exit code: the ONNX model did not predict what torch predicts (as `ledger verify`'s 1)
DISAGREES = 1
#: tries at `latest` when the version read was pruned before its model was (a live deployment
#: keeps the last FEDASYNC_AGGREGATOR__KEEP_VERSIONS)
LATEST_TRIES = 3


def version_arg(text: str) -> int | None:
    """`--version`: a version number, or `latest` (None)."""
    if text == "latest":
        return None
    try:
        version = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a version number nor latest") from None
    if version < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: versions start at 0")
    return version


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run",
        type=Path,
        metavar="RUN_FOLDER",
        help="a `fedasync up` run folder (runs/up-…): start a copy of its saved Redis and read "
        "that, instead of FEDASYNC_REDIS__URL; the folder itself is not written",
    )
    parser.add_argument(
        "--version",
        type=version_arg,
        default=None,
        metavar="N|latest",
        help="the model version to export (default: latest, the one the snapshot service serves)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="onnx",
        help="onnx: the task's torch module through torch.onnx, checked against torch on the "
        "task's test split; torch: its state_dict (torch.save); safetensors: the weights as the "
        "snapshot service serves them (default: onnx)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="file to write (default: model-vN.onnx, .pt or .safetensors in this folder)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from fedasync.services.commands.redis_target import run_or_configured
    from fedasync.services.runtime.settings import load_settings

    settings = load_settings()
    alternative = ", or give --run runs/up-… to export a model of a `fedasync up` run"
    with run_or_configured(args.run, settings.redis, COMMAND, alternative) as redis_settings:
        read = asyncio.run(_read(redis_settings, args.version, settings.wire.max_message_bytes))
    return _write(args, read, settings.task)


@dataclass(frozen=True, slots=True)
class Read:
    """What export needs from Redis: the version's model and the run's task."""

    message: ModelMessage
    #: the task as the run's aggregator recorded it (name, params, seed); None: not recorded
    task: dict[str, Any] | None


async def _read(settings: RedisSettings, version: int | None, max_message_bytes: int) -> Read:
    from fedasync.services.commands.redis_target import talking_to
    from fedasync.services.runtime.redis_conn import connect
    from fedasync.services.stores.run_record import recorded_task
    from fedasync.shared.keys import Keys

    redis = connect(settings)
    keys = Keys(settings.key_prefix)

    async def read() -> Read:
        raw = await _model(redis, keys, settings, version)
        return Read(_decoded(raw, max_message_bytes), await recorded_task(redis, keys))

    try:
        return await talking_to(settings, COMMAND, read)
    finally:
        await redis.aclose()


async def _model(
    redis: aioredis.Redis, keys: Keys, settings: RedisSettings, version: int | None
) -> bytes:
    """The snapshot message of `version` (None: latest), or a CommandError saying why not."""
    from fedasync.services.commands.errors import CommandError
    from fedasync.services.commands.redis_target import redis_where
    from fedasync.services.runtime.redis_conn import get_bytes

    for _ in range(LATEST_TRIES if version is None else 1):
        wanted = version
        if wanted is None:
            # two GETs, not an MGET: what the admin user may send (services/stores/acl.py)
            announced: Any = await redis.get(keys.announced)
            committed: Any = None if announced is not None else await redis.get(keys.version)
            latest = announced if announced is not None else committed
            if latest is None:
                raise CommandError(
                    f"{COMMAND}: no training under the key prefix {keys.prefix!r} at "
                    f"{redis_where(settings)} (no version committed): check "
                    "FEDASYNC_REDIS__KEY_PREFIX and the database in FEDASYNC_REDIS__URL"
                )
            wanted = int(latest)
        raw = await get_bytes(redis, keys.model(wanted))
        if raw is not None:
            return raw
    members: Any = await redis.zrangebyscore(keys.models, "-inf", "+inf")
    kept = [int(v) for v in members]
    raise CommandError(
        f"{COMMAND}: version {wanted} is not kept under the key prefix {keys.prefix!r} "
        f"({_kept(kept)}; FEDASYNC_AGGREGATOR__KEEP_VERSIONS sets how many are)"
    )


def _kept(versions: list[int]) -> str:
    if not versions:
        return "none is"
    shown = ", ".join(map(str, versions)) if len(versions) <= 3 else None
    if shown is None:
        shown = f"{versions[0]}, {versions[1]} … {versions[-1]}"
    return f"kept: {shown}"


def _decoded(raw: bytes, max_message_bytes: int) -> ModelMessage:
    from fedasync.services.commands.errors import CommandError
    from fedasync.shared.model_format import decode_model
    from fedasync.shared.wire import WireError

    try:
        return decode_model(raw, max(max_message_bytes, len(raw)))
    except WireError as exc:
        raise CommandError(f"{COMMAND}: the stored model does not decode: {exc}") from None


def _write(args: argparse.Namespace, read: Read, task_settings: TaskSettings) -> int:
    from fedasync.services.commands.errors import CommandError
    from fedasync.shared.model_format import to_safetensors

    snapshot = read.message.snapshot
    out: Path = args.out or Path(f"model-v{snapshot.version}{SUFFIX[args.format]}")
    if args.format == "safetensors":
        _save(out, to_safetensors(snapshot))
        print(
            f"wrote {out}: version {snapshot.version} as safetensors ({out.stat().st_size} bytes)"
        )
        return 0
    from fedasync.learning.model_export import (
        OPSET,
        ExportError,
        NotATorchModule,
        agreement,
        onnx_bytes,
        state_dict_bytes,
        torch_module,
        torch_task,
    )

    name, params, seed = _run_task(read, task_settings)
    task = _task(name, params)
    try:
        torch_model = torch_task(task, name)
        _same_layout(name, task.layout, snapshot.layout)
        module = torch_module(torch_model, name, snapshot.weights)
        if args.format == "torch":
            _save(out, state_dict_bytes(module))
            print(
                f"wrote {out}: version {snapshot.version} of task {name!r} as a torch state_dict "
                f"({out.stat().st_size} bytes)"
            )
            return 0
        test = _test_split(name, task, seed)
        metadata = {"fedasync.version": str(snapshot.version), "fedasync.task": name}
        model = onnx_bytes(module, test.X[:1], metadata)
        agreed = agreement(model, module, test, task.num_classes)
    except NotATorchModule as exc:
        raise CommandError(f"{COMMAND} --format {args.format}: {exc}") from None
    except ExportError as exc:
        raise CommandError(f"{COMMAND}: {exc}") from None
    if not agreed.ok:
        raise CommandError(
            f"{COMMAND}: the ONNX model does not predict what torch does, nothing written: "
            f"{agreed.describe()}",
            DISAGREES,
        )
    _save(out, model)
    print(
        f"wrote {out}: version {snapshot.version} of task {name!r} as ONNX (opset {OPSET}, "
        f"{len(model)} bytes); onnx.checker passed; {agreed.describe()}"
    )
    return 0


def _run_task(read: Read, own: TaskSettings) -> tuple[str, dict[str, Any], int]:
    """The run's task (name, params, seed); this process's settings if the run recorded none."""
    if read.task is None:
        print(
            "the run recorded no task (data of an earlier release): exporting with this "
            f"shell's FEDASYNC_TASK__* (task {own.name!r}, seed {own.seed})",
            file=sys.stderr,
        )
        return own.name, dict(own.params), own.seed
    return str(read.task["name"]), dict(read.task.get("params") or {}), int(read.task["seed"])


def _task(name: str, params: dict[str, Any]) -> Task:
    """The run's task, built here, or one line saying why not."""
    from fedasync.learning.tasks import TaskError, get_task
    from fedasync.services.commands.errors import CommandError

    try:
        return get_task(name, **params)
    except TaskError as exc:
        raise CommandError(f"{COMMAND}: the run's {exc}") from None


def _same_layout(name: str, built: Layout, stored: Layout) -> None:
    """The task built here cuts the vector as the run did, or one line saying it does not."""
    from fedasync.services.commands.errors import CommandError

    if built != stored:
        raise CommandError(
            f"{COMMAND}: task {name!r} built here has {built.size} weights in "
            f"{len(built.tensors)} tensors, the stored model {stored.size} in "
            f"{len(stored.tensors)}: not the model of this task (another version of its code?)"
        )


def _test_split(name: str, task: Task, seed: int) -> Dataset:
    """The task's test split as the evaluator scores it: its data from the run seed's stream."""
    from fedasync.learning.tasks import TaskBuildError, task_data
    from fedasync.services.commands.errors import CommandError
    from fedasync.shared.seeds import Stream, stream

    try:
        _, test = task_data(name, task, stream(seed, Stream.DATA))
    except TaskBuildError as exc:
        raise CommandError(f"{COMMAND}: {exc}") from None
    if len(test) == 0:
        raise CommandError(f"{COMMAND}: task {name!r} has no test samples to check the ONNX on")
    return test


def _save(out: Path, data: bytes) -> None:
    """Write `data` to `out` whole or not at all: a reader never sees half a model."""
    from fedasync.services.commands.errors import CommandError

    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    except OSError as exc:
        raise CommandError(f"{COMMAND}: --out {out}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as open() would have made it, not mkstemp's 0600
        os.replace(temporary, out)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise CommandError(f"{COMMAND}: --out {out}: {exc.strerror}") from None
