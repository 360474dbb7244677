"""A task's own code failing, said in one line: the task, the method and the user's own frame.

A task's `train` or `evaluate` that raises deep inside torch gives a 20–30 frame traceback, most
of it fedasync's and the libraries' frames; the one that matters is the user's line. Every place
that runs a task's code (the worker, the evaluator, the simulator) calls it through `run_task`,
which turns any exception into a `TaskCodeError`: one line naming the task, the method and the
innermost frame of the user's own code (file:line), with the whole traceback kept as text for
the log (text, not the exception chain, so it survives the simulator's worker processes).
"""

from __future__ import annotations

import sysconfig
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import numpy as np

from fedasync.learning.dataset import Dataset
from fedasync.learning.evaluation import Evaluation
from fedasync.learning.task import Task

if TYPE_CHECKING:
    from fedasync.learning.dpsgd import DeviceAccountant

P = ParamSpec("P")
T = TypeVar("T")

#: fedasync's own code: the package and the folders it links to (fedasync/shared -> ../shared);
#: this file is fedasync/learning/task_failure.py, so the package is two folders up (found from
#: here, not by importing `fedasync`, which would point this layer up at the public API)
_PACKAGE = Path(__file__).parent.parent
_OURS = tuple(
    {_PACKAGE.resolve()}
    | {(_PACKAGE / part).resolve() for part in ("shared", "services", "learning", "sim", "client")}
)
#: the standard library's and installed packages' folders (numpy, torch: not the user's code)
_LIBRARIES = tuple(
    Path(path).resolve()
    for key in ("stdlib", "platstdlib", "purelib", "platlib")
    if (path := sysconfig.get_paths().get(key))
)


class TaskCodeError(RuntimeError):
    """A task's own method raised; the message is the one line, `details` the traceback."""

    def __init__(self, message: str, details: str = "") -> None:
        super().__init__(message)
        self.details = details

    def __reduce__(self) -> tuple[type[TaskCodeError], tuple[str, str]]:
        return TaskCodeError, (str(self), self.details)


def reason(exc: BaseException) -> str:
    """An exception as one line: its type and its message with the whitespace collapsed."""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _under(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path.is_relative_to(root) for root in roots)


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of the user's own code in `exc`'s traceback: not fedasync's, not the
    standard library's nor an installed package's; failing that (a task installed with pip), the
    first frame past fedasync's own; None when every frame is fedasync's."""
    frames = traceback.extract_tb(exc.__traceback__)
    theirs = [f for f in frames if not _under(Path(f.filename).resolve(), _OURS)]
    own = [f for f in theirs if not _under(Path(f.filename).resolve(), _LIBRARIES)]
    if own:
        return own[-1]
    return theirs[0] if theirs else None


def describe(task: str, method: str, exc: BaseException) -> str:
    """`task 'pkg.mod:Task': its train failed at /path/mod.py:34 (in train): KeyError: 'lr'`."""
    frame = user_frame(exc)
    where = "" if frame is None else f" at {frame.filename}:{frame.lineno} (in {frame.name})"
    return f"task {task!r}: its {method} failed{where}: {reason(exc)}"


def run_task(task: str, method: str, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`call(*args, **kwargs)`, a method of the task named `task`; any exception it raises comes
    out as one TaskCodeError (the original as its cause, its traceback in `details`)."""
    try:
        return call(*args, **kwargs)
    except Exception as exc:  # the user's code: whatever it raises is reported the same way
        details = "".join(traceback.format_exception(exc))
        raise TaskCodeError(describe(task, method, exc), details) from exc


class GuardedTask(Task):
    """A task whose methods are called through `run_task`: the form in which the worker, the
    evaluator and the simulator hold the task, so that none of them can forget the guard."""

    def __init__(self, task: Task, named: str) -> None:
        self.task, self.named = task, named
        self.name, self.layout = task.name, task.layout
        self.num_classes, self.suggested = task.num_classes, task.suggested

    def init_weights(self, rng: np.random.Generator) -> np.ndarray:
        return run_task(self.named, "init_weights", self.task.init_weights, rng)

    def dataset(self, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
        return run_task(self.named, "dataset", self.task.dataset, rng)

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
        # `privacy` only when given: a task without DP-SGD is called exactly as before
        extra: dict[str, Any] = {} if privacy is None else {"privacy": privacy}
        return run_task(
            self.named,
            "train",
            self.task.train,
            weights,
            data,
            rng,
            epochs=epochs,
            lr=lr,
            batch_size=batch_size,
            **extra,
        )

    def evaluate(self, weights: np.ndarray, data: Dataset) -> Evaluation:
        return run_task(self.named, "evaluate", self.task.evaluate, weights, data)

    def gradient(self, weights: np.ndarray, data: Dataset) -> np.ndarray:
        if type(self.task).gradient is Task.gradient:  # not implemented: the contract's error
            return self.task.gradient(weights, data)
        return run_task(self.named, "gradient", self.task.gradient, weights, data)

    def check_weights(self, weights: np.ndarray) -> None:
        self.task.check_weights(weights)  # fedasync's own check: its ValueError is the contract


def guarded(task: Task, named: str) -> Task:
    """`task` (named `named` in the settings or config) with its methods guarded, once."""
    return task if isinstance(task, GuardedTask) else GuardedTask(task, named)


def keep_details(exc: TaskCodeError) -> Path:
    """Write the traceback where a command without a log (`fedasync simulate`) can point to it."""
    with tempfile.NamedTemporaryFile(
        "w", prefix="fedasync-task-error-", suffix=".txt", delete=False
    ) as file:
        file.write(exc.details)
    return Path(file.name)
