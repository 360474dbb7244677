"""Settings from the environment (prefix FEDASYNC_, sections joined by a double underscore).

Built once in each entry point's main() and passed down; nothing here runs at import time. The
policy section is validated by the core's own rules (shared/policy.py), so a setting and a runtime
policy change can never disagree on what is allowed.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

from fedasync.client.redis_link import CONNECT_TIMEOUT_S, SOCKET_TIMEOUT_S
from fedasync.learning.task import Task
from fedasync.learning.tasks import TaskError, TaskName, TaskParamsError, get_task
from fedasync.services.runtime.setting_specs import ENV_NESTED_DELIMITER as ENV_NESTED_DELIMITER
from fedasync.services.runtime.setting_specs import ENV_PREFIX as ENV_PREFIX
from fedasync.services.runtime.setting_specs import SPECS, LatencyProfile, Partition
from fedasync.services.runtime.setting_specs import SettingPath as SettingPath
from fedasync.services.runtime.setting_specs import env_name as env_name
from fedasync.shared.dedup import DEFAULT_CAPACITY, DEFAULT_HORIZON
from fedasync.shared.durability import Durability as Durability
from fedasync.shared.params import ParamError
from fedasync.shared.policy import START, Policy, apply_mode_preset
from fedasync.shared.policy_schema import policy_model
from fedasync.shared.rules import RULE_NAMES
from fedasync.shared.wire import DEFAULT_MAX_MESSAGE_BYTES

#: receipts the index keeps (`{p}:receipts`), by default: about 45 MB of Redis (220 bytes each)
DEFAULT_RECEIPTS_CAPACITY = 200_000


def _declared(section: str, name: str) -> Any:
    """The pydantic field of a setting declared as plain data (runtime/setting_specs.py)."""
    spec = SPECS[(section, name)]
    if spec.factory is not None:
        return Field(default_factory=spec.factory, description=spec.description, **spec.constraints)
    return Field(spec.default, description=spec.description, **spec.constraints)


@dataclass(frozen=True, slots=True)
class Problem:
    """One setting that failed validation: where, the value given (when one was), what is wrong."""

    path: SettingPath
    given: str | None
    message: str

    def describe(self, flags: Mapping[SettingPath, str]) -> str:
        """As the user wrote it: `--tau-max -1` when a flag gave it, else its variable."""
        flag = flags.get(self.path)
        if flag is None:
            return f"{env_name(*self.path)}: {self.message}"
        return f"{flag if self.given is None else f'{flag} {self.given}'}: {self.message}"


class SettingsError(ValueError):
    """Settings that failed validation; the message names each variable and what is wrong."""

    def __init__(self, message: str, problems: tuple[Problem, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems

    @classmethod
    def of(cls, problems: tuple[Problem, ...]) -> SettingsError:
        """The error of problems found outside validation (a process's task against its run's)."""
        return cls(_invalid([p.describe({}) for p in problems]), problems)

    def naming(
        self, flags: Mapping[SettingPath, str], typed: Mapping[SettingPath, Any]
    ) -> SettingsError:
        """The same error with each problem a flag gave named by that flag and the value typed
        (`--tau-max -1`), not by a variable the user never set."""
        if not any(p.path in flags for p in self.problems):
            return self
        problems = tuple(
            replace(p, given=_text(typed.get(p.path))) if p.path in flags else p
            for p in self.problems
        )
        return SettingsError(_invalid([p.describe(flags) for p in problems]), problems)


#: the text that stands for "unset" in a variable of a setting that may be unset (as in JSON)
NULL = "null"


class Section(BaseModel):
    """A settings section: unknown keys are errors, so a misspelt variable is never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _from_text(cls, value: Any, info: ValidationInfo) -> Any:
        """A setting given as text (a variable), read the one way for every field.

        `null`, or nothing at all, is None for a setting that may be unset (compose passes
        `${VAR:-}`); a list or table (FEDASYNC_TASK__PARAMS) is JSON, and text that is not is
        named as such instead of failing inside pydantic-settings. Everything else is left to
        the field's own checks.
        """
        if not isinstance(value, str) or info.field_name is None:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        if _admits_none(annotation) and value.strip().lower() in ("", NULL):
            return None
        kind = _container(annotation)
        if kind is None:
            return value
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}; give a JSON {kind}") from None


def _admits_none(annotation: Any) -> bool:
    if get_origin(annotation) is Annotated:
        return _admits_none(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return type(None) in get_args(annotation)
    return annotation is None or annotation is type(None)


def _container(annotation: Any) -> str | None:
    """What JSON a field's value is written in (`object`, `list`); None: not JSON, plain text."""
    if get_origin(annotation) is Annotated:
        return _container(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = {_container(a) for a in get_args(annotation)} - {None}
        return kinds.pop() if len(kinds) == 1 else None
    origin = get_origin(annotation) or annotation
    if isinstance(origin, type) and issubclass(origin, (dict, BaseModel)):
        return "object"
    if isinstance(origin, type) and issubclass(origin, (list, tuple, set, frozenset)):
        return "list"
    return None


#: durable mode's replicas when Sentinels are configured and FEDASYNC_REDIS__DURABLE_REPLICAS
#: is not set: one of the (shipped: two) replicas must hold each acknowledged write
DEFAULT_DURABLE_REPLICAS = 1


class RedisSettings(Section):
    """Where the broker is and how patiently to talk to it."""

    url: str | None = Field(
        None,
        description="Redis URL, e.g. redis://:password@host:6379/0; unset: the services refuse "
        "to start, `fedasync up` starts a private server",
    )
    socket_timeout_s: float = Field(
        SOCKET_TIMEOUT_S, gt=0, description="socket read timeout, seconds"
    )
    connect_timeout_s: float = Field(
        CONNECT_TIMEOUT_S, gt=0, description="connect timeout, seconds"
    )
    reconnect_attempts: int = Field(10, ge=0, description="reconnects before giving up")
    key_prefix: str = Field(
        "fedasync",
        min_length=1,
        description="prefix of every Redis key, the hash tag of the default run's keys (no "
        "braces; a run created through the control API uses its id)",
    )
    cluster: str | None = Field(
        None,
        description="Redis Cluster seed nodes, host:port,host:port,...; set: every service "
        "talks to the cluster (each run's keys in its run's slot), the URL gives only user "
        "and password; exclusive with sentinels",
    )
    sentinels: str | None = Field(
        None,
        description="Sentinel addresses, host:port,host:port,...; set: the primary is the one "
        "they name, followed across failovers, and the URL gives only user, password and "
        "database",
    )
    master_name: str = Field(
        "fedasync", min_length=1, description="the name the Sentinels monitor the primary under"
    )
    sentinel_username: str | None = Field(
        None, description="user the services log in to the Sentinels as (docs/security.md)"
    )
    sentinel_password: SecretStr | None = Field(
        None, description="that user's password on the Sentinels"
    )
    durable_replicas: int | None = Field(
        None,
        ge=0,
        description="durable mode: acknowledge an update, announce a version, only once WAIT "
        "says this many replicas have it; 0: off; unset: 1 with Sentinels (a paused or "
        "partitioned primary that comes back must not have acknowledged anything its "
        "replicas lack), 0 without (docs/operations.md, Redis under Sentinel)",
    )
    durable_timeout_ms: int = Field(
        1000, ge=1, description="how long one WAIT for the replicas may take, ms"
    )

    @field_validator("sentinels", "cluster")
    @classmethod
    def _host_port_list(cls, value: str | None) -> str | None:
        if value is not None:
            sentinel_addresses(value)  # raises ValueError naming the bad entry
        return value

    @field_validator("key_prefix")
    @classmethod
    def _one_hash_tag(cls, value: str) -> str:
        """The prefix is the `{...}` hash tag of every key: a brace in it would end the tag
        early and spread the run's keys over several slots."""
        if "{" in value or "}" in value:
            raise ValueError(f"{value!r} holds a brace: the prefix is a hash tag, {{prefix}}:key")
        return value

    @model_validator(mode="after")
    def _cluster_or_sentinels(self) -> RedisSettings:
        if self.cluster is not None and self.sentinels is not None:
            raise ValueError(
                "cluster and sentinels are exclusive: a Redis Cluster fails over by itself"
            )
        return self

    @model_validator(mode="after")
    def _wait_returns_before_the_socket_gives_up(self) -> RedisSettings:
        if self.durability.replicas and self.durable_timeout_ms >= self.socket_timeout_s * 1000:
            raise ValueError(
                f"durable_timeout_ms ({self.durable_timeout_ms}) must stay below "
                f"socket_timeout_s ({self.socket_timeout_s} s): WAIT blocks that long"
            )
        return self

    @property
    def durability(self) -> Durability:
        """Durable mode as set, or by default: on (one replica) exactly when Sentinels are
        configured, since a replicated deployment that fails over otherwise loses what an
        isolated primary acknowledged."""
        replicas = self.durable_replicas
        if replicas is None:
            replicated = self.sentinels is not None or self.cluster is not None
            replicas = DEFAULT_DURABLE_REPLICAS if replicated else 0
        return Durability(replicas, self.durable_timeout_ms)

    @property
    def configured(self) -> bool:
        """A Redis is named: a URL, Sentinels to ask for the primary, or cluster nodes."""
        return self.url is not None or self.sentinels is not None or self.cluster is not None

    @property
    def cluster_list(self) -> list[tuple[str, int]]:
        """The cluster's seed nodes as (host, port) pairs; empty without a cluster."""
        return [] if self.cluster is None else sentinel_addresses(self.cluster)

    @property
    def sentinel_list(self) -> list[tuple[str, int]]:
        """The Sentinels as (host, port) pairs; empty without Sentinel."""
        return [] if self.sentinels is None else sentinel_addresses(self.sentinels)


def sentinel_addresses(text: str) -> list[tuple[str, int]]:
    """`host:port,host:port` as pairs; ValueError naming the first entry that is not one."""
    out = []
    for entry in (part.strip() for part in text.split(",")):
        host, sep, port = entry.rpartition(":")
        if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"{entry!r} is not host:port (expected host:port,host:port,...)")
        out.append((host.strip("[]"), int(port)))
    return out


class PolicySection(Section):
    """The initial mixing policy: one setting per start field of the core's schema.

    The fields come from `Policy` (shared/policy.py) through `policy_model`; naming a mode fills
    the fields left unset from that mode's preset, as everywhere else (`apply_mode_preset`), so
    the values shown (`fedasync settings`) are the values in force.
    """

    @model_validator(mode="before")
    @classmethod
    def _mode_preset(cls, data: Any) -> Any:
        return apply_mode_preset(data) if isinstance(data, Mapping) else data

    @model_validator(mode="after")
    def _core_rules(self) -> PolicySection:
        try:
            self.to_policy()
        except ParamError as exc:
            raise ValueError(str(exc)) from None
        return self

    def to_policy(self, version: int = 0) -> Policy:
        return Policy.configured(self.model_dump(), version)


if TYPE_CHECKING:

    class PolicySettings(PolicySection):
        """Typed as its base; the fields are the schema's, read through `to_policy()`."""

        def __getattr__(self, name: str) -> Any: ...

else:
    PolicySettings = policy_model(
        "PolicySettings", PolicySection, START, doc=PolicySection.__doc__ or ""
    )


class BudgetSettings(Section):
    """Training stops at whichever limit it reaches first."""

    max_updates: int = _declared("budget", "max_updates")
    max_seconds: float = _declared("budget", "max_seconds")

    def limits(self, policy: Policy) -> tuple[int, float]:
        """(updates, seconds) in force: a budget set through the policy wins over this one."""
        return (
            policy.max_updates or self.max_updates,
            policy.max_seconds or self.max_seconds,
        )


class TaskSettings(Section):
    """What is learned, from which data split; the aggregator, workers and evaluator agree on it.

    The name is checked here without importing anything, so services that never build the task
    (control, snapshot, ingest) need not have its package installed; those that do build it
    (`build`) before they start anything (services/runtime/entry.py, `fedasync up`).
    """

    name: TaskName = _declared("task", "name")
    params: dict[str, Any] = _declared("task", "params")
    seed: int = _declared("task", "seed")
    num_devices: int = _declared("task", "num_devices")
    partition: Partition = _declared("task", "partition")
    rare_class: int = _declared("task", "rare_class")
    rare_keep: float = Field(
        1.0, gt=0, le=1, description="rare_class_on_slow: share of that class's samples kept"
    )
    slow_share: float = Field(
        0.1,
        gt=0,
        le=1,
        description="rare_class_on_slow: the slowest devices by their profile's median latency",
    )
    validation_samples: int = Field(
        100,
        ge=1,
        description="Zeno++ (policy zeno_margin): training samples the aggregator keeps as its "
        "held-out set, drawn with the seed (learning/held_out.py), as the simulator's "
        "[validation] samples",
    )

    def build(self) -> Task:
        """The task these settings name, built (its module imported): or one SettingsError line.

        The variable named is the one to fix: FEDASYNC_TASK__PARAMS when the params were refused.
        """
        try:
            return get_task(self.name, **self.params)
        except TaskError as exc:
            setting = "params" if isinstance(exc, TaskParamsError) else "name"
            problem = Problem(("task", setting), None, str(exc))
            raise SettingsError(f"invalid settings: {problem.describe({})}", (problem,)) from exc


class AggregatorSettings(Section):
    """The single consumer of the updates stream."""

    consumer: str = Field("aggregator", min_length=1, description="consumer name in the group")
    batch_max: int = Field(256, ge=1, le=10_000, description="updates per group commit, at most")
    read_count: int = Field(
        32, ge=1, le=10_000, description="entries per XREADGROUP (bounds memory per read)"
    )
    batch_ms: int = Field(50, ge=0, description="longest a decided update waits for its commit, ms")
    block_ms: int = Field(1000, ge=1, description="blocking read timeout, ms")
    keep_versions: int = Field(20, ge=1, description="committed model versions kept for download")
    keep_payloads: bool = Field(
        True, description="keep update payloads in the stream for `ledger verify` (audit)"
    )
    archive_dir: Path | None = Field(
        None,
        description="directory (may be shared) the payloads of decided updates are archived to "
        "before their commit, then trimmed from the stream: bounded Redis memory, and "
        "`ledger verify` reads them from there (services/stores/archive.py)",
    )
    host: str = Field("127.0.0.1", description="bind address of /livez, /readyz, /metrics")
    port: int | None = Field(
        8090, ge=0, le=65535, description="port of /livez, /readyz, /metrics; 0 picks a free one"
    )
    deadletter_payload_bytes: int = Field(
        65536, ge=0, description="bytes of a refused message kept in the dead-letter stream"
    )
    claim_interval_s: float = Field(
        1.0, gt=0, description="how often entries idle under any consumer are taken over, s"
    )
    reader: Literal["inline", "process"] = Field(
        "inline",
        description="inline: one process reads, decodes and decides; process: a reader "
        "process of its own reads and decodes, and hands the updates over through shared "
        "memory (two cores' worth of GIL; docs/architecture.md)",
    )
    ring_slots: int = Field(
        64,
        ge=2,
        le=4096,
        description="process mode: slots of the shared-memory ring (decoded updates the "
        "reader holds ahead of the deciding; fewer for large models, 256 MB at most)",
    )
    claim_idle_s: float = Field(
        2.0, gt=0, description="an entry pending this long without a decision is taken over, s"
    )
    refusal_linger_s: float = Field(
        30.0,
        ge=0,
        description="after refusing to decide (exit 4), how long /readyz and /metrics stay up "
        "to say why before the exit, s (paces a restart loop)",
    )

    @property
    def decision_bound_s(self) -> float:
        """Longest an entry that another consumer holds and does not decide waits for its
        decision while this aggregator runs (docs/architecture.md): until it is idle long
        enough, one claim period, one batch (plus the commit's round trip)."""
        return self.claim_idle_s + self.claim_interval_s + self.batch_ms / 1000


class SnapshotSettings(Section):
    """The HTTP service devices download models from."""

    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(8081, ge=0, le=65535, description="port; 0 picks a free one")
    long_poll_max_s: float = Field(30.0, gt=0, description="longest a long-poll may wait, seconds")
    max_waiters: int = Field(1000, ge=1, description="long-polls waiting at once, at most")
    cache_versions: int = Field(8, ge=1, description="older versions kept in memory")
    max_runs: int = Field(
        64, ge=1, description="runs served at once, at most (each keeps its own model cache)"
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="processes serving the port together (SO_REUSEPORT), each following "
        "versions itself",
    )


class WireSettings(Section):
    """Limits of the update message."""

    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES, ge=1024, description="larger messages are refused unread"
    )
    dtype: Literal["float32", "float16"] = Field("float32", description="dtype devices send")
    claim_check_dir: Path | None = Field(
        None,
        description="directory store (may be shared) of claim-check updates: the stream carries "
        "their content address, the aggregator and `ledger verify` read them from here",
    )
    claim_check_store: Literal["dir", "redis"] = Field(
        "dir",
        description="where claim-check payloads live: dir (claim_check_dir) or redis (one key "
        "per payload, claim:<run>:{<sha256>}, each in its own cluster slot)",
    )


class DedupSettings(Section):
    """How much the aggregator remembers to recognise duplicates."""

    horizon: int = Field(
        DEFAULT_HORIZON, ge=1000, description="versions of update ids kept (≥ the largest τ_max)"
    )
    capacity: int = Field(DEFAULT_CAPACITY, ge=1, description="update ids kept at most")


class ControlSettings(Section):
    """The operators' service: policy changes, status, and who may write."""

    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(8082, ge=0, le=65535, description="port; 0 picks a free one")
    token: str | None = Field(
        None,
        min_length=16,
        description="bearer token for every write (and for reads unless open_reads), at least "
        "16 characters; unset: writes refused",
    )
    open_reads: bool = Field(
        False,
        description="true: anyone may read status, policy, alerts (client ids among them); "
        "false: reads need the token too",
    )
    rules_interval_s: float = Field(1.0, gt=0, description="how often the automatic rules run")
    window_s: float = Field(30.0, gt=0, description="window of the rate and drop-share figures")
    rate_high: float = Field(200.0, gt=0, description="updates/s that turn raise-gamma on")
    rate_low: float = Field(120.0, gt=0, description="updates/s below which it turns off again")
    lag_high: float = Field(1000.0, gt=0, description="stream lag that turns freshest-only on")
    lag_low: float = Field(100.0, ge=0, description="stream lag below which it turns off")
    hold_s: float = Field(10.0, ge=0, description="how long a condition must last to act")
    cooldown_s: float = Field(60.0, ge=0, description="least time between two actions of a rule")
    max_consecutive_drops: int = Field(50, ge=1, description="drops in a row that raise an alert")
    max_drop_share: float = Field(0.5, gt=0, le=1, description="drop share that raises an alert")
    fairness_min_rate: float = Field(
        0.1, ge=0, le=1, description="acceptance under which a client raises a fairness alert"
    )
    fairness_decisions: int = Field(20, ge=1, description="decisions per client it is judged on")
    memory_high: float = Field(
        0.8,
        gt=0,
        le=1,
        description="Redis used memory ÷ maxmemory that turns pause-ingest on, with an alert",
    )
    memory_low: float = Field(
        0.6, ge=0, le=1, description="Redis memory share below which pause-ingest turns off"
    )
    disabled_rules: list[str] = Field(
        default_factory=list,
        description="rules not to run: update-rate, lag, drops, fairness, memory",
    )

    @field_validator("token")
    @classmethod
    def _token_fits_a_header(cls, token: str | None) -> str | None:
        """It travels in an `Authorization` header: printable ASCII without spaces."""
        if token is not None and not (token.isascii() and token.isprintable() and " " not in token):
            raise ValueError("the token must be printable ASCII without spaces")
        return token

    @field_validator("disabled_rules")
    @classmethod
    def _known_rules(cls, names: list[str]) -> list[str]:
        unknown = sorted(set(names) - set(RULE_NAMES))
        if unknown:
            raise ValueError(f"unknown rules {unknown}; the rules are {list(RULE_NAMES)}")
        return names

    @model_validator(mode="after")
    def _levels_in_order(self) -> ControlSettings:
        """A rule turns on above its high level and off below its low one: low ≤ high."""
        for name in ("rate", "lag", "memory"):
            low, high = getattr(self, f"{name}_low"), getattr(self, f"{name}_high")
            if low > high:
                raise ValueError(f"{name}_low ({low}) must not exceed {name}_high ({high})")
        return self


class EvaluatorSettings(Section):
    """The service that scores each new version on the held-out test set."""

    snapshot_url: str = Field("http://127.0.0.1:8081", description="snapshot service base URL")
    host: str = Field("127.0.0.1", description="bind address of /livez, /readyz, /metrics")
    port: int = Field(8083, ge=0, le=65535, description="port; 0 picks a free one")
    wait_s: float = Field(10.0, gt=0, description="long-poll wait for a newer version, seconds")
    keep: int = Field(
        100_000, ge=100, description="evaluations kept in the stream (approximate MAXLEN)"
    )


class WorkerSettings(Section):
    """A device: where it gets models, which data share it holds, how slow it pretends to be."""

    snapshot_url: str = Field("http://127.0.0.1:8081", description="snapshot service base URL")
    client_id: str | None = Field(None, description="device id; unset: device-<index>")
    device_index: int = Field(0, ge=0, description="which share of the split data it holds")
    profile: LatencyProfile = _declared("worker", "profile")
    time_scale: float = _declared("worker", "time_scale")
    dropout: float = Field(0.0, ge=0, lt=1, description="chance a run is abandoned mid-training")
    epochs: int | None = Field(None, ge=1, description="local epochs; unset: the task's default")
    lr: float | None = Field(None, gt=0, description="local learning rate; unset: task default")
    batch_size: int | None = Field(None, ge=1, description="local batch; unset: task default")
    dpsgd_noise_multiplier: float | None = _declared("worker", "dpsgd_noise_multiplier")
    dpsgd_max_grad_norm: float = _declared("worker", "dpsgd_max_grad_norm")
    dpsgd_delta: float = _declared("worker", "dpsgd_delta")
    dpsgd_state: str | None = Field(
        None,
        description="file keeping this device's DP-SGD accountant across restarts (one per "
        "device); unset: kept in memory, and a restarted worker's ε starts from 0",
    )
    max_runs: int | None = Field(None, ge=1, description="stop after this many published updates")
    download_timeout_s: float = Field(60.0, gt=0, description="longest a model download may take")
    journal: str | None = Field(
        None, description="file to append each publish attempt and acknowledgement to (chaos runs)"
    )
    key: SecretStr | None = Field(
        None,
        description="device key (`ed25519:<base64>` or 64 hex, from `fedasync devices add`); "
        "set: updates signed",
    )
    ingest_url: str | None = Field(
        None, description="ingest service base URL; set: publish over HTTP instead of to Redis"
    )
    ca_file: str | None = Field(
        None,
        description="PEM file of the authorities an https:// snapshot or ingest URL's certificate "
        "must chain to (a private edge); unset: the system's",
    )

    @field_validator("key")
    @classmethod
    def _key_is_hex(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            text = value.get_secret_value()
            if text.startswith("ed25519:"):
                from fedasync.shared.device_auth import parse_signing_key

                parse_signing_key(text)  # ValueError: pydantic reports it as the key's error
            elif len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
                raise ValueError("a device key is 64 lowercase hex characters")
        return value

    @model_validator(mode="after")
    def _ingest_needs_key(self) -> WorkerSettings:
        """The ingest service refuses unsigned updates: a URL without a key could never publish."""
        if self.ingest_url is not None and self.key is None:
            raise ValueError("ingest_url needs key (FEDASYNC_WORKER__KEY) to sign updates")
        return self


class AuthSettings(Section):
    """Device authentication: who may publish updates (docs/security.md)."""

    required: bool = Field(
        False, description="refuse unsigned updates (a present signature is always checked)"
    )
    window_s: float = Field(
        300.0, gt=0, le=86400, description="largest gap between signing and receipt, seconds"
    )
    key_refresh_s: float = Field(
        1.0, gt=0, le=60, description="a cached device key is re-read after this many seconds"
    )
    default_run: str | None = Field(
        None,
        description="the deployment's default run, when this process serves another one (its "
        "key prefix): that run's devices then sign under its own domain and use its "
        "/v1/runs/<id>/ routes; unset: this process's key prefix is the default run",
    )

    @property
    def window_ms(self) -> int:
        """The window as every check uses it (ingest, its update store, the aggregator): one
        rounding, so they never disagree at its edge."""
        return round(self.window_s * 1000)


class IngestSettings(Section):
    """The HTTP entry for devices that must not hold Redis credentials (docs/http-api.md)."""

    host: str = Field("127.0.0.1", description="bind address")
    port: int = Field(8084, ge=0, le=65535, description="port; 0 picks a free one")
    max_body_bytes: int | None = Field(
        None,
        ge=1024,
        description="larger bodies are refused unread (413); unset: the largest valid update of "
        "the run's model, from the layout of its newest committed version (before the first "
        "commit: FEDASYNC_WIRE__MAX_MESSAGE_BYTES)",
    )
    unverified_bytes: int = Field(
        8 * 2**20,
        ge=1024,
        description="bytes of bodies being read whose signature is not yet checked, all devices "
        "together; a body beyond gets 503 unverified_budget with Retry-After (one body is "
        "always let in when none is being read)",
    )
    unverified_bytes_per_client: int | None = Field(
        None,
        ge=1024,
        description="the same for the bodies claiming one client id; unset: the body limit "
        "(one largest update at a time)",
    )
    budget_retry_after_s: int = Field(
        1, ge=1, description="Retry-After of the 503 unverified_budget, seconds"
    )
    min_upload_bytes_per_s: int = Field(
        32 * 1024,
        ge=1,
        description="a body must arrive whole within FEDASYNC_HTTP__BODY_TIMEOUT_S plus its "
        "length at this rate (its reserved bytes, for a chunked one), or it is refused (408 "
        "upload_too_slow) and its share of the unverified budget given back: a forged body "
        "trickled a byte at a time holds the budget no longer than that",
    )
    rate_per_s: float = Field(5.0, gt=0, description="updates per second per device, sustained")
    max_runs: int = Field(
        64, ge=1, description="runs taking updates at once, at most (each its own ingest state)"
    )
    burst: int = Field(20, ge=1, description="updates a device may send at once")
    idempotency_ttl_s: int = Field(
        86400, ge=60, description="how long a retry with the same update id gets the first answer"
    )
    policy_refresh_s: float = Field(
        1.0, ge=0, description="how stale its view of the policy (pause-ingest) may be, seconds"
    )
    paused_retry_after_s: int = Field(
        5, ge=1, description="Retry-After of the 503 answered while ingest is paused"
    )


class ReceiptsSettings(Section):
    """The receipts index: the decision each update got, for its device to ask about."""

    capacity: int = Field(
        DEFAULT_RECEIPTS_CAPACITY,
        ge=1,
        description="receipts kept (about 220 bytes of Redis each); beyond, the oldest go",
    )


class HttpSettings(Section):
    """Limits every HTTP service (snapshot, ingest, control, the aggregator's metrics port) puts
    on its clients, so slow or hostile ones cannot hold its connections (docs/security.md)."""

    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a request head must be complete this many seconds after its first byte, "
        "and a new connection must send one within this many seconds",
    )
    idle_timeout_s: float = Field(
        75.0,
        gt=0,
        description="a keep-alive connection may wait this long for its next request after an "
        "answer (clients' connection pools reuse it), then it is closed",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        description="longest pause while a request body arrives or a response is taken, seconds",
    )
    max_connections: int = Field(
        1024,
        ge=1,
        description="open connections per service; beyond it a new one gets 503 and is closed",
    )


class SupervisorSettings(Section):
    """The supervisor: one aggregator (and evaluator) process per active run."""

    host: str = Field("127.0.0.1", description="bind address of /livez, /metrics, /v1/aggregators")
    port: int = Field(8086, ge=0, le=65535, description="port; 0 picks a free one")
    poll_s: float = Field(2.0, gt=0, description="how often the run registry is read, seconds")
    done_grace_s: float = Field(
        30.0, ge=0, description="how long a done run's processes stay up (final commits, scores)"
    )
    restart_backoff_max_s: float = Field(
        30.0, gt=0, description="longest wait before restarting a dead child (doubling from 1 s)"
    )
    evaluators: bool = Field(True, description="start an evaluator beside each run's aggregator")
    skip_default: bool = Field(
        False,
        description="leave the default run alone (its aggregator is deployed on its own)",
    )
    targets_file: Path | None = Field(
        None, description="Prometheus file_sd JSON of the children's /metrics, rewritten on change"
    )
    targets_host: str | None = Field(
        None,
        description="host the targets file names the children at (Prometheus elsewhere, e.g. "
        "the supervisor's compose service name); unset: each child's bind address",
    )
    log_dir: Path | None = Field(
        None,
        description="where each child's log goes (<run>.<role>.log); unset: a new temporary "
        "directory, named in the supervisor's log",
    )
    aggregator_redis_url: str | None = Field(
        None,
        description="Redis URL each run's aggregator logs in with (its own user: the "
        "supervisor's may only read); unset: FEDASYNC_REDIS__URL",
    )
    evaluator_redis_url: str | None = Field(
        None,
        description="Redis URL each run's evaluator logs in with; unset: FEDASYNC_REDIS__URL",
    )


class LogSettings(Section):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")
    json_format: bool = Field(False, description="one JSON object per line instead of text")


class Settings(BaseSettings):
    """All settings of fedasync; each service reads the sections it needs."""

    # enable_decoding=False: pydantic-settings hands a list or table over as the text it was
    # given, and `Section._from_text` reads the JSON, so text that is not JSON is named by its
    # variable like any other bad value (not an error about a whole section)
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
        enable_decoding=False,
    )

    redis: RedisSettings = RedisSettings()
    policy: PolicySettings = PolicySettings()
    budget: BudgetSettings = BudgetSettings()
    task: TaskSettings = TaskSettings()
    aggregator: AggregatorSettings = AggregatorSettings()
    snapshot: SnapshotSettings = SnapshotSettings()
    worker: WorkerSettings = WorkerSettings()
    evaluator: EvaluatorSettings = EvaluatorSettings()
    control: ControlSettings = ControlSettings()
    wire: WireSettings = WireSettings()
    dedup: DedupSettings = DedupSettings()
    auth: AuthSettings = AuthSettings()
    ingest: IngestSettings = IngestSettings()
    receipts: ReceiptsSettings = ReceiptsSettings()
    http: HttpSettings = HttpSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    log: LogSettings = LogSettings()

    @model_validator(mode="after")
    def _slow_devices_need_a_profile(self) -> Settings:
        """rare_class_on_slow gives the class to the slowest devices of the latency profile;
        without one no device is slower than another."""
        if self.task.partition == "rare_class_on_slow" and self.worker.profile == "none":
            raise ValueError(
                "task.partition rare_class_on_slow needs a worker.profile other than none: "
                "the slow devices are those with the largest median latency"
            )
        return self

    @model_validator(mode="after")
    def _read_times_out_after_blocking(self) -> Settings:
        """A blocking XREADGROUP must return before the socket gives up on it."""
        if self.redis.socket_timeout_s * 1000 <= self.aggregator.block_ms:
            raise ValueError(
                f"redis.socket_timeout_s ({self.redis.socket_timeout_s} s) must exceed "
                f"aggregator.block_ms ({self.aggregator.block_ms} ms)"
            )
        return self


def setting_names() -> set[str]:
    """Every environment variable that names a setting."""
    names = set()
    for section_name, section in _sections():
        for name in section.model_fields:
            names.add(env_name(section_name, name))
    return names


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment (and overrides), or raise one readable SettingsError.

    A FEDASYNC_ variable that names no setting is an error: a typo must not silently leave a
    default in force. An override that came from a command-line flag is named by that flag with
    `SettingsError.naming` (services/commands/flags.py).
    """
    known = setting_names()
    unknown = sorted(
        k for k in os.environ if k.upper().startswith(ENV_PREFIX) and k.upper() not in known
    )
    if unknown:
        raise SettingsError("unknown settings (see docs/configuration.md): " + ", ".join(unknown))
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise SettingsError.of(tuple(_problem(error) for error in exc.errors())) from None
    except SourceError as exc:  # pydantic-settings could not read a variable: still one line
        cause = f": {exc.__cause__}" if exc.__cause__ is not None else ""
        raise SettingsError(f"invalid settings: {exc}{cause}") from None


def validated(data: Mapping[str, Any]) -> Settings:
    """Settings from `data` alone (sections as tables), checked by every rule the environment's
    settings are; the environment is not read. SettingsError in load_settings' words.

    How a process that runs others builds each one's settings (the supervisor, one per run)."""
    try:
        return _GivenSettings(**dict(data))
    except ValidationError as exc:
        raise SettingsError.of(tuple(_problem(error) for error in exc.errors())) from None


class _GivenSettings(Settings):
    """Settings read from the arguments only (`validated`): no environment, no file."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def _invalid(lines: list[str]) -> str:
    """One problem, one line; several, one line each under a heading."""
    if len(lines) == 1:
        return f"invalid settings: {lines[0]}"
    return "invalid settings:\n" + "\n".join(f"  {line}" for line in lines)


def _text(value: Any) -> str | None:
    """A value given as a user types it; None for a table or list (too long to repeat)."""
    if isinstance(value, (str, int, float, bool)):
        return str(value)
    return None


def _problem(error: Any) -> Problem:
    message = str(error["msg"]).removeprefix("Value error, ")
    return Problem(tuple(str(p) for p in error["loc"]), _text(error.get("input")), message)


def settings_env(settings: Settings) -> dict[str, str]:
    """Every setting as the environment variable that would set it (unset ones left out).

    How `fedasync up` hands one validated configuration to each child process, so no child
    can end up with a default the parent did not mean. Secrets are passed in clear: the child
    needs them.
    """
    env = {}
    for section_name, _ in _sections():
        section = getattr(settings, section_name)
        values = section.model_dump(mode="json")
        for name, value in values.items():
            raw = getattr(section, name)
            if isinstance(raw, SecretStr):
                value = raw.get_secret_value()
            if value is None:
                continue
            env[env_name(section_name, name)] = (
                value if isinstance(value, str) else json.dumps(value)
            )
    return env


def settings_reference() -> str:
    """Markdown table of every setting: variable, default, meaning (docs/configuration.md)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for section_name, section in _sections():
        for name, field in section.model_fields.items():
            env = env_name(section_name, name)
            default = field.get_default(call_default_factory=True)
            shown = "unset" if default is None else f"`{getattr(default, 'value', default)}`"
            meaning = field.description or ""
            rows.append(f"| `{env}` | {shown} | {meaning} |")
    return "\n".join(rows) + "\n"


def _sections() -> list[tuple[str, type[BaseModel]]]:
    out = []
    for section_name, section_field in Settings.model_fields.items():
        section = section_field.annotation
        if not (isinstance(section, type) and issubclass(section, BaseModel)):
            raise TypeError(f"settings section {section_name} is not a model")
        out.append((section_name, section))
    return out
