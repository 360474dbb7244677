"""Two runs on a Redis Cluster under the ACL file for every run (`fedasync acl --all-runs
--cluster`), every service as its own user, and not one refusal in any node's ACL log.

The cluster itself is made under that file (`acl_cluster`: replicas log in as `replica`,
`redis-cli --cluster create` runs as `cluster-admin`). Then control creates two runs (as
`control`), each gets its aggregator (`aggregator`) and evaluator (`evaluator`), the shared
snapshot and ingest services serve both (`snapshot`, `ingest`), devices publish through ingest
(signed, keys added as `admin`) and straight to each run's stream (`worker`), the supervisor's
reads are made as `supervisor`, claim-check payloads are put as `worker` and fetched as
`aggregator`, and one run is stopped and retired as `admin` (`runs retire`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from pydantic import SecretStr
from redis.exceptions import NoPermissionError

from fedasync.services.aggregator.service import run as run_aggregator
from fedasync.services.commands.redis_launch.cluster import LocalCluster
from fedasync.services.control.service import run as run_control
from fedasync.services.evaluator.service import run as run_evaluator
from fedasync.services.ingest.service import run as run_ingest
from fedasync.services.runtime.http_service import redis_readiness
from fedasync.services.runtime.redis_conn import connect
from fedasync.services.runtime.settings import Settings, load_settings
from fedasync.services.snapshot.service import run as run_snapshot
from fedasync.services.stores.claim_check import RedisClaimStore
from fedasync.services.stores.device_keys import add_device
from fedasync.services.stores.runs import (
    RetireRefused,
    list_runs,
    read_spec,
    retire_run,
    run_status,
)
from fedasync.services.worker.service import run as run_worker
from fedasync.shared.keys import REGISTRY, Keys
from fedasync.shared.runs import DEFAULT_RUN, RunStatus
from tests.integration.conftest import CLUSTER_ACL_USERS
from tests.integration.helpers import OBSERVER, ledger, password_of, wait_for_ledger
from tests.integration.test_acl import while_serving

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.asyncio]

TOKEN = "cluster-acl-test-token-0123456789"
RUNS = ("acl-run-a", "acl-run-b")
UPDATES = 3  # each device of each run


def url_of(cluster: LocalCluster, user: str) -> str:
    return f"redis://{user}:{password_of(user)}@127.0.0.1:{cluster.nodes[0].port}/0"


def as_user(cluster: LocalCluster, user: str, run: str, **sections: dict[str, Any]) -> Settings:
    redis = cluster.redis_settings(url=url_of(cluster, user), key_prefix=run, socket_timeout_s=5.0)
    base: dict[str, dict[str, Any]] = {
        "redis": redis,
        "task": {"name": "linear", "num_devices": 2},
        "aggregator": {"batch_ms": 20, "block_ms": 100, "port": 0},
        # a named run's processes speak for it (its routes, its signature domain)
        "auth": {"default_run": DEFAULT_RUN},
    }
    return load_settings(**(base | sections))


def client_as(cluster: LocalCluster, user: str) -> aioredis.Redis:
    return connect(as_user(cluster, user, DEFAULT_RUN).redis)


@pytest_asyncio.fixture
async def clients(acl_cluster: LocalCluster) -> AsyncIterator[dict[str, aioredis.Redis]]:
    out = {name: client_as(acl_cluster, name) for name in ("admin", "supervisor", "worker")}
    out["aggregator"] = client_as(acl_cluster, "aggregator")
    out[OBSERVER] = client_as(acl_cluster, OBSERVER)
    try:
        yield out
    finally:
        for client in out.values():
            await client.aclose()


async def test_the_cluster_is_made_and_replicated_under_the_acl(acl_cluster: LocalCluster) -> None:
    """Made as cluster-admin, replicas in sync as `replica`: no refusal, no failed login; and
    cluster-admin can do nothing to data or to a node's configuration."""
    assert acl_cluster.acl_refusals() == []
    assert acl_cluster.failed_logins() == []
    assert "cluster-admin" in CLUSTER_ACL_USERS
    node = acl_cluster.nodes[0].port
    plain = aioredis.Redis(
        port=node, username="cluster-admin", password=password_of("cluster-admin")
    )
    try:
        for command in (("GET", "x"), ("FLUSHALL",), ("CLUSTER", "RESET"), ("CONFIG", "GET", "*")):
            with pytest.raises(NoPermissionError):
                await plain.execute_command(*command)
    finally:
        await plain.aclose()
    for line in acl_cluster.acl_refusals():  # the refusals just provoked, and nothing else
        assert ": cluster-admin: " in line, line
    for node in acl_cluster.running():
        await _reset_acl_log(acl_cluster, node.port)


async def _reset_acl_log(cluster: LocalCluster, port: int) -> None:
    client = aioredis.Redis(port=port, username=OBSERVER, password=password_of(OBSERVER))
    try:
        await client.execute_command("ACL", "LOG", "RESET")
    finally:
        await client.aclose()


async def test_two_runs_train_with_every_service_as_its_own_user(
    acl_cluster: LocalCluster, clients: dict[str, aioredis.Redis]
) -> None:
    admin, observer = clients["admin"], clients[OBSERVER]
    stopping = asyncio.Event()
    #: run a's own processes, stopped before it is retired (as the supervisor stops a done run's)
    stopping_a = asyncio.Event()
    own: list[asyncio.Task[Any]] = []
    loop = asyncio.get_running_loop()
    started: dict[str, asyncio.Future[int]] = {
        n: loop.create_future() for n in ("snapshot", "control", "ingest")
    }
    shared = [
        run_snapshot(
            as_user(acl_cluster, "snapshot", DEFAULT_RUN, snapshot={"port": 0}),
            handle_signals=False,
            stopping=stopping,
            started=started["snapshot"],
        ),
        run_control(
            as_user(acl_cluster, "control", DEFAULT_RUN, control={"port": 0, "token": TOKEN}),
            handle_signals=False,
            stopping=stopping,
            started=started["control"],
        ),
        run_ingest(
            as_user(acl_cluster, "ingest", DEFAULT_RUN, ingest={"port": 0}),
            handle_signals=False,
            stopping=stopping,
            started=started["ingest"],
        ),
    ]
    tasks = [asyncio.create_task(s) for s in shared]
    control = f"http://127.0.0.1:{await started['control']}"
    snapshot = f"http://127.0.0.1:{await started['snapshot']}"
    ingest = f"http://127.0.0.1:{await started['ingest']}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession() as http:
        for run in RUNS:  # created through control, as control
            body = {"id": run, "task": {"name": "linear", "num_devices": 2}}
            async with http.post(f"{control}/v1/runs", json=body, headers=auth) as response:
                assert response.status == 201, await response.text()
    # run b's directory entry lost (a crash between its spec and its entry): its aggregator's
    # `register` at start lists it again
    assert await observer.hdel(REGISTRY, RUNS[1]) == 1
    assert RUNS[1] not in await list_runs(observer, DEFAULT_RUN)
    for run in RUNS:
        ends = stopping_a if run == RUNS[0] else stopping
        evaluator = {"port": 0, "snapshot_url": snapshot, "wait_s": 1.0}
        of_run = [
            asyncio.create_task(
                run_aggregator(
                    as_user(acl_cluster, "aggregator", run), handle_signals=False, stopping=ends
                )
            ),
            asyncio.create_task(
                run_evaluator(
                    as_user(acl_cluster, "evaluator", run, evaluator=evaluator),
                    handle_signals=False,
                    stopping=ends,
                )
            ),
        ]
        tasks += of_run
        if run == RUNS[0]:
            own = of_run
    keys_added = {run: await add_device(admin, Keys(run), "device-0") for run in RUNS}
    worker = {"profile": "none", "snapshot_url": snapshot, "max_runs": UPDATES}
    devices = []
    for run in RUNS:
        signed = {"device_index": 0, "ingest_url": ingest, "key": SecretStr(keys_added[run])}
        devices.append(as_user(acl_cluster, "worker", run, worker=worker | signed))
        devices.append(as_user(acl_cluster, "worker", run, worker=worker | {"device_index": 1}))
    try:
        results = await while_serving(
            tasks, asyncio.gather(*(run_worker(d, handle_signals=False) for d in devices))
        )
        for run in RUNS:
            await while_serving(tasks, wait_for_ledger(observer, Keys(run), "0-0", 2 * UPDATES))
        # the supervisor's reads, as the supervisor (services/supervisor/service.py)
        supervisor = clients["supervisor"]
        assert (await redis_readiness(supervisor, key=REGISTRY)).status == 200
        listed = await list_runs(supervisor, DEFAULT_RUN)
        assert listed == [DEFAULT_RUN, *RUNS]  # run b listed again by its aggregator
        for run in RUNS:
            spec = await read_spec(supervisor, run)
            assert spec is not None
            assert spec.id == run
            assert await run_status(supervisor, Keys(run)) is RunStatus.TRAINING
        # claim-check payloads: put as a publisher (worker), fetched as the aggregator
        put = await RedisClaimStore(clients["worker"], RUNS[0]).put(b"payload " * 10)
        fetched = await RedisClaimStore(clients["aggregator"], RUNS[0]).fetch([put])
        assert fetched == {put: b"payload " * 10}
        # a training run is not retired, and nothing of it is deleted
        with pytest.raises(RetireRefused, match="is training"):
            await retire_run(admin, RUNS[0], DEFAULT_RUN)
        async with aiohttp.ClientSession() as http:
            stop = f"{control}/v1/runs/{RUNS[0]}/stop"
            async with http.post(stop, json={"reason": "acl test"}, headers=auth) as response:
                assert response.status == 200, await response.text()
        stopping_a.set()  # its processes end; its policy says stopped: it may be retired
        for task in own:
            await task
        still = [t for t in tasks if t not in own]
        retired = await while_serving(still, retire_run(admin, RUNS[0], DEFAULT_RUN))
    finally:
        stopping_a.set()
        stopping.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)

    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    assert [r.published for r in results] == [UPDATES] * 4
    assert [r.refused for r in results] == [0] * 4
    b = Keys(RUNS[1])
    decided = await ledger(admin, b)
    assert Counter(d["client_id"] for d in decided) == {"device-0": UPDATES, "device-1": UPDATES}
    assert int(await observer.get(b.version) or 0) >= 1
    # run a retired: none of its keys, nor its claim payloads, left; not listed; b untouched
    assert retired.keys > 0
    assert retired.claims == 1
    a_keys = [k async for k in observer.scan_iter(match="{" + RUNS[0] + "}:*")]
    a_claims = [k async for k in observer.scan_iter(match=f"claim:{RUNS[0]}:*")]
    assert a_keys == []
    assert a_claims == []
    assert await list_runs(observer, DEFAULT_RUN) == [DEFAULT_RUN, RUNS[1]]
    assert len(await ledger(admin, b)) == 2 * UPDATES
    # not one command of any service, nor of the cluster's own processes, was refused
    assert acl_cluster.acl_refusals() == []
    assert acl_cluster.failed_logins() == []
