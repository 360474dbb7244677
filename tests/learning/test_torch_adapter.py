"""fedasync.torch: a module as a flat float32 vector and back, exactly, with its rules enforced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedasync.shared.layout import LayoutError
from fedasync.torch import (
    UnsupportedTensorError,
    VectorMismatchError,
    layout_of,
    load_vector,
    to_vector,
)
from tests.learning.torch_models import SmallCNN

ROOT = Path(__file__).resolve().parents[2]
PARAMS = ["conv.weight", "conv.bias", "norm.weight", "norm.bias", "head.weight", "head.bias"]


def cnn(seed: int) -> SmallCNN:
    torch.manual_seed(seed)
    model = SmallCNN()
    with torch.no_grad():  # running statistics that differ between seeds, as after training
        model.norm.running_mean.normal_()
        model.norm.running_var.uniform_(0.5, 2.0)
        model.norm.num_batches_tracked.fill_(seed)
    return model


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("buffers", [True, False])
def test_round_trip_module_vector_module_is_exact(buffers: bool) -> None:
    source, target = cnn(1), cnn(2)
    vector = to_vector(source, buffers=buffers)
    layout = layout_of(source, buffers=buffers)
    assert vector.dtype == np.float32
    assert vector.shape == (layout.size,)
    load_vector(target, vector, buffers=buffers, layout=layout)
    assert to_vector(target, buffers=buffers).tobytes() == vector.tobytes()
    for name, _ in layout.tensors:
        assert torch.equal(target.state_dict()[name], source.state_dict()[name]), name


def test_buffers_included_or_excluded_and_counters_never_carried() -> None:
    source, target = cnn(1), cnn(2)
    with_buffers = layout_of(source, buffers=True)
    without = layout_of(source, buffers=False)
    assert [name for name, _ in without.tensors] == PARAMS  # state_dict order
    assert [name for name, _ in with_buffers.tensors] == [
        *PARAMS[:4],
        "norm.running_mean",
        "norm.running_var",
        *PARAMS[4:],
    ]
    assert with_buffers.size == without.size + 2 * 4
    own = state(target)

    load_vector(target, to_vector(source, buffers=False), buffers=False)
    assert torch.equal(target.norm.weight, source.norm.weight)
    assert torch.equal(target.norm.running_mean, own["norm.running_mean"])  # stays the device's

    load_vector(target, to_vector(source, buffers=True), buffers=True)
    assert torch.equal(target.norm.running_mean, source.norm.running_mean)
    assert torch.equal(target.norm.running_var, source.norm.running_var)
    assert int(target.norm.num_batches_tracked) == 2  # an int64 counter: never carried


def test_a_wrong_size_vector_names_the_tensor() -> None:
    model = cnn(0)
    vector = to_vector(model, buffers=False)
    with pytest.raises(VectorMismatchError, match=r"head\.weight") as short:
        load_vector(model, vector[:-20], buffers=False)
    assert short.value.tensor == "head.weight"
    with pytest.raises(VectorMismatchError, match=r"head\.bias") as long:
        load_vector(model, np.concatenate([vector, np.zeros(3, np.float32)]), buffers=False)
    assert long.value.tensor == "head.bias"
    with pytest.raises(VectorMismatchError, match="1-D float32"):
        load_vector(model, vector.astype(np.float64), buffers=False)
    assert isinstance(short.value, LayoutError)
    assert isinstance(short.value, ValueError)


def test_a_vector_of_another_layout_names_the_first_tensor_that_differs() -> None:
    wider = SmallCNN(channels=5)
    model = cnn(0)
    layout = layout_of(wider, buffers=False)
    with pytest.raises(VectorMismatchError, match=r"conv\.weight") as error:
        load_vector(model, to_vector(wider, buffers=False), buffers=False, layout=layout)
    assert error.value.tensor == "conv.weight"
    with pytest.raises(VectorMismatchError, match=r"norm\.running_mean") as extra:
        load_vector(
            model,
            to_vector(model, buffers=False),
            buffers=True,
            layout=layout_of(model, buffers=False),
        )
    assert extra.value.tensor == "norm.running_mean"


class Counted(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3, dtype=dtype), requires_grad=dtype.is_floating_point)


def test_a_non_float_or_inexact_parameter_is_refused_by_name() -> None:
    for dtype in (torch.int64, torch.float64, torch.complex64):
        with pytest.raises(UnsupportedTensorError, match="'scale'") as error:
            to_vector(Counted(dtype), buffers=False)
        assert error.value.tensor == "scale"
        assert str(dtype) in str(error.value)
        with pytest.raises(UnsupportedTensorError):
            layout_of(Counted(dtype), buffers=True)


def test_the_buffers_choice_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="buffers must be True or False"):
        layout_of(cnn(0), buffers="false")  # type: ignore[arg-type]


def test_a_float64_buffer_is_refused_only_when_carried() -> None:
    model = nn.Linear(2, 2)
    model.register_buffer("stats", torch.zeros(2, dtype=torch.float64))
    assert layout_of(model, buffers=False).size == 6
    with pytest.raises(UnsupportedTensorError, match=r"'stats'.*buffer of dtype torch\.float64"):
        layout_of(model, buffers=True)


def test_half_precision_travels_exactly() -> None:
    torch.manual_seed(0)
    source, target = nn.Linear(4, 3).half(), nn.Linear(4, 3).half()
    vector = to_vector(source, buffers=True)
    assert vector.dtype == np.float32
    load_vector(target, vector, buffers=True)
    assert target.weight.dtype == torch.float16
    assert torch.equal(target.weight, source.weight)


def test_tied_weights_travel_once() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encode = nn.Linear(3, 3, bias=False)
            self.decode = nn.Linear(3, 3, bias=False)
            self.decode.weight = self.encode.weight

    model = Tied()
    assert layout_of(model, buffers=True).tensors == (("encode.weight", (3, 3)),)
    load_vector(model, np.arange(9, dtype=np.float32), buffers=True)
    assert torch.equal(model.decode.weight, model.encode.weight)
    assert model.decode.weight[2, 2].item() == 8.0


def test_vectors_and_modules_never_share_memory() -> None:
    model = cnn(0)
    vector = to_vector(model, buffers=True)
    kept = vector.copy()
    with torch.no_grad():
        model.conv.weight.add_(1.0)
        model.norm.running_mean.add_(1.0)
    assert np.array_equal(vector, kept)  # the vector is not a view of the module

    load_vector(model, vector, buffers=True)
    loaded = state(model)
    vector += 1.0
    for name, value in model.state_dict().items():
        assert torch.equal(value, loaded[name]), name  # the module is not a view of the vector
    with torch.no_grad():
        model.head.bias.mul_(3.0)
    assert np.array_equal(vector, kept + 1.0)


def test_a_read_only_vector_loads_without_a_warning() -> None:
    model = cnn(0)
    vector = to_vector(model, buffers=False)
    vector.flags.writeable = False  # what a device holds: the served snapshot, frozen
    load_vector(model, vector, buffers=False)  # filterwarnings=error: a warning would fail


def test_importing_the_adapter_needs_no_torch() -> None:
    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"
        "import fedasync, fedasync.torch\n"
        "try:\n"
        "    fedasync.torch.layout_of(object(), buffers=False)\n"
        "except ImportError:\n"
        "    print('needs torch when called')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "needs torch when called"
