"""What a run is, in the core: its id, what it trains, and the states it can be in.

A deployment trains many runs at once. A run's id is also its keys' hash tag (`{<id>}:…`, see
keys.py), its URL segment (`/v1/runs/<id>/…`) and its ACL key pattern, so the id is held to a
grammar that is safe in all three: lower-case letters, digits, `_` and `-`, starting with a
letter or digit, at most 63 characters. No `{}` (a tag inside a tag), no `:` (the key
separator), no glob characters (ACL patterns), no `/` or whitespace (paths).

The default run is the one the single-run routes (`/v1/models/latest`, `/v1/policy`, ...) and
the settings' key prefix name: every deployment before runs existed is that run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: the run every deployment has: what `FEDASYNC_REDIS__KEY_PREFIX` names by default
DEFAULT_RUN = "fedasync"

#: a run id: the whole text must match (fullmatch)
RUN_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")

#: the wire reason of a refused run id (HTTP 400 `{"error": "bad_run_id", "reason": ...}`)
BAD_RUN_ID = "bad_run_id"
#: the wire reason of a well-formed id that names no run (HTTP 404)
UNKNOWN_RUN = "unknown_run"
#: the wire reason of creating a run whose id is taken (HTTP 409)
RUN_EXISTS = "run_exists"


class RunIdError(ValueError):
    """A run id outside the grammar; `reason` is the wire reason, the message says why."""

    reason = BAD_RUN_ID


def check_run_id(text: object) -> str:
    """`text` if it is a run id, else RunIdError saying what is wrong with it."""
    if not isinstance(text, str):
        raise RunIdError(f"a run id is text, not {type(text).__name__}")
    if RUN_ID.fullmatch(text) is None:
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise RunIdError(
            f"{shown!r} is not a run id: 1 to 63 characters of a-z, 0-9, '_' and '-', "
            "starting with a letter or digit"
        )
    return text


def is_run_id(text: object) -> bool:
    """Whether `text` is a run id (check_run_id without the reason)."""
    return isinstance(text, str) and RUN_ID.fullmatch(text) is not None


def run_base(run: str | None) -> str:
    """The path under which a run's routes live: "" for the legacy routes (run None: the
    default run, as before runs existed), `/v1/runs/<id>` otherwise. Services and clients add
    their route to it (`run_base(run) + "/v1/models/latest"` is wrong; see the paths in
    snapshot_protocol and ingest_protocol, which take the run)."""
    if run is None:
        return ""
    return f"/v1/runs/{check_run_id(run)}"


def run_path(run: str | None, legacy_path: str) -> str:
    """A run's twin of a legacy `/v1/...` route: `/v1/runs/<id>/...`; the legacy path itself
    for run None. `legacy_path` starts with `/v1/`."""
    if not legacy_path.startswith("/v1/"):
        raise ValueError(f"{legacy_path!r} is not a /v1/ route")
    if run is None:
        return legacy_path
    return run_base(run) + legacy_path.removeprefix("/v1")


class RunStatus(StrEnum):
    """Where a run is, derived from its keys (services/stores/runs.py `run_status`).

    created: its spec is stored, its aggregator has not committed the genesis yet;
    training: it has a model and is not done; paused: training with `policy.paused` on;
    done: `{run}:done` is set (budget spent, stopped, ...)."""

    CREATED = "created"
    TRAINING = "training"
    PAUSED = "paused"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """The task a run trains: the same fields every process of a run must agree on
    (stores/run_record.TASK_FIELDS), plus the fleet's size and split, which the supervisor and
    `fedasync up` hand to the run's processes."""

    name: str = "digits"
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    num_devices: int | None = None
    partition: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "params": dict(self.params), "seed": self.seed}
        if self.num_devices is not None:
            out["num_devices"] = self.num_devices
        if self.partition is not None:
            out["partition"] = self.partition
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskSpec:
        unknown = set(data) - {"name", "params", "seed", "num_devices", "partition"}
        if unknown:
            raise ValueError(f"unknown task fields: {', '.join(sorted(unknown))}")
        name = data.get("name", "digits")
        if not isinstance(name, str) or not name:
            raise ValueError("task.name must be a non-empty text (a task name or import path)")
        params = data.get("params", {})
        if not isinstance(params, dict):
            raise ValueError("task.params must be a table")
        seed = data.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError("task.seed must be a non-negative integer")
        devices = data.get("num_devices")
        if devices is not None and (
            not isinstance(devices, int) or isinstance(devices, bool) or devices < 1
        ):
            raise ValueError("task.num_devices must be a positive integer")
        partition = data.get("partition")
        if partition is not None and not isinstance(partition, str):
            raise ValueError("task.partition must be text")
        return cls(name, dict(params), seed, devices, partition)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """A run as created: id, task, the policy's start fields and the budget (each a table of
    the settings of that name: FEDASYNC_POLICY__*, FEDASYNC_BUDGET__*), who made it and when.

    Stored once in the run's own slot (`{run}:run`, field `spec`); the control API, `fedasync up
    --runs-file` and the supervisor all read this one shape. The policy and budget tables are
    checked where settings are built (services/runtime/run_settings.py), against the same
    schema the settings use, so there is one rule for each field."""

    id: str
    task: TaskSpec = field(default_factory=TaskSpec)
    policy: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    created_by: str = ""

    def __post_init__(self) -> None:
        check_run_id(self.id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task": self.task.to_dict(),
            "policy": dict(self.policy),
            "budget": dict(self.budget),
            "created_at": self.created_at,
            "created_by": self.created_by,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        """The spec in `data`; ValueError (RunIdError for the id) naming the first bad field."""
        if not isinstance(data, dict):
            raise ValueError("a run is a JSON object")
        unknown = set(data) - {"id", "task", "policy", "budget", "created_at", "created_by"}
        if unknown:
            raise ValueError(f"unknown run fields: {', '.join(sorted(unknown))}")
        if "id" not in data:
            raise RunIdError("a run needs an id")
        run_id = check_run_id(data["id"])
        task = data.get("task", {})
        if not isinstance(task, dict):
            raise ValueError("task must be an object")
        for name in ("policy", "budget"):
            if not isinstance(data.get(name, {}), dict):
                raise ValueError(f"{name} must be an object")
        created_at = data.get("created_at", 0.0)
        if not isinstance(created_at, (int, float)) or isinstance(created_at, bool):
            raise ValueError("created_at must be a number")
        created_by = data.get("created_by", "")
        if not isinstance(created_by, str):
            raise ValueError("created_by must be text")
        return cls(
            run_id,
            TaskSpec.from_dict(task),
            dict(data.get("policy", {})),
            dict(data.get("budget", {})),
            float(created_at),
            created_by,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> RunSpec:
        return cls.from_dict(json.loads(text))
