"""`fedasync runs create|list|show|pause|resume|stop|retire`: a deployment's runs.

Every subcommand is one request to the control service (`POST /v1/runs`, `GET /v1/runs`, ...;
docs/http-api.md "Runs"), so the CLI goes through the same checks, token and policy log as any
other operator: a pause or stop is a policy change with who (`--operator`) and why. The service
is `--url`, else the configured control host and port; the token is `--token`, else
FEDASYNC_CONTROL__TOKEN.

`retire` is not a control route: it deletes a done or stopped run's keys, claim-check payloads and
directory entry straight in Redis (services/stores/runs.retire_run), as the operator's Redis user
(`admin` under the ACL for every run: FEDASYNC_REDIS__URL, and FEDASYNC_REDIS__CLUSTER on a
cluster), like `fedasync ledger` and `fedasync devices`.

Exit codes: 0 done, 1 refused by the service (its reason is printed), 2 a run that cannot be
retired (or no Redis configured), 3 the service did not answer.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: the service refused the request (4xx, 5xx): its answer is printed
REFUSED = 1
#: the service could not be reached
UNREACHABLE = 3


def add_arguments(runs: argparse.ArgumentParser) -> None:
    """The arguments and handler of `fedasync runs`."""
    runs.add_argument("--url", help="the control service (default: the configured host:port)")
    runs.add_argument("--token", help="the operator token (default: FEDASYNC_CONTROL__TOKEN)")
    runs.add_argument(
        "--operator", default=None, help="who asks (X-Fedasync-Operator, in the policy log)"
    )
    actions = runs.add_subparsers(dest="runs_command", required=True)
    create = actions.add_parser("create", help="create a run (its aggregator is started apart)")
    create.add_argument("run", help="the run id: a-z, 0-9, '_' and '-', at most 63")
    create.add_argument("--spec", help="a JSON file holding the run (task, policy, budget)")
    create.add_argument("--task", help="the task's name (digits, linear, ... or module:attr)")
    create.add_argument("--seed", type=int, help="the task's seed")
    create.add_argument("--devices", type=int, help="the fleet's size (task.num_devices)")
    create.add_argument("--partition", help="how data is split across devices")
    for name, what in (("param", "task param"), ("policy", "start policy field")):
        create.add_argument(
            f"--{name}",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"a {what} (VALUE read as JSON, else as text); repeatable",
        )
    create.add_argument(
        "--budget", action="append", default=[], metavar="KEY=VALUE", help="max_updates=N ..."
    )
    actions.add_parser("list", help="every run and where it stands")
    show = actions.add_parser("show", help="one run: spec, status, version, done reason")
    show.add_argument("run")
    for verb, what in (("pause", "pause the run's aggregation"), ("resume", "resume it")):
        sub = actions.add_parser(verb, help=what)
        sub.add_argument("run")
        sub.add_argument("--why", default="", help="why (in the policy log)")
    stop = actions.add_parser("stop", help="stop the run for good (its aggregator closes it)")
    stop.add_argument("run")
    stop.add_argument("--reason", default="", help="why (in the policy log)")
    retire = actions.add_parser(
        "retire",
        help="delete a done or stopped run's keys, claim-check payloads and directory entry "
        "(in Redis, as FEDASYNC_REDIS__URL's user; not the default run)",
    )
    retire.add_argument("run")
    runs.set_defaults(handler=_runs)


def assignments(pairs: list[str], what: str) -> dict[str, Any]:
    """`KEY=VALUE` pairs as a table: each VALUE read as JSON (`5`, `true`, `"x"`), else text."""
    from fedasync.services.commands.errors import CommandError

    table: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"runs create: --{what} {pair!r}: expected KEY=VALUE")
        try:
            table[key] = json.loads(text)
        except ValueError:
            table[key] = text
    return table


def spec_body(args: argparse.Namespace) -> dict[str, Any]:
    """The POST /v1/runs body the options of `runs create` ask for (`--spec` first, the other
    options on top of it)."""
    from fedasync.services.commands.errors import CommandError

    body: dict[str, Any] = {}
    if args.spec:
        try:
            with open(args.spec, encoding="utf-8") as file:
                body = json.load(file)
        except (OSError, ValueError) as exc:
            raise CommandError(f"runs create: --spec {args.spec}: {exc}") from None
        if not isinstance(body, dict):
            raise CommandError(f"runs create: --spec {args.spec}: a run is a JSON object")
    body["id"] = args.run
    task = dict(body.get("task") or {})
    for key, value in (
        ("name", args.task),
        ("seed", args.seed),
        ("num_devices", args.devices),
        ("partition", args.partition),
    ):
        if value is not None:
            task[key] = value
    if args.param:
        task["params"] = {**task.get("params", {}), **assignments(args.param, "param")}
    if task:
        body["task"] = task
    for name in ("policy", "budget"):
        given = assignments(getattr(args, name), name)
        if given:
            body[name] = {**body.get(name, {}), **given}
    return body


def request(
    method: str, url: str, token: str | None, operator: str | None, body: object = None
) -> tuple[int, Any]:
    """One request to the control service: (status, parsed JSON answer). Raises CommandError
    (UNREACHABLE) when the service does not answer."""
    import urllib.error
    import urllib.request

    from fedasync.services.commands.errors import CommandError

    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if operator:
        headers["X-Fedasync-Operator"] = operator
    sent = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(sent, timeout=30) as answer:
            return answer.status, _parsed(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, _parsed(refused.read())
    except (urllib.error.URLError, OSError) as exc:
        message = f"runs: the control service at {url} did not answer: {exc}"
        raise CommandError(message, UNREACHABLE) from None


def _parsed(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return {"error": raw.decode("utf-8", "replace")[:200]}


def control_url(url: str | None) -> str:
    """`--url`, else the configured control service (a wildcard bind is reached on loopback)."""
    if url:
        return url.rstrip("/")
    from fedasync.services.runtime.settings import load_settings

    control = load_settings().control
    host = "127.0.0.1" if control.host in ("0.0.0.0", "::", "") else control.host
    return f"http://{host}:{control.port}"


def _token(token: str | None) -> str | None:
    if token is not None:
        return token
    from fedasync.services.runtime.settings import load_settings

    return load_settings().control.token


def table(runs: list[dict[str, Any]]) -> str:
    """The runs of GET /v1/runs as lines: id, status, version, done reason."""
    rows = [("RUN", "STATUS", "VERSION", "DONE")]
    for run in runs:
        done = run.get("training_done") or {}
        version = run.get("version")
        rows.append(
            (
                run["id"],
                run["status"],
                "-" if version is None else str(version),
                done.get("reason", "-"),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True))
        + "  "
        + row[3]
        for row in rows
    )


def _runs(args: argparse.Namespace) -> int:
    from fedasync.services.commands.errors import CommandError
    from fedasync.shared.runs import RunIdError, check_run_id

    base = control_url(args.url)
    command = args.runs_command
    run = getattr(args, "run", None)
    if run is not None:
        try:
            check_run_id(run)
        except RunIdError as exc:
            raise CommandError(f"runs {command}: {exc}") from None
    if command == "retire":
        return _retire(str(run))
    method, path, body = _asked(args, run)
    status, answer = request(method, base + path, _token(args.token), args.operator, body)
    if status >= 400:
        reason = answer.get("reason") if isinstance(answer, dict) else None
        error = answer.get("error") if isinstance(answer, dict) else answer
        said = f" [{reason}]" if reason else ""
        print(f"fedasync runs {command}: {status}{said}: {error}", file=sys.stderr)
        return REFUSED
    if command == "list":
        print(table(answer["runs"]))
    else:
        print(json.dumps(answer, indent=2, sort_keys=True))
    return 0


def _retire(run: str) -> int:
    """`runs retire RUN`: one line saying what was deleted; a refusal is one line, exit 2."""
    import asyncio

    from fedasync.services.commands.errors import CommandError
    from fedasync.services.commands.redis_target import configured, talking_to
    from fedasync.services.runtime.redis_conn import connect
    from fedasync.services.runtime.settings import load_settings
    from fedasync.services.stores.runs import Retired, RetireRefused, retire_run

    settings = load_settings()
    command = "runs retire"
    redis_settings = configured(settings.redis, command)

    async def job() -> Retired:
        redis = connect(redis_settings)
        try:
            return await talking_to(
                redis_settings,
                command,
                lambda: retire_run(redis, run, settings.redis.key_prefix),
            )
        finally:
            await redis.aclose()

    try:
        retired = asyncio.run(job())
    except RetireRefused as exc:
        raise CommandError(f"{command}: {exc}") from None
    print(
        f"run {run} retired: {retired.keys} keys and {retired.claims} claim-check payloads "
        "deleted, and its directory entry"
    )
    return 0


def _asked(args: argparse.Namespace, run: str | None) -> tuple[str, str, object]:
    """The method, path and body of the request a subcommand makes."""
    from fedasync.shared.runs import run_base

    command = args.runs_command
    if command == "create":
        return "POST", "/v1/runs", spec_body(args)
    if command == "list":
        return "GET", "/v1/runs", None
    base = run_base(run)
    if command == "show":
        return "GET", base, None
    if command in ("pause", "resume"):
        return "POST", f"{base}/pause", {"on": command == "pause", "why": args.why}
    return "POST", f"{base}/stop", {"reason": args.reason}
