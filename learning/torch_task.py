"""A Task made of a torch model factory, a data function and the loss of a batch.

A subclass writes `model()` (a fresh `nn.Module`), `dataset(rng)` and, unless cross-entropy on
logits (classification) or mean squared error (regression) is right, `loss(model, X, y)`. The
rest of the `Task` interface comes from here: the layout from the module (`fedasync.torch`
rules), seeded initial weights, minibatch training on a private copy, and evaluation.

Reproducible to the bit: batches are shuffled by the numpy generator the interface passes, and
torch's global generator is forked and seeded from a child of that generator for the duration of
each call (dropout, random augmentation, the throw-away initialisation of a fresh module), then
restored. The child is spawned (`Generator.spawn`), which leaves the parent's stream untouched, so
a task draws the same batches whether or not torch draws anything. Training sets torch to
`threads` threads (1: sums in one order on every machine). One training at a time per process:
torch's generator and thread count are process-wide.

torch is imported when a method runs, never at import: a subclass that also overrides
`init_weights` and `evaluate` in numpy, and passes its `layout`, can be built, initialised and
scored where torch is not installed (the aggregator and evaluator images; see digits).
"""

from __future__ import annotations

import inspect
import threading
from abc import abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

import numpy as np

from fedasync.learning.dataset import Dataset
from fedasync.learning.dpsgd import DPSGDError, check_module
from fedasync.learning.evaluation import Evaluation, classification, cross_entropy, regression
from fedasync.learning.task import Task, TrainParams, batches
from fedasync.learning.task_failure import GuardedTask
from fedasync.learning.torch_weights import layout_of, load_vector, to_vector
from fedasync.shared.layout import Layout

if TYPE_CHECKING:
    import torch

    from fedasync.learning.dpsgd import DeviceAccountant


def torch_seed(rng: np.random.Generator) -> int:
    """A seed for torch from `rng`'s next spawned child; `rng`'s own stream is not advanced."""
    try:
        child = rng.spawn(1)[0]
    except TypeError:  # a bit generator without a seed sequence: draw from the stream itself
        child = rng
    return int(child.integers(0, 2**63 - 1))


class TorchTask(Task):
    """A Task from `model()`, `dataset(rng)` and optionally `loss`, `optimizer` or `train`."""

    #: torch's thread count, set for the process whenever the task runs torch (None: left alone)
    threads: int | None = 1
    #: rows per forward pass in `evaluate`
    eval_batch_size: int = 1024

    def __init__(
        self,
        *,
        name: str,
        num_classes: int,
        buffers: bool,
        suggested: TrainParams | None = None,
        layout: Layout | None = None,
    ) -> None:
        """`buffers`: carry floating buffers (BatchNorm statistics) in the weights, or leave them
        out, so every run and every evaluation starts from `model()`'s own. `layout`: pass it to
        build the task without torch; by default it is read from `model()`, so set the
        attributes `model()` uses before calling this."""
        if not isinstance(buffers, bool):
            raise TypeError(f"buffers must be True or False, got {buffers!r}")
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0: regression), got {num_classes}")
        self.name = name
        self.num_classes = num_classes
        self.buffers = buffers
        self.suggested = suggested if suggested is not None else TrainParams()
        if layout is None:
            with self.forked(0):
                layout = layout_of(self.model(), buffers=buffers)
        self.layout = layout

    @abstractmethod
    def model(self) -> torch.nn.Module:
        """A new module of this task's architecture (its initial values are the task's start)."""

    def loss(self, model: torch.nn.Module, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of one batch: cross-entropy on logits, or MSE when `num_classes` is 0."""
        import torch.nn.functional as F

        out = model(X)
        if self.num_classes:
            return F.cross_entropy(out, y)
        return F.mse_loss(out.reshape(y.shape), y)

    def optimizer(self, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer | None:
        """The optimizer of one training run; None: plain SGD, each step p ← p − lr·∂loss/∂p."""
        return None

    # -- building blocks, also for a subclass that overrides train -----------------------------

    @contextmanager
    def forked(self, seed: int) -> Iterator[None]:
        """torch's global generator seeded with `seed` inside, as it was outside."""
        import torch

        if self.threads is not None:
            torch.set_num_threads(self.threads)
        with torch.random.fork_rng(devices=[]):
            # the CPU generator only: torch.manual_seed also queues every accelerator's, slowly
            torch.default_generator.manual_seed(seed)
            yield

    def seeded(self, rng: np.random.Generator) -> AbstractContextManager[None]:
        """`forked` with a seed from a spawned child of `rng` (its stream is left as it was)."""
        return self.forked(torch_seed(rng))

    def load(self, weights: np.ndarray) -> torch.nn.Module:
        """A fresh `model()` holding a copy of `weights` (checked against the layout)."""
        self.check_weights(weights)
        model = self.model()
        load_vector(model, weights, buffers=self.buffers, layout=self.layout)
        return model

    def vector(self, model: torch.nn.Module) -> np.ndarray:
        """`model`'s weights as a new flat float32 vector in this task's layout."""
        return to_vector(model, buffers=self.buffers)

    def tensors(self, data: Dataset) -> tuple[torch.Tensor, torch.Tensor]:
        """Features as float32 and targets as int64 labels (float32 for regression)."""
        return as_tensor(data.X, np.float32), as_tensor(
            data.y, np.int64 if self.num_classes else np.float32
        )

    # -- the Task interface ---------------------------------------------------------------------

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        """The module's own initialisation, under a torch seed drawn from `rng`."""
        with self.seeded(rng):
            return self.vector(self.model())

    def train(
        self,
        weights: np.ndarray,
        data: Dataset,
        rng: np.random.Generator,
        *,
        epochs: int,
        lr: float,
        batch_size: int,
        privacy: DeviceAccountant | None = None,
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Minibatch training of a copy of `weights`; metrics are the last epoch's mean loss.

        `privacy`: train with DP-SGD (Opacus), accounted by this device's own accountant, and
        report the device's ε in the metrics (learning/dpsgd.py); None: plain training."""
        import torch

        if privacy is not None:
            return self._train_private(
                weights, data, rng, epochs=epochs, lr=lr, batch_size=batch_size, privacy=privacy
            )
        X, y = self.tensors(data)
        losses: list[float] = []
        with self.seeded(rng):
            model = self.load(weights)
            model.train()
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = self.optimizer(model, lr)
            for _ in range(epochs):
                losses.clear()
                for batch in batches(len(data), batch_size, rng):
                    index = torch.from_numpy(batch)
                    loss = self.loss(model, X[index], y[index])
                    if optimizer is None:
                        grads = torch.autograd.grad(loss, params, allow_unused=True)
                        with torch.no_grad():
                            for param, grad in zip(params, grads, strict=True):
                                if grad is not None:
                                    param.sub_(lr * grad)
                    else:
                        optimizer.zero_grad(set_to_none=True)
                        loss.backward()  # type: ignore[no-untyped-call]
                        optimizer.step()
                    losses.append(float(loss.item()))
            flat = self.vector(model)
        loss_mean = float(np.mean(losses)) if losses else 0.0
        return flat, {"loss": loss_mean, "num_samples": float(len(data))}

    def gradient(self, weights: np.ndarray, data: Dataset) -> np.ndarray:
        """∇ of `loss` over all of `data` in one batch, in eval mode (no dropout, BatchNorm's
        running statistics), on `threads` threads: the same bits in every process. Buffers,
        which no loss moves, have a zero gradient."""
        import torch

        X, y = self.tensors(data)
        with self.forked(0):
            model = self.load(weights)
            model.eval()
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            loss = self.loss(model, X, y)
            grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        by_name = {
            name: grad.detach().double().numpy()
            for (name, _), grad in zip(named, grads, strict=True)
            if grad is not None
        }
        out = np.zeros(self.layout.size, np.float64)
        start = 0
        for name, shape in self.layout.tensors:
            size = int(np.prod(shape, dtype=np.int64))
            if name in by_name:
                out[start : start + size] = by_name[name].ravel()
            start += size
        return out

    def _train_private(
        self,
        weights: np.ndarray,
        data: Dataset,
        rng: np.random.Generator,
        *,
        epochs: int,
        lr: float,
        batch_size: int,
        privacy: DeviceAccountant,
    ) -> tuple[np.ndarray, dict[str, float]]:
        """DP-SGD through Opacus: Poisson batches of expected size `batch_size`, each sample's
        gradient clipped, Gaussian noise on each batch's sum, every step in `privacy`.

        Batches and noise come from torch's generator, seeded from `rng` (`seeded`), so a run is
        reproducible to the bit on CPU. A batch Poisson sampling leaves empty still takes its
        (noise-only) step and counts in the accountant; it adds nothing to the mean loss."""
        import warnings

        import torch
        from torch.utils.data import DataLoader, TensorDataset

        X, y = self.tensors(data)
        dp = privacy.dp
        losses: list[float] = []
        # one private run at a time in a process: the warning filters below are process-wide,
        # and a run in another thread leaving its `catch_warnings` would restore them mid-run
        with _PRIVATE_RUN, self.seeded(rng), warnings.catch_warnings():
            # the seeded generator is the point (reproducible runs): Opacus warns it is not a
            # cryptographic one; torch warns that Opacus's backward hooks fire on the outputs
            # of the first layer (the data needs no gradient); Opacus warns on each run after
            # the first that a new dataset object came, which is the device's same data: all
            # three are as intended
            warnings.filterwarnings("ignore", message=".*[Ss]ecure RNG.*")
            warnings.filterwarnings("ignore", message=".*new dataset object.*")
            warnings.filterwarnings("ignore", message=".*[Ff]ull backward hook.*")
            model = self.load(weights)
            model.train()
            optimizer = self.optimizer(model, lr)
            if optimizer is None:  # plain SGD, as the non-private loop: p ← p − lr·g
                optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            loader = DataLoader(TensorDataset(X, y), batch_size=batch_size)
            private, dp_optimizer, dp_loader = privacy.engine.make_private(
                module=model,
                optimizer=optimizer,
                data_loader=loader,
                noise_multiplier=dp.noise_multiplier,
                max_grad_norm=dp.max_grad_norm,
                poisson_sampling=True,
            )
            for _ in range(epochs):
                losses.clear()
                for X_batch, y_batch in dp_loader:
                    dp_optimizer.zero_grad(set_to_none=True)
                    # an empty batch goes through too: its per-sample gradients are empty, so
                    # the step is noise alone, as the accountant assumes; its loss (the mean of
                    # nothing, NaN) is not part of the metric
                    loss = self.loss(private, X_batch, y_batch)
                    loss.backward()  # type: ignore[no-untyped-call]
                    dp_optimizer.step()
                    if len(X_batch):
                        losses.append(float(loss.item()))
            private.remove_hooks()
            flat = self.vector(model)
        privacy.runs += 1
        loss_mean = float(np.mean(losses)) if losses else 0.0
        metrics = {"loss": loss_mean, "num_samples": float(len(data))}
        return flat, metrics | privacy.metrics()

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        """Scores of the model's outputs: logits (classification) or one value per row."""
        import torch

        X = as_tensor(data.X, np.float32)
        with self.forked(0), torch.no_grad():
            model = self.load(weights)
            model.eval()
            outs = [
                model(X[i : i + self.eval_batch_size])
                for i in range(0, len(data), self.eval_batch_size)
            ]
        out = torch.cat(outs).double().numpy() if outs else np.zeros((0, max(self.num_classes, 1)))
        if self.num_classes:
            loss, _ = cross_entropy(out, data.y)
            return classification(loss, np.argmax(out, axis=1), data.y)
        return regression(out.reshape(len(data)), np.asarray(data.y, np.float64))


def check_private(task: Task, task_name: str) -> None:
    """Refuse, before anything runs, a task that cannot train with DP-SGD: only a TorchTask
    can, and only with a model Opacus supports."""
    inner = task.task if isinstance(task, GuardedTask) else task
    if not isinstance(inner, TorchTask):
        raise DPSGDError(
            f"task {task_name!r}: DP-SGD trains a fedasync.TorchTask (Opacus needs a torch "
            f"module); {type(inner).__name__} is not one"
        )
    if "privacy" not in inspect.signature(inner.train).parameters:
        raise DPSGDError(
            f"task {task_name!r}: its train() overrides TorchTask's and takes no `privacy` "
            "argument, so it cannot train with DP-SGD; use TorchTask's train (write loss() or "
            "optimizer() instead) or accept and honour `privacy`"
        )
    with inner.forked(0):
        model = inner.model()
    check_module(model, task_name)


#: held by a DP-SGD run for its duration (`TorchTask._train_private`)
_PRIVATE_RUN = threading.Lock()


def as_tensor(array: np.ndarray, dtype: type[np.generic]) -> torch.Tensor:
    """`array` as a torch tensor of `dtype`, sharing memory only when it is safe to."""
    import torch

    converted = np.ascontiguousarray(array, dtype=dtype)
    if not converted.flags.writeable:  # torch warns on read-only memory: copy it
        converted = converted.copy()
    return torch.from_numpy(converted)
