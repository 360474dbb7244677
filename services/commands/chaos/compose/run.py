"""`fedasync chaos --compose`: crash the compose stack's containers while it trains, then check.

The phases, in order:

1. up: the repository's docker-compose.yml (compose's own list of services; Grafana only where
   its image is on the engine) with the profile's workers, each journalling its publishes in its
   own container, budgets out of reach; wait until every healthcheck passes;
2. wait until training runs: the snapshot service's long-poll answers a version above 0;
3. the faults of a seeded schedule (chaos/schedule.py): SIGKILL to the main process of a worker,
   of the aggregator, of Redis (the engine's restart policy brings each back, Redis from its
   AOF and ACL file on its volume), and `docker compose restart snapshot`. After each, wait
   until the engine restarted the container and its healthcheck passes. Around a Redis kill the
   control service's status is read: the committed version and the ledger's length after the
   restart may not be less than before it;
4. stop the workers (`docker compose stop worker`: SIGTERM, a publish in flight completes and
   is journalled), wait until the control service reports the stream drained and the snapshot
   service serves the committed version, and until every service is healthy again;
5. read the journals out of the worker containers, the ledger, the stream, `ledger verify` and
   ACL LOG through the tools service (compose/reader.py), dead letters and alerts from the
   control service; count with the exactly-once check (services/stores/exactly_once.py);
6. save the logs and take the stack down (`down --volumes`), unless asked to keep it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedasync.services.commands.chaos import verdict_report
from fedasync.services.commands.chaos.compose.stack import (
    JOURNAL_PATH,
    WORKER,
    ComposeError,
    Stack,
    fresh_settings,
    http_json,
)
from fedasync.services.commands.chaos.faults import Event
from fedasync.services.commands.chaos.probe import served_model
from fedasync.services.commands.chaos.schedule import Fault, FaultKind, Profile, build_schedule
from fedasync.services.stores.alerts import STATE_MISMATCH, VERSION_REGRESSED
from fedasync.services.stores.exactly_once import Decided, Verdict, check
from fedasync.services.worker.journal import read_journals

#: the faults of a compose run: each kind the issue asks for, several worker kills
COMPOSE = Profile(
    name="compose",
    workers=3,
    warmup_s=5.0,
    window_s=60.0,
    min_gap_s=2.0,
    faults=(
        (FaultKind.KILL_WORKER, 4),
        (FaultKind.KILL_AGGREGATOR, 2),
        (FaultKind.KILL_REDIS, 2),
        (FaultKind.RESTART_SNAPSHOT, 1),
    ),
)
#: the kinds a compose run can inject (the others need the process harness's own plumbing)
COMPOSE_KINDS = frozenset(
    {
        FaultKind.KILL_WORKER,
        FaultKind.KILL_AGGREGATOR,
        FaultKind.KILL_REDIS,
        FaultKind.RESTART_SNAPSHOT,
    }
)
AGGREGATOR = "aggregator"
SNAPSHOT = "snapshot"
CONTROL = "control"
REDIS = "redis"
#: the service each kind of kill crashes a container of
KILLED = {
    FaultKind.KILL_WORKER.value: WORKER,
    FaultKind.KILL_AGGREGATOR.value: AGGREGATOR,
    FaultKind.KILL_REDIS.value: REDIS,
}
#: budgets out of reach: training never closes during a run
NO_BUDGET = "100000000"
#: deadlines, generous for a loaded machine: a restart to healthy, the drain, the first update
RECOVER_S = 180.0
DRAIN_S = 300.0
START_S = 300.0
POLL_S = 0.5


@dataclass(slots=True)
class Recovery:
    """One fault and how the stack came back from it."""

    at: float
    kind: str
    container: str
    pid: int
    restarts_before: int
    restarts_after: int | None
    #: seconds from the fault until the container ran (and was healthy) again; None: never
    seconds: float | None
    #: Redis kills: (version, ledger length) from the control service before and after
    before: tuple[int, int] | None = None
    after: tuple[int, int] | None = None

    @property
    def recovered(self) -> bool:
        return self.seconds is not None

    @property
    def commits_kept(self) -> bool:
        """A Redis kill: both readings made, nothing less after; any other fault: True."""
        if self.kind != FaultKind.KILL_REDIS.value:
            return True
        if self.before is None or self.after is None:
            return False
        return all(a >= b for a, b in zip(self.after, self.before, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 2),
            "kind": self.kind,
            "container": self.container,
            "pid": self.pid,
            "restarts": [self.restarts_before, self.restarts_after],
            "seconds": None if self.seconds is None else round(self.seconds, 1),
            "before": self.before,
            "after": self.after,
            "commits_kept": self.commits_kept,
        }


class Run:
    """One compose chaos run; `execute` returns the summary (also in `out`/summary.json)."""

    def __init__(
        self,
        root: Path,
        out: Path,
        seed: int,
        *,
        project: str = "fedasync-chaos",
        profile: Profile = COMPOSE,
        say: Callable[[str], None] = print,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        unsupported = {k for k, n in profile.faults if n > 0} - COMPOSE_KINDS
        if unsupported:
            raise ValueError(f"a compose run cannot inject {sorted(unsupported)}")
        self.out = out
        self.seed = seed
        self.profile = profile
        self.say = say
        settings = fresh_settings(
            FEDASYNC_BUDGET__MAX_UPDATES=NO_BUDGET,
            FEDASYNC_BUDGET__MAX_SECONDS=NO_BUDGET,
            FEDASYNC_WORKER__JOURNAL=JOURNAL_PATH,
            **(extra or {}),
        )
        self.stack = Stack(root, project, settings, say)
        self.token = settings["FEDASYNC_CONTROL__TOKEN"]
        self.events: list[Event] = []
        self.recoveries: list[Recovery] = []
        self.injected: Counter[str] = Counter()
        self.started = 0.0
        self.figures: dict[str, float] = {}
        self.control = self.snapshot = ""
        #: faults left out because the stack did not recover from an earlier one
        self.skipped = 0
        self.restarts_at_start: Counter[str] = Counter()

    # ------------------------------------------------------------------------- the phases
    def execute(self, keep: bool = False) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        begun = time.monotonic()
        try:
            self._start()
            self._faults()
            summary = self._finish(begun)
        finally:
            if keep:
                self.say(f"chaos --compose: stack kept (project {self.stack.project})")
            else:
                self.stack.down(logs_to=self.out / "logs" / "compose.log")
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _start(self) -> None:
        """Phases 1 and 2: up, every healthcheck passing, then training running."""
        workers = self.profile.workers
        self.say(f"chaos --compose: up, {workers} workers (project {self.stack.project})")
        self.figures["up_to_healthy_s"] = self.stack.up(self.profile.workers)
        self.control = self.stack.url(CONTROL, 8082)
        self.snapshot = self.stack.url(SNAPSHOT, 8081)
        self.restarts_at_start = self._restart_counts()
        healthy = time.monotonic()
        self._wait_training()
        self.figures["healthy_to_first_update_s"] = self.started - healthy

    def _faults(self) -> None:
        """Phase 3: the seeded schedule; a subclass with faults of its own overrides it."""
        schedule = build_schedule(self.profile, self.seed)
        self.say(f"chaos --compose: {len(schedule)} faults over {self.profile.window_s:.0f} s")
        for fault in schedule:
            recovery = self._inject(fault)
            if not (recovery.recovered and recovery.commits_kept):
                # broken for good: report now rather than wait out every later deadline
                self.skipped = len(schedule) - len(self.recoveries)
                self.say(f"chaos --compose: not recovered; {self.skipped} faults skipped")
                break

    def _finish(self, begun: float) -> dict[str, Any]:
        """Phases 4 and 5: stop the workers, drain, read everything back and count."""
        self.say("chaos --compose: faults over; stopping the workers and draining")
        self.stack.compose("stop", WORKER, timeout_s=120)
        # a stack that did not recover drains nothing: a short look, not the full deadline
        short = RECOVER_S / 6 if self.skipped else None
        drained, status = self._wait_drained(short or DRAIN_S)
        served = self._wait_served(int(status.get("version") or 0), short or RECOVER_S)
        others = [s for s in self.stack.started if s != WORKER]
        unhealthy = self.stack.wait_healthy(others, short or RECOVER_S)
        restarts_at_end = self._restart_counts()
        journals = self._journals()
        read = self._read()
        _, alerts = http_json(f"{self.control}/v1/alerts?count=10000", self.token)
        return self._summary(
            duration_s=time.monotonic() - begun,
            drained=drained,
            status=status,
            served=served,
            unhealthy=unhealthy,
            engine_restarts=restarts_at_end - self.restarts_at_start,
            journals=journals,
            read=read,
            alerts=Counter(str(a.get("rule")) for a in alerts or []),
        )

    def _wait_training(self) -> None:
        """Long-poll the snapshot service until a version above 0 is served."""
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            code, meta = http_json(f"{self.snapshot}/v1/models/latest/meta?newer_than=0&wait=20")
            if code == 200 and meta and int(meta["version"]) > 0:
                self.started = time.monotonic()
                self.say(f"chaos --compose: training runs (version {meta['version']})")
                return
            if code != 200:
                time.sleep(POLL_S)
        raise ComposeError(f"no version above 0 within {START_S:.0f} s: is training stuck?")

    def _inject(self, fault: Fault) -> Recovery:
        at = self.started + fault.at
        if (wait := at - time.monotonic()) > 0:
            time.sleep(wait)  # the schedule's instant: a time of day, not a synchronisation
        now = time.monotonic() - self.started
        kind = fault.kind
        self.injected[kind.value] += 1
        if kind is FaultKind.RESTART_SNAPSHOT:
            (container,) = self.stack.containers(SNAPSHOT)
            begun = time.monotonic()
            self.stack.compose("restart", SNAPSHOT, timeout_s=RECOVER_S)
            problems = self.stack.wait_healthy([SNAPSHOT], RECOVER_S)
            seconds = None if problems else time.monotonic() - begun
            recovery = Recovery(now, kind.value, container.name, 0, 0, 0, seconds)
        else:
            service = KILLED[kind.value]
            candidates = self.stack.containers(service)
            container = candidates[fault.target % len(candidates)]
            before = self._status_marks() if kind is FaultKind.KILL_REDIS else None
            begun = time.monotonic()
            process = self.stack.crash(container.id)
            back = self.stack.wait_restarted(
                container.id, process, RECOVER_S, healthy=service != WORKER
            )
            seconds = None if back is None else time.monotonic() - begun
            recovery = Recovery(
                now,
                kind.value,
                container.name,
                process.pid,
                process.restarts,
                None if back is None else back.restarts,
                seconds,
            )
            if before is not None:
                recovery.before = before
                recovery.after = self._status_marks()
        self.recoveries.append(recovery)
        back_in = "NOT back" if seconds is None else f"back in {seconds:.1f} s"
        pid = f" (pid {recovery.pid})" if recovery.pid else ""
        detail = f"{recovery.container}{pid}: {back_in}"
        if recovery.before is not None:
            detail += f"; version, ledger {recovery.before} -> {recovery.after}"
        self.events.append(Event(now, kind.value, detail))
        self.say(f"chaos --compose: t={now:6.1f} s {kind.value}: {detail}")
        return recovery

    def _status(self) -> dict[str, Any] | None:
        code, body = http_json(f"{self.control}/v1/status", self.token)
        return body if code == 200 and isinstance(body, dict) else None

    def _status_marks(self) -> tuple[int, int] | None:
        """(committed version, ledger length) from the control service, once it answers."""
        deadline = time.monotonic() + RECOVER_S
        while time.monotonic() < deadline:
            status = self._status()
            if status is not None and status.get("version") is not None:
                return int(status["version"]), int(status["decisions"])
            time.sleep(POLL_S)
        return None

    def _wait_drained(self, timeout_s: float) -> tuple[bool, dict[str, Any]]:
        """Poll the control service until every entry is delivered, acknowledged and decided."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self._status() or status
            if (
                status
                and status["pending"] == 0
                and status["lag"] == 0
                and status["decisions"] + status["dead_letters"] >= status["stream_length"]
            ):
                return True, status
            time.sleep(POLL_S)
        return False, status

    def _wait_served(self, version: int, timeout_s: float) -> tuple[int, bytes]:
        """Poll the snapshot service's published port until it serves `version`."""
        deadline = time.monotonic() + timeout_s
        got: tuple[int, bytes] = (-1, b"")
        while time.monotonic() < deadline:
            got = served_model(self.snapshot) or got
            if got[0] >= version:
                break
            time.sleep(POLL_S)
        return got

    def _restart_counts(self) -> Counter[str]:
        """Restarts the engine made so far, by service."""
        counts: Counter[str] = Counter()
        for container in self.stack.containers():
            counts[container.service] += self.stack.process(container.id).restarts
        return counts

    def _journals(self) -> Any:
        paths = []
        for container in self.stack.containers(WORKER):
            path = self.out / "journal" / f"{container.name}.journal"
            if self.stack.copy_out(container.id, JOURNAL_PATH, path):
                paths.append(path)
        return read_journals(paths)

    def _read(self) -> dict[str, Any]:
        stdout = self.stack.tool(
            "-m", "fedasync.services.commands.chaos.compose.reader", entrypoint="python"
        )
        return dict(json.loads(stdout.strip().splitlines()[-1]))

    # ------------------------------------------------------------------------- the figures
    def _summary(
        self,
        *,
        duration_s: float,
        drained: bool,
        status: dict[str, Any],
        served: tuple[int, bytes],
        unhealthy: list[str],
        engine_restarts: Counter[str],
        journals: Any,
        read: dict[str, Any],
        alerts: Counter[str],
    ) -> dict[str, Any]:
        verdict = _verdict(journals, read)
        served_sha = _sha(served[1])
        committed = read["committed"]
        checks = self._checks(
            verdict,
            drained=drained,
            status=status,
            served_equal=served[0] == committed["version"]
            and served_sha == committed["sha256"] != "",
            unhealthy=unhealthy,
            journals=journals,
            read=read,
            alerts=alerts,
        )
        return {
            "mode": "compose",
            "project": self.stack.project,
            "seed": self.seed,
            "out": str(self.out),
            "duration_s": round(duration_s, 1),
            "up_to_healthy_s": round(self.figures["up_to_healthy_s"], 1),
            "healthy_to_first_update_s": round(self.figures["healthy_to_first_update_s"], 1),
            "services": self.stack.started,
            "left_out": self.stack.left_out,
            "workers": self.profile.workers,
            **self._fault_figures(engine_restarts),
            "updates": verdict_report.update_counts(
                verdict,
                stream_entries=len(read["entry_ids"]),
                ledger_records=len(read["records"]),
            ),
            **verdict_report.verdict_counts(verdict),
            "dead_letters": status.get("dead_letters"),
            "verify": read["verify"],
            "served": verdict_report.served_figures(
                served[0], served_sha, committed["version"], committed["sha256"]
            ),
            "alerts": dict(sorted(alerts.items())),
            "acl_refusals": read["acl_refusals"][: verdict_report.EXAMPLES],
            "unhealthy_at_end": unhealthy,
            "examples": verdict_report.verdict_examples(verdict, indeterminate=False),
            "checks": checks,
            "ok": all(checks.values()),
            "events": [event.to_dict() for event in self.events],
        }

    def _checks(
        self,
        verdict: Verdict,
        *,
        drained: bool,
        status: dict[str, Any],
        served_equal: bool,
        unhealthy: list[str],
        journals: Any,
        read: dict[str, Any],
        alerts: Counter[str],
    ) -> dict[str, bool]:
        """The `checks` entries the exit code and the CI test read."""
        redis_kills = [r for r in self.recoveries if r.kind == FaultKind.KILL_REDIS.value]
        scheduled = {kind.value for kind, count in self.profile.faults if count > 0}
        return {
            "every fault kind injected": all(self.injected[k] > 0 for k in scheduled)
            and not self.skipped,
            "every container back (restart policy) and healthy after each fault": all(
                r.recovered for r in self.recoveries
            ),
            "commits kept across every Redis restart": all(r.commits_kept for r in redis_kills),
            "stream drained": drained,
            "no dead letters": status.get("dead_letters", -1) == 0,
            **verdict_report.verdict_checks(verdict),
            "ledger verify passes": bool(read["verify"]["ok"]),
            "served == committed": served_equal,
            "journals intact": journals.malformed == 0,
            "no move back in time alarmed": not (
                alerts[STATE_MISMATCH] or alerts[VERSION_REGRESSED]
            ),
            "no command refused by Redis's ACL": not read["acl_refusals"],
            "every service healthy at the end": not unhealthy,
        }

    def _fault_figures(self, engine_restarts: Counter[str]) -> dict[str, Any]:
        """The faults injected, the kills among them, each recovery, and the restarts the
        engine made (those no kill of ours explains apart)."""
        kills = Counter(r.kind for r in self.recoveries)
        ours = Counter({KILLED[kind]: n for kind, n in kills.items() if kind in KILLED})
        return {
            "faults": dict(sorted(self.injected.items())),
            "faults_skipped": self.skipped,
            "kills": dict(sorted(kills.items())),
            "recoveries": [r.to_dict() for r in self.recoveries],
            "recovery_s": _spread([r.seconds for r in self.recoveries]),
            "engine_restarts": dict(sorted(engine_restarts.items())),
            # restarts no kill of ours explains: e.g. an aggregator that found Redis gone
            "unexpected_restarts": dict(sorted((engine_restarts - ours).items())),
        }


def _verdict(journals: Any, read: dict[str, Any]) -> Verdict:
    """The exactly-once check of what the workers journalled against what the tools read."""
    return check(
        set(journals.acknowledged),
        journals.attempted,
        [Decided.from_record(record) for record in read["records"]],
        read["entry_ids"],
        frozenset(),  # dead letters: the control service counts them, and there must be none
    )


def _spread(values: list[float | None]) -> dict[str, float] | None:
    known = sorted(v for v in values if v is not None)
    if not known:
        return None
    return {"min": round(known[0], 1), "max": round(known[-1], 1)}


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest() if raw else ""


def describe(summary: dict[str, Any]) -> str:
    """The figures a person reads after a compose run, one topic per line."""
    u = summary["updates"]
    versions = summary["versions"]
    spread = summary["recovery_s"] or {"min": 0, "max": 0}
    lines = [
        f"chaos --compose: seed {summary['seed']}, {summary['duration_s']} s "
        f"(up to healthy {summary['up_to_healthy_s']} s), summary and logs in {summary['out']}",
        "services: "
        + ", ".join(summary["services"])
        + "".join(f"; {name} left out: {why}" for name, why in summary["left_out"].items()),
        "faults: "
        + verdict_report.counts_text(summary["faults"])
        + f"; each container back in {spread['min']}-{spread['max']} s"
        + (
            f"; {summary['faults_skipped']} skipped (not recovered)"
            if summary["faults_skipped"]
            else ""
        ),
        "restarts by the engine: "
        + verdict_report.counts_text(summary["engine_restarts"])
        + "; of which no kill of ours: "
        + verdict_report.counts_text(summary["unexpected_restarts"]),
        verdict_report.updates_line(u),
        verdict_report.verdict_line(summary) + f", dead letters {summary['dead_letters']}",
        f"versions {versions['first']}..{versions['last']}, "
        f"{summary['version_gaps']} breaks in the sequence",
        verdict_report.served_line(summary["served"]),
        summary["verify"]["text"],
        *(
            f"  Redis kill at t={r['at']} s: version, ledger {r['before']} -> {r['after']}: "
            + ("kept" if r["commits_kept"] else "LOST")
            for r in summary["recoveries"]
            if r["kind"] == FaultKind.KILL_REDIS.value
        ),
        "alerts: " + verdict_report.counts_text(summary["alerts"]),
        "commands refused by the ACL (since Redis's last start): "
        + ("; ".join(summary["acl_refusals"]) or "none"),
    ]
    return "\n".join([*lines, *verdict_report.check_lines(summary, "chaos --compose")])
