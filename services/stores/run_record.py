"""What a run is, as its aggregator recorded it: the task every process builds, and the budget.

Every process of a run must build the same task (name, params, seed): the aggregator's initial
model, the workers' data and the evaluator's test split all come from it. Each process reads its
own FEDASYNC_TASK__* variables, so a service restarted by hand with another seed would train or
score something else, silently. The aggregator records the task in `{p}:run` when training starts
(HSETNX: the first one stays), and every process that builds the task compares its own with it
before it starts: a difference is invalid settings, one line naming each variable, exit code 2.
The aggregator compares before it raises the epoch, so a misconfigured second aggregator never
fences off the running one.

The budget in `{p}:run` is the aggregator's, rewritten at each of its starts: the control service
computes the budget left (and checks budget changes) against the budget that ends training, not
its own variables, which an operator starting services one by one may have left at the default.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_conn import TRANSIENT, as_text
from fedasync.services.runtime.settings import (
    BudgetSettings,
    Problem,
    SettingsError,
    TaskSettings,
)
from fedasync.shared.keys import Keys

log = logging.getLogger(__name__)

#: the task fields that make a run what it is (the data split's fields may differ per process)
TASK_FIELDS = ("name", "params", "seed")
_TASK, _BUDGET = "task", "budget"


def task_identity(task: TaskSettings) -> dict[str, Any]:
    """The fields of the task that every process of a run must share, as JSON values."""
    dumped = task.model_dump(mode="json")
    return {name: dumped[name] for name in TASK_FIELDS}


def differences(recorded: dict[str, Any], own: dict[str, Any]) -> SettingsError | None:
    """The error naming each task field this process sets otherwise than the run; None if none."""
    problems = []
    for name in TASK_FIELDS:
        if name in recorded and recorded[name] != own.get(name):
            message = (
                f"{json.dumps(own.get(name))} here, but this run's task has "
                f"{json.dumps(recorded[name])}: every process of a run builds the same task "
                "(use the run's value, or start a new run under another FEDASYNC_REDIS__KEY_PREFIX)"
            )
            problems.append(Problem(("task", name), None, message))
    return SettingsError.of(tuple(problems)) if problems else None


async def recorded_task(redis: aioredis.Redis, keys: Keys) -> dict[str, Any] | None:
    """The task this run was started with; None before the aggregator's first start (or for
    data written by a release that did not record it)."""
    raw: Any = await redis.hget(keys.run, _TASK)
    return None if raw is None else dict(json.loads(as_text(raw)))


async def check_task(redis: aioredis.Redis, keys: Keys, task: TaskSettings) -> bool:
    """Raise SettingsError if this process's task is not the run's; whether there was a run's
    task to compare with (nothing recorded yet: no check, False)."""
    recorded = await recorded_task(redis, keys)
    if recorded is None:
        return False
    error = differences(recorded, task_identity(task))
    if error is not None:
        raise error
    return True


class RunCheck:
    """`check_task` for a process that may start before it can compare (the evaluator, a
    worker): Redis away, or no task recorded yet because the aggregator has not started.

    Such a process compares at start and again before each of its writes (a worker's update, the
    evaluator's record) until it has compared once, so nothing it writes comes from another task
    unnoticed. A different task raises SettingsError; Redis away is logged (once) and left to the
    next write.
    """

    def __init__(self, redis: aioredis.Redis, keys: Keys, task: TaskSettings) -> None:
        self.redis = redis
        self.keys = keys
        self.task = task
        #: compared with the run's task, and the same
        self.compared = False
        self._warned = False

    async def ensure(self) -> None:
        if self.compared:
            return
        try:  # nothing recorded yet (the aggregator has not started): compare at the next write
            self.compared = await check_task(self.redis, self.keys, self.task)
        except TRANSIENT as exc:
            if not self._warned:
                log.warning("task not yet checked against the run's: Redis unreachable (%s)", exc)
                self._warned = True


async def record_run(
    redis: aioredis.Redis, keys: Keys, task: TaskSettings, budget: BudgetSettings
) -> None:
    """The aggregator's start: its task, if none is recorded yet, and its budget, always."""
    async with redis.pipeline(transaction=False) as pipe:  # each write stands on its own
        pipe.hsetnx(keys.run, _TASK, json.dumps(task_identity(task), sort_keys=True))
        pipe.hset(keys.run, _BUDGET, json.dumps(budget.model_dump(mode="json"), sort_keys=True))
        await pipe.execute()


async def recorded_budget(redis: aioredis.Redis, keys: Keys) -> BudgetSettings | None:
    """The budget of the run's aggregator; None before its first start."""
    raw: Any = await redis.hget(keys.run, _BUDGET)
    return None if raw is None else BudgetSettings.model_validate(json.loads(as_text(raw)))
