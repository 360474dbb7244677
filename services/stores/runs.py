"""The runs of a deployment in Redis: each run's spec in its own slot, and the directory of runs.

A run's truth stays in its own slot, beside the rest of its keys: the spec is the field `spec` of
`{run}:run` (set once, HSETNX), next to the `task` and `budget` its aggregator records
(run_record.py). The directory, `REGISTRY`, only lists ids for the create, list and supervise
paths; it sits on one primary of a cluster, so a failover there interrupts no run: the services
that serve a run check it with `EXISTS {run}:run` in the run's own slot.

Creating touches two slots and cannot be atomic on a cluster: the spec is written first (it
decides whether the id was free), then the directory entry. A crash between the two leaves a
run that exists but is not listed; its aggregator's `register` at start repairs that, and so
does creating it again (RUN_EXISTS, then the entry is written).

Retiring a run (`retire_run`, `fedasync runs retire`) deletes what is left of it once it is over:
its keys (all in its slot, found by SCAN `{run}:*` on the primary of that slot, or on the one
server), its claim-check payloads (`claim:<run>:*`, on every primary: each has a slot of its
own), then its directory entry, last, so an interrupted retirement is still listed and can be
run again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from fedasync.services.runtime.redis_cluster import is_cluster, node_of
from fedasync.services.runtime.redis_conn import as_text
from fedasync.services.stores.claim_check import RedisClaimStore
from fedasync.shared.keys import REGISTRY, Keys
from fedasync.shared.runs import RunSpec, RunStatus, check_run_id

#: keys asked for, and deleted, at a time while a run is retired
RETIRE_BATCH = 500

_SPEC = "spec"


async def create_run(redis: aioredis.Redis, spec: RunSpec) -> bool:
    """Store a new run; False if a run of that id exists (its spec is left as it was)."""
    keys = Keys(spec.id)
    created = bool(await redis.hsetnx(keys.run, _SPEC, spec.to_json()))
    await register(redis, spec.id, spec.created_at, spec.created_by)
    return created


async def read_spec(redis: aioredis.Redis, run: str) -> RunSpec | None:
    """The spec `run` was created with; None for a run that was never created through the API
    (the default run, or a deployment from before runs existed)."""
    raw: Any = await redis.hget(Keys(check_run_id(run)).run, _SPEC)
    return None if raw is None else RunSpec.from_json(as_text(raw))


async def run_exists(redis: aioredis.Redis, run: str) -> bool:
    """Whether `run` has keys of its own (a spec, or a task its aggregator recorded)."""
    return bool(await redis.exists(Keys(check_run_id(run)).run))


async def register(redis: aioredis.Redis, run: str, at: float, by: str = "") -> bool:
    """Add `run` to the directory (HSETNX: the first entry stays); whether it was new."""
    entry = json.dumps({"created_at": at, "by": by}, separators=(",", ":"))
    return bool(await redis.hsetnx(REGISTRY, check_run_id(run), entry))


async def unregister(redis: aioredis.Redis, run: str) -> bool:
    """Remove `run` from the directory (its keys are removed by whoever retires it)."""
    return bool(await redis.hdel(REGISTRY, check_run_id(run)))


async def list_runs(redis: aioredis.Redis, default: str) -> list[str]:
    """Every run in the directory and the default run, sorted, the default first."""
    raw: Any = await redis.hkeys(REGISTRY)
    listed = {as_text(name) for name in raw} - {default}
    return [default, *sorted(listed)]


async def run_status(redis: aioredis.Redis, keys: Keys) -> RunStatus:
    """Where the run of `keys` is: done once `{run}:done` is set, created until its aggregator
    committed a first version, paused while the policy in force says so, training otherwise."""
    done, version, policy = await _read_status(redis, keys)
    if done:
        return RunStatus.DONE
    if version is None:
        return RunStatus.CREATED
    if policy is not None and json.loads(as_text(policy)).get("paused"):
        return RunStatus.PAUSED
    return RunStatus.TRAINING


async def _read_status(redis: aioredis.Redis, keys: Keys) -> tuple[bool, Any, Any]:
    async with redis.pipeline(transaction=False) as pipe:
        pipe.exists(keys.done)
        pipe.get(keys.version)
        pipe.get(keys.policy)
        done, version, policy = await pipe.execute()
    return bool(done), version, policy


class RetireRefused(ValueError):
    """A run that may not be retired (the default run, one still training, one unknown)."""


@dataclass(frozen=True, slots=True)
class Retired:
    """What `retire_run` removed: the run's keys and its claim-check payloads."""

    run: str
    keys: int
    claims: int


async def retire_run(redis: aioredis.Redis, run: str, default: str) -> Retired:
    """Delete every key of `run`, its claim payloads and its directory entry.

    Only a run that is over: done (`{run}:done`), or stopped by its policy (`stopped`: its
    aggregator closes it, or is gone). Never the default run, which the deployment's own
    routes serve. A run whose record is already gone (a retirement cut short) is finished off;
    one that left nothing at all is unknown. RetireRefused says why, in one line."""
    check_run_id(run)
    if run == default:
        raise RetireRefused(f"{run!r} is the default run (the deployment's own): it is not retired")
    keys = Keys(run)
    if await run_exists(redis, run):
        status = await run_status(redis, keys)
        if status is not RunStatus.DONE and not await _stopped(redis, keys):
            raise RetireRefused(
                f"run {run!r} is {status.value}: only a done or stopped run is retired "
                f"(`fedasync runs stop {run}` first)"
            )
    removed = await _delete(redis, await _run_keys(redis, keys))
    claims = await _delete(redis, await RedisClaimStore(redis, run).stored(RETIRE_BATCH))
    listed = await unregister(redis, run)
    if not (removed or claims or listed):
        raise RetireRefused(f"no run {run!r} in this deployment (`fedasync runs list` names them)")
    return Retired(run, removed, claims)


async def _stopped(redis: aioredis.Redis, keys: Keys) -> bool:
    raw: Any = await redis.get(keys.policy)
    return raw is not None and bool(json.loads(as_text(raw)).get("stopped"))


async def _run_keys(redis: aioredis.Redis, keys: Keys) -> list[str]:
    """Every key of the run: SCAN `{run}:*`, on its slot's primary on a cluster (a run's keys
    share its hash tag, so they are all there)."""
    pattern = keys.run.removesuffix("run") + "*"
    where: dict[str, Any] = {}
    if is_cluster(redis):
        await redis.initialize()
        where["target_nodes"] = node_of(redis, keys.run)
    found = redis.scan_iter(match=pattern, count=RETIRE_BATCH, **where)
    return list(dict.fromkeys([as_text(key) async for key in found]))


async def _delete(redis: aioredis.Redis, names: list[str]) -> int:
    """DEL `names` in batches (redis-py splits a batch by slot on a cluster); how many went."""
    gone = 0
    for start in range(0, len(names), RETIRE_BATCH):
        gone += int(await redis.delete(*names[start : start + RETIRE_BATCH]))
    return gone
