"""Two losses of the Sentinel-watched primary on the compose stack's `ha` profile, then the
compose run's accounting.

The stack comes up as docs/operations.md ("Redis under Sentinel") says: `--profile ha` (two
replicas of `redis` and three Sentinels), every service asking the Sentinels for the primary,
durable mode as shipped (on with the Sentinels), or set on or off. Once training runs, the
primary's host is lost: its container is frozen (`docker pause`: the process answers nothing,
connections to it hang, its name still resolves, as a dead host's does in DNS), the Sentinels
promote a replica, and then its main process gets SIGKILL by host pid and the container is
thawed, so the kill lands: a crash, which the engine answers with its restart policy. The old
primary comes back from its AOF and the Sentinels make it a replica of the new primary.

Why not a crash alone, or a cut network. A crash alone is not a lost host: the engine restarts
Redis within a second, long before the Sentinels' `down-after-milliseconds` (5 s), and they see
the same primary answer again and promote nobody. A container cut off the network, or stopped,
loses its name on the compose network; Sentinel 7.0/7.2 then fails to resolve the primary's
hostname, enters TILT over and over (the lookup blocks past its timer) and never fails over
(redis/redis#12753). So the name has to stay resolvable: the freeze keeps it.

The run waits (polling, with deadlines) for the Sentinels to name a replica, for a commit on
the new primary above the version committed before the loss, and for every service to pass its
healthcheck again. Then the second fault, a pause and a resume: the new primary is frozen past
down-after, the Sentinels promote another replica, and a second later it is thawed, not killed:
it comes back still a primary in its own eyes until the Sentinels demote it, with the services'
connections to it still open (what the first fault's kill hides). The rest is the compose chaos
run's (compose/run.py): workers stopped, stream drained, journals, ledger, `ledger verify`, the
exactly-once count.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedasync.services.commands.chaos.compose.run import (
    POLL_S,
    RECOVER_S,
    REDIS,
    Recovery,
    Run,
)
from fedasync.services.commands.chaos.compose.stack import WORKER, ComposeError, Container
from fedasync.services.commands.chaos.faults import Event
from fedasync.services.commands.chaos.schedule import Profile

#: the compose file's replicas and Sentinels (profile `ha`), as the services are told of them
REPLICA = "redis-replica"
REPLICAS = (REPLICA, "redis-replica-2")
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
SENTINEL_ADDRESSES = ",".join(f"{name}:26379" for name in SENTINELS)
#: the name the Sentinels monitor the primary under (docker/redis/sentinel.conf)
MASTER_NAME = "fedasync"
#: no seeded faults: the one failover is this run's own phase 3
HA = Profile(name="compose-ha", workers=3, warmup_s=0.0, window_s=0.0, min_gap_s=0.0, faults=())
FAILOVER = "failover"
PAUSE = "pause_primary"
#: how long a frozen primary stays frozen after the Sentinels promoted another, seconds: back
#: well inside the services' 10 s socket timeout, so commands that wait in it could complete
HOLD_S = 1.0
#: the version training reaches before the primary is lost
WARM_VERSION = 20
#: commits on the new primary after its first, before the workers stop
MORE_COMMITS = 10
#: the Sentinels' question, run inside a Sentinel's container with its own `discovery` password
#: (the password stays in that container's environment: it is on no command line)
ASK = (
    'REDISCLI_AUTH="$REDIS_PASSWORD_DISCOVERY" exec redis-cli -p 26379 --user discovery '
    f"--no-auth-warning sentinel get-master-addr-by-name {MASTER_NAME}"
)


def ha_settings(durable_replicas: int | None) -> dict[str, str]:
    """What compose interpolates for the `ha` profile with services configured for Sentinel;
    `durable_replicas` None: not set, the shipped default (on with the Sentinels)."""
    settings = {"COMPOSE_PROFILES": "ha", "FEDASYNC_REDIS__SENTINELS": SENTINEL_ADDRESSES}
    if durable_replicas is not None:
        settings["FEDASYNC_REDIS__DURABLE_REPLICAS"] = str(durable_replicas)
    return settings


class Failover(Run):
    """A compose run whose one fault is the loss of the Redis primary under Sentinel."""

    def __init__(
        self,
        root: Path,
        out: Path,
        *,
        durable_replicas: int | None = None,
        project: str = "fedasync-failover",
        say: Callable[[str], None] = print,
    ) -> None:
        super().__init__(
            root,
            out,
            0,
            project=project,
            profile=HA,
            say=say,
            extra=ha_settings(durable_replicas),
        )
        self.durable_replicas = durable_replicas
        #: the kill of the first primary, then the pause and resume of the second
        self.failover: dict[str, Any] = {}
        self.pause: dict[str, Any] = {}

    # ------------------------------------------------------------------------- the Sentinels
    def primary(self) -> str | None:
        """The host the Sentinels name as primary (the first that answers), or None."""
        for sentinel in SENTINELS:
            asked = self.stack.compose("exec", "-T", sentinel, "sh", "-c", ASK, check=False)
            words = asked.stdout.split()
            if asked.returncode == 0 and len(words) == 2:
                return words[0]
        return None

    def _wait_primary_other_than(self, host: str, timeout_s: float) -> tuple[float, str] | None:
        """Poll the Sentinels until they name a primary other than `host`; the monotonic time
        they first did, and the one they name."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            named = self.primary()
            if named is not None and named != host:
                return time.monotonic(), named
            time.sleep(POLL_S)
        return None

    def _wait_committed_above(self, version: int, timeout_s: float) -> tuple[float, int] | None:
        """Poll the control service (which reads the primary of the moment) until the committed
        version is above `version`; the monotonic time and the version then."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self._status()
            if status is not None and int(status.get("version") or 0) > version:
                return time.monotonic(), int(status["version"])
            time.sleep(POLL_S)
        return None

    # ------------------------------------------------------------------------- phase 3
    def _faults(self) -> None:
        """The loss of the primary, the promotion, the old primary back as a replica, and the
        first commit on the new primary."""
        if (first := self.primary()) != REDIS:
            raise ComposeError(f"the Sentinels name {first!r} as primary, not {REDIS!r}")
        (container,) = self.stack.containers(REDIS)
        # training well under way: a commit or two is not yet a stream of them
        if self._wait_committed_above(WARM_VERSION - 1, RECOVER_S) is None:
            raise ComposeError(f"no version {WARM_VERSION} within {RECOVER_S:.0f} s")
        marks, lost_at, promoted = self._freeze(container, REDIS, "losing")
        promoted_at = None if promoted is None else promoted[0]
        # the crash: pending while frozen (cgroup freezer), it lands as the container thaws
        process = self.stack.process(container.id)
        os.kill(process.pid, signal.SIGKILL)
        self.stack.docker("unpause", container.id, check=False)  # gone already on cgroup v2
        back = self.stack.wait_restarted(container.id, process, RECOVER_S, healthy=True)
        committed = self._wait_committed_above(marks[0], RECOVER_S)
        others = [s for s in self.stack.started if s != WORKER]
        unhealthy = self.stack.wait_healthy(others, RECOVER_S)
        healthy_at = time.monotonic()
        goes_on = self._wait_goes_on(committed)
        after = self._status_marks()
        self.failover = {
            "durable_replicas": self.durable_replicas,
            "primary_before": first,
            "primary_after": self.primary(),
            "killed": {"container": container.name, "pid": process.pid},
            "restarted_by_engine": back is not None,
            "promotion_s": None if promoted_at is None else round(promoted_at - lost_at, 1),
            "first_commit_s": None if committed is None else round(committed[0] - lost_at, 1),
            "version_before": marks[0],
            "first_version_after": None if committed is None else committed[1],
            "all_healthy_s": None if unhealthy else round(healthy_at - lost_at, 1),
            "version_later": None if goes_on is None else goes_on[1],
            "unhealthy": unhealthy,
            "marks": {"before": marks, "after": after},
        }
        recovery = Recovery(
            lost_at - self.started,
            FAILOVER,
            container.name,
            process.pid,
            process.restarts,
            None if back is None else back.restarts,
            None if unhealthy or committed is None else healthy_at - lost_at,
        )
        self.recoveries.append(recovery)
        detail = (
            f"{container.name} frozen; {self.failover['primary_after']} promoted after "
            f"{self.failover['promotion_s']} s; then killed (pid {process.pid}); first commit "
            f"above version {marks[0]} after {self.failover['first_commit_s']} s, all healthy "
            f"after {self.failover['all_healthy_s']} s (restarted: {back is not None})"
        )
        self.events.append(Event(recovery.at, FAILOVER, detail))
        self.say(f"chaos --compose --ha: {detail}")
        if promoted is not None and goes_on is not None:
            self._pause_and_resume(promoted[1])

    def _freeze(
        self, container: Container, service: str, doing: str
    ) -> tuple[tuple[int, int], float, tuple[float, str] | None]:
        """Freeze the primary `service` (cgroup freezer) and wait for the Sentinels to promote
        another: the marks before, when it froze, and (when, who) was promoted, or None."""
        marks = self._status_marks()
        if marks is None:
            raise ComposeError("the control service does not report the committed version")
        self.say(f"chaos --compose --ha: {doing} the primary {container.name} at version {marks}")
        lost_at = time.monotonic()
        self.stack.docker("pause", container.id)
        return marks, lost_at, self._wait_primary_other_than(service, RECOVER_S)

    def _wait_goes_on(self, committed: tuple[float, int] | None) -> tuple[float, int] | None:
        """Training goes on: more commits on the new primary, not just the first one."""
        if committed is None:
            return None
        return self._wait_committed_above(committed[1] + MORE_COMMITS - 1, RECOVER_S)

    def _pause_and_resume(self, service: str) -> None:
        """Freeze the primary of the moment (a replica promoted by the kill) past the
        Sentinels' down-after, until they promote another and HOLD_S longer, then thaw it: it
        comes back a primary in its own eyes, the services' connections to it still open, and
        must acknowledge nothing (durable mode, min-replicas-to-write) nor be written to (the
        services heard the switch) before the Sentinels demote it."""
        (container,) = self.stack.containers(service)
        marks, lost_at, promoted = self._freeze(container, service, "pausing")
        if promoted is not None:
            time.sleep(HOLD_S)  # the schedule's choice: frozen a moment past the promotion
        self.stack.docker("unpause", container.id)
        resumed_at = time.monotonic()
        committed = self._wait_committed_above(marks[0], RECOVER_S)
        unhealthy = self.stack.wait_healthy(
            [s for s in self.stack.started if s != WORKER], RECOVER_S
        )
        goes_on = self._wait_goes_on(committed)
        self.pause = {
            "primary_before": service,
            "primary_after": None if promoted is None else promoted[1],
            "promotion_s": None if promoted is None else round(promoted[0] - lost_at, 1),
            "frozen_s": round(resumed_at - lost_at, 1),
            "first_commit_s": None if committed is None else round(committed[0] - lost_at, 1),
            "version_before": marks[0],
            "first_version_after": None if committed is None else committed[1],
            "version_later": None if goes_on is None else goes_on[1],
            "unhealthy": unhealthy,
        }
        detail = (
            f"{container.name} frozen {self.pause['frozen_s']} s; {self.pause['primary_after']} "
            f"promoted after {self.pause['promotion_s']} s; first commit above version "
            f"{marks[0]} after {self.pause['first_commit_s']} s"
        )
        self.events.append(Event(lost_at - self.started, PAUSE, detail))
        self.say(f"chaos --compose --ha: {detail}")

    def _summary(self, **parts: Any) -> dict[str, Any]:
        """The compose run's summary and checks, with the failover's figures and its own."""
        summary = super()._summary(**parts)
        summary["mode"] = "compose-ha"
        summary["failover"] = self.failover
        checks = summary["checks"]
        checks["the Sentinels promoted the replica"] = self.failover.get("promotion_s") is not None
        checks["a commit on the new primary above the version before the loss"] = (
            self.failover.get("first_commit_s") is not None
        )
        checks["training goes on on the new primary"] = (
            self.failover.get("version_later") is not None
        )
        checks["the paused primary was replaced and training went on past it"] = (
            self.pause.get("promotion_s") is not None
            and self.pause.get("version_later") is not None
        )
        summary["pause"] = self.pause
        summary["ok"] = all(checks.values())
        # the engine's restart of the old primary follows our kill: not an unexplained one
        unexplained = Counter(summary["unexpected_restarts"]) - Counter({REDIS: 1})
        summary["unexpected_restarts"] = dict(sorted(unexplained.items()))
        return summary


def describe_failover(summary: dict[str, Any]) -> str:
    """The two losses of the primary in a line each."""
    f, p = summary["failover"], summary.get("pause") or {}
    durable = "default" if f["durable_replicas"] is None else f["durable_replicas"]
    lines = [
        f"failover (durable replicas {durable}): primary {f['primary_before']} killed -> "
        f"{f['primary_after']}; promotion {f['promotion_s']} s, first commit on the new primary "
        f"{f['first_commit_s']} s (version {f['version_before']} -> {f['first_version_after']}, "
        f"later {f['version_later']}), every service healthy {f['all_healthy_s']} s after the loss"
    ]
    if p:
        lines.append(
            f"pause: primary {p['primary_before']} frozen {p['frozen_s']} s -> "
            f"{p['primary_after']}; promotion {p['promotion_s']} s, first commit on the new "
            f"primary {p['first_commit_s']} s (version {p['version_before']} -> "
            f"{p['first_version_after']}, later {p['version_later']})"
        )
    return "\n".join(lines)
