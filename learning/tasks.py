"""How a task is named: a built-in name (`digits`) or an import path (`package.module:attribute`).

One resolver, `get_task`, for every place that names a task (the settings every service reads,
`fedasync up`, simulator configs), so a name that works in one works in all, and a bad name fails
with the same typed error everywhere, before anything is started. The attribute of an import path
is a `Task` subclass or a callable returning a Task; either is called with the task's params as
keyword arguments. The module must be importable: installed with pip, or its folder on PYTHONPATH.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from numbers import Integral
from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from fedasync.learning.dataset import Dataset
from fedasync.learning.digits import DigitsMLP
from fedasync.learning.linear import LinearRegression
from fedasync.learning.synthetic import SyntheticClassification
from fedasync.learning.task import Task, TrainParams
from fedasync.learning.task_failure import reason
from fedasync.shared.layout import Layout, LayoutError

#: the built-in tasks, by the names configs and settings use
TASKS: dict[str, Callable[..., Task]] = {
    "linear": LinearRegression,
    "synthetic": SyntheticClassification,
    "digits": DigitsMLP,
}

#: what every task must carry besides its four methods (learning/task.py): type, and as said
_ATTRIBUTES: dict[str, tuple[type, str]] = {
    "name": (str, "a str"),
    "layout": (Layout, "a fedasync.Layout"),
    "num_classes": (Integral, "an int >= 0 (0 for regression)"),
    "suggested": (TrainParams, "a fedasync.TrainParams"),
}


class TaskError(ValueError):
    """A task name that does not give a task; the message starts with `task '<name>':`."""


class TaskNameError(TaskError):
    """Neither a built-in name nor a well-formed `package.module:attribute`."""


class TaskImportError(TaskError):
    """The module of an import path is not installed, or raised while being imported."""


class TaskAttributeError(TaskError):
    """The module has no such attribute."""


class NotATaskError(TaskError):
    """The attribute is not a Task subclass or factory, or what it built is not a usable Task."""


class TaskParamsError(TaskError):
    """The params do not fit the task's signature, or the task refused their values."""


class TaskBuildError(TaskError):
    """The task's constructor or factory failed for a reason other than its params."""


def check_name(name: str) -> None:
    """Refuse a name that cannot name a task, without importing anything (settings use this)."""
    if name in TASKS:
        return
    if ":" not in name:
        hint = " (an import path needs a colon)" if "." in name else ""
        raise TaskNameError(
            f"task {name!r}: not a built-in task ({', '.join(sorted(TASKS))}) nor an import "
            f"path package.module:attribute{hint}"
        )
    module, _, attribute = name.partition(":")
    if not _dotted(module) or not _dotted(attribute):
        raise TaskNameError(
            f"task {name!r}: an import path is package.module:attribute, dotted Python names "
            "on both sides of one colon"
        )


def _named_task(name: str) -> str:
    try:
        check_name(name)
    except TaskError as exc:
        raise PydanticCustomError("task_name", "{reason}", {"reason": str(exc)}) from None
    return name


#: a task's name in a settings model (the services' FEDASYNC_TASK__NAME, the simulator's
#: [task] name): checked by check_name, its refusal one line in pydantic's error
TaskName = Annotated[str, AfterValidator(_named_task)]


def get_task(name: str, **params: Any) -> Task:
    """Build the task `name` with `params`, or raise the TaskError subclass that says why not."""
    check_name(name)
    factory = TASKS[name] if name in TASKS else _import(name)
    task = _build(name, factory, params)
    _check_attributes(name, task)
    return task


def task_data(name: str, task: Task, rng: np.random.Generator) -> tuple[Dataset, Dataset]:
    """The task's (train, test) data, or one TaskBuildError line when the user's code fails.

    A param of the right name and the wrong type (`{"samples": "x"}`) passes the signature check
    in `get_task` and fails only here, deep in numpy: the evaluator, a worker and the simulator
    all make their data through this, so each reports it in one line instead of a traceback.
    """
    try:
        return task.dataset(rng)
    except Exception as exc:  # the user's code: any failure is reported, none escapes
        raise TaskBuildError(f"task {name!r}: making its data failed: {reason(exc)}") from exc


def _dotted(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _import(name: str) -> Callable[..., Task]:
    """The object `package.module:attribute` names, if it can build a Task."""
    module_name, _, attribute = name.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            raise TaskImportError(
                f"task {name!r}: no module named {missing!r} (install it with pip, or put its "
                "folder on PYTHONPATH)"
            ) from exc
        raise TaskImportError(
            f"task {name!r}: importing {module_name} failed: {reason(exc)}"
        ) from exc
    except Exception as exc:  # the user's module: any failure is reported, none escapes
        raise TaskImportError(
            f"task {name!r}: importing {module_name} failed: {reason(exc)}"
        ) from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise TaskAttributeError(
                f"task {name!r}: module {module_name} has no attribute {attribute!r}"
            ) from None
    if isinstance(target, type):
        if not issubclass(target, Task):
            raise NotATaskError(
                f"task {name!r}: {attribute} is a class but not a subclass of fedasync.Task"
            )
        if inspect.isabstract(target):
            missing_methods = ", ".join(sorted(getattr(target, "__abstractmethods__", ())))
            raise NotATaskError(f"task {name!r}: {attribute} does not implement {missing_methods}")
        return target
    if isinstance(target, Task):
        raise NotATaskError(
            f"task {name!r}: {attribute} is a Task instance; name its class, or a function that "
            "returns a new one"
        )
    if not callable(target):
        raise NotATaskError(
            f"task {name!r}: {attribute} is {type(target).__name__}, not a fedasync.Task "
            "subclass nor a callable returning one"
        )
    return target  # type: ignore[no-any-return]  # what it returns is checked in _build


def _build(name: str, factory: Callable[..., Any], params: Mapping[str, Any]) -> Task:
    """Call the class or factory with `params`; only a Task may come back."""
    try:
        signature: inspect.Signature | None = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature to read (a builtin): the call will tell
        signature = None
    if signature is not None:
        try:
            signature.bind(**params)
        except TypeError as exc:
            given = ", ".join(sorted(params)) or "none"
            accepted = ", ".join(signature.parameters) or "none"
            raise TaskParamsError(
                f"task {name!r}: the params given ({given}) do not fit the ones it takes "
                f"({accepted}): {exc}"
            ) from None
    try:
        task = factory(**params)
    except (TypeError, ValueError) as exc:
        if params and not isinstance(exc, LayoutError):  # weights it cannot carry: not params
            raise TaskParamsError(
                f"task {name!r}: params {dict(params)} refused: {reason(exc)}"
            ) from exc
        raise TaskBuildError(f"task {name!r}: building it failed: {reason(exc)}") from exc
    except Exception as exc:  # the user's code: any failure is reported, none escapes
        raise TaskBuildError(f"task {name!r}: building it failed: {reason(exc)}") from exc
    except SystemExit as exc:  # e.g. a script's main(), whose argparse found no arguments
        raise NotATaskError(
            f"task {name!r}: calling it exited (SystemExit {exc.code}): it looks like a "
            "program's entry point, not a fedasync.Task subclass nor a function returning one"
        ) from None
    if not isinstance(task, Task):
        raise NotATaskError(
            f"task {name!r}: it returned {type(task).__name__}, not a fedasync.Task"
        )
    return task


def _check_attributes(name: str, task: Task) -> None:
    """A Task whose constructor forgot an attribute would fail much later, far from the cause."""
    for attribute, (kind, wanted) in _ATTRIBUTES.items():
        value = getattr(task, attribute, None)
        valid = isinstance(value, kind)
        if isinstance(value, Integral):
            valid = valid and int(value) >= 0
        if not valid:
            got = "nothing" if value is None else f"{type(value).__name__} {value!r:.60}"
            raise NotATaskError(f"task {name!r}: its {attribute} must be {wanted}, got {got}")
