"""A trained model out of fedasync: the torch module rebuilt from a version's flat weights, as a
torch state_dict or as ONNX, and the ONNX file checked against torch before anyone serves it.

fedasync moves one flat float32 vector in a `Layout`; a serving stack or a device runtime wants
the model itself. A `TorchTask` knows its module (`model()`) and how the vector fills it
(`load`), so the module a version stands for is rebuilt exactly as the evaluator's torch path
scores it (`torch_module`: `forked(0)`, `load`, eval mode), and exported from there:

- `state_dict_bytes`: `torch.save` of the module's state_dict (load it into `model()`);
- `onnx_bytes`: `torch.onnx.export` of the module, batch size dynamic;
- `agreement`: `onnx.checker` on the file, then ONNX Runtime and torch on the same rows (the
  task's test split): equal predictions on every row (argmax for a classifier; values within
  `RTOL`/`ATOL` for regression), and the largest difference of any output.

A task that is not a torch module (numpy models such as `linear`) has no module to export:
`NotATorchModule`, one line saying why and that its weights still leave as safetensors. torch,
onnx and onnxruntime are imported when a function runs, never at import.
"""

from __future__ import annotations

import io
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedasync.learning.dataset import Dataset
from fedasync.learning.task import Task
from fedasync.learning.task_failure import GuardedTask, reason
from fedasync.learning.torch_task import TorchTask

if TYPE_CHECKING:
    from torch import nn

#: the ONNX opset written: supported by every ONNX Runtime since 1.12 (2022), so by the runtimes
#: devices ship with, and enough for the layers tasks are made of (convolutions, BatchNorm, pooling)
OPSET = 17
#: the names of the graph's input (a batch of feature rows, as a `Dataset` holds them) and output
INPUT, OUTPUT = "features", "output"
#: how close ONNX Runtime's outputs must be to torch's to count as the same prediction for a
#: regression task (a classifier's prediction is its argmax, which must be equal)
RTOL, ATOL = 1e-4, 1e-5
#: rows per forward pass when comparing (the evaluator's batch size)
BATCH = 1024


class ExportError(ValueError):
    """This model cannot be exported as asked; the message is one line saying why."""


class NotATorchModule(ExportError):
    """The task's model is not a torch module, so there is no module to write as ONNX or torch."""


class MissingPackage(ExportError):
    """A package the format needs (torch; onnx and onnxruntime) is not installed."""


@dataclass(frozen=True, slots=True)
class Agreement:
    """ONNX Runtime's outputs against torch's on the same rows."""

    samples: int
    #: rows on which both predict the same (argmax; or values within RTOL/ATOL for regression)
    equal: int
    #: the largest |onnx - torch| over every output of every row
    max_difference: float
    classification: bool

    @property
    def ok(self) -> bool:
        return self.equal == self.samples

    def describe(self) -> str:
        what = "equal predictions (argmax)" if self.classification else "equal values"
        return (
            f"onnxruntime vs torch on {self.samples} test samples: {self.equal} {what}, "
            f"max |output difference| {self.max_difference:.3g}"
        )


def torch_task(task: Task, task_name: str) -> TorchTask:
    """`task` as the TorchTask it is, or NotATorchModule: only a torch module can be exported."""
    inner = task.task if isinstance(task, GuardedTask) else task
    if not isinstance(inner, TorchTask):
        raise NotATorchModule(
            f"task {task_name!r}: {type(inner).__name__} is not a fedasync.TorchTask, so its "
            "model is no torch module to export (its weights still leave as safetensors)"
        )
    return inner


def torch_module(task: TorchTask, task_name: str, weights: np.ndarray) -> nn.Module:
    """The module `weights` stand for, in eval mode: `model()` holding them (buffers the
    vector does not carry are `model()`'s own under torch seed 0, as the evaluator's torch
    path has them)."""
    _need_torch()
    try:
        with task.forked(0):
            module = task.load(np.asarray(weights, np.float32))
    except ValueError as exc:  # the vector is not this module's (LayoutError is one)
        raise ExportError(
            f"task {task_name!r}: these weights do not fit its module: {exc}"
        ) from exc
    except Exception as exc:  # the user's model(): any failure is reported, none escapes
        raise ExportError(f"task {task_name!r}: building its module failed: {reason(exc)}") from exc
    module.eval()
    return module


def state_dict_bytes(module: nn.Module) -> bytes:
    """`torch.save(module.state_dict())`: read back with `torch.load(..., weights_only=True)`
    and `model().load_state_dict(...)`."""
    import torch

    out = io.BytesIO()
    torch.save(module.state_dict(), out)
    return out.getvalue()


def onnx_bytes(module: nn.Module, example: np.ndarray, metadata: Mapping[str, str]) -> bytes:
    """`module` as an ONNX model (opset OPSET, any batch size), `metadata` in its properties.

    The TorchScript-based exporter (`dynamo=False`), not torch 2.x's default dynamo one: it ships
    inside the pinned torch and needs nothing more, where the dynamo exporter needs `onnxscript`
    (and its `onnx-ir`) on top, for the plain feed-forward modules tasks are (traced once on
    `example`, one batch of feature rows). torch 2.9+ warns that it is deprecated; the warning
    is silenced here alone. It traces: a module whose forward branches in Python on a tensor's
    value would be fixed to `example`'s branch, so torch's TracerWarning saying so is an
    ExportError here. When the torch pin moves to a release without it, switch to
    `dynamo=True` with `onnxscript`: `agreement` is the check that says the switch is right.
    """
    _need_onnx()
    import onnx
    import torch

    sample = torch.from_numpy(np.ascontiguousarray(example, np.float32))
    with tempfile.TemporaryDirectory(prefix="fedasync-onnx-") as folder:
        out = Path(folder) / "model.onnx"
        try:
            with warnings.catch_warnings(record=True) as said, torch.no_grad():
                warnings.simplefilter("always")
                warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX.*")
                warnings.filterwarnings("ignore", message=".*feature will be removed.*")
                torch.onnx.export(
                    module,
                    (sample,),
                    out,
                    dynamo=False,
                    opset_version=OPSET,
                    input_names=[INPUT],
                    output_names=[OUTPUT],
                    dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
                )
        except Exception as exc:  # the user's module: any failure is reported, none escapes
            raise ExportError(f"torch.onnx could not export the module: {reason(exc)}") from exc
        # public as torch.jit.TracerWarning, which torch's own type hints do not re-export
        tracer_warning: type[Warning] = torch.jit.TracerWarning  # type: ignore[attr-defined]
        for warning in said:
            if issubclass(warning.category, tracer_warning):
                # a Python branch on a tensor's value: the file would hold the example's branch
                raise ExportError(
                    "torch.onnx traced the module into a graph that may not hold for other "
                    f"inputs: {warning.category.__name__}: {' '.join(str(warning.message).split())}"
                )
            warnings.warn_explicit(
                warning.message, warning.category, warning.filename, warning.lineno
            )
        model = onnx.load(out)
    onnx.helper.set_model_props(model, dict(metadata))
    return bytes(model.SerializeToString())


def agreement(onnx_model: bytes, module: nn.Module, data: Dataset, num_classes: int) -> Agreement:
    """`onnx.checker` on `onnx_model` (an ExportError if invalid), then its outputs under ONNX
    Runtime against `module`'s on every row of `data`."""
    _need_onnx()
    import onnx
    import onnxruntime
    import torch

    try:
        onnx.checker.check_model(onnx.load_from_string(onnx_model), full_check=True)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"onnx.checker refused the exported model: {reason(exc)}") from exc

    session = onnxruntime.InferenceSession(onnx_model, providers=["CPUExecutionProvider"])
    X = np.ascontiguousarray(data.X, np.float32)
    equal, largest = 0, 0.0
    for start in range(0, len(X), BATCH):
        rows = X[start : start + BATCH]
        try:
            ours = np.asarray(session.run([OUTPUT], {INPUT: rows})[0], np.float64)
            with torch.no_grad():
                theirs = module(torch.from_numpy(rows.copy())).double().numpy()
        except Exception as exc:  # the user's module, or a graph that fails on other rows
            raise ExportError(
                f"running the model on the test samples failed: {reason(exc)}"
            ) from exc
        ours, theirs = ours.reshape(len(rows), -1), theirs.reshape(len(rows), -1)
        if len(rows):
            largest = max(largest, float(np.max(np.abs(ours - theirs))))
        if num_classes:
            same = np.argmax(ours, axis=1) == np.argmax(theirs, axis=1)
        else:
            same = np.all(np.isclose(ours, theirs, rtol=RTOL, atol=ATOL), axis=1)
        equal += int(np.count_nonzero(same))
    return Agreement(len(X), equal, largest, classification=bool(num_classes))


def _need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise MissingPackage(
            "exporting a torch module needs torch: install it (pinned: "
            "pip install torch==2.13.0, as the README says)"
        ) from None


def _need_onnx() -> None:
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise MissingPackage(
            f"ONNX export needs {exc.name or 'onnx'}: pip install 'fedasync[export]' "
            "(onnx and onnxruntime)"
        ) from None
