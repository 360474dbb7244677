"""Automatic degradation rules: small pure objects, figures in, actions out.

Each rule sees a summary of the recent window (`Figures`) at a time of the caller's choosing and
answers with actions: flip a switch (shared/switches.py) or raise an alert. Thresholds come with
hysteresis (a lower level to clear), a hold time (a condition must last before it counts) and a
cool-down (no two actions of a rule closer than that), so a rate hovering at the threshold never
makes a rule flap. No clock is read: time comes in with the figures, so the control service runs
these on the wall clock and the simulator on virtual time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class Figures:
    """The recent window, as the control service (or the simulator) measured it."""

    now: float  # seconds, any origin
    update_rate: float = 0.0  # updates decided per second over the window
    drop_share: float = 0.0  # share of the window's decisions that were drops
    consecutive_drops: int = 0  # drops since the last applied update
    lag: float = 0.0  # entries waiting in the stream (or seconds the oldest has waited)
    #: per client over its last decisions: (applied, decided)
    clients: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: Redis memory used ÷ its `maxmemory` (0 when it has no limit, or in the simulator)
    memory_share: float = 0.0


class ActionKind(StrEnum):
    SWITCH_ON = "switch_on"
    SWITCH_OFF = "switch_off"
    ALERT = "alert"


@dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    rule: str
    message: str
    switch: str | None = None
    client: str | None = None


@dataclass(slots=True)
class Hysteresis:
    """On above `high` held for `hold_s`; off below `low` held for `hold_s`; `cooldown_s` apart."""

    high: float
    low: float
    hold_s: float
    cooldown_s: float
    active: bool = False
    _since: float | None = None
    _last_change: float = float("-inf")

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ValueError(f"hysteresis needs low <= high, got {self.low} > {self.high}")

    def set_active(self, active: bool) -> None:
        """Take the state from outside (what is recorded in force); a hold under way restarts.

        The cool-down is left alone: it separates this gate's own changes.
        """
        if active != self.active:
            self.active = active
            self._since = None

    def update(self, value: float, now: float) -> bool | None:
        """True when it turns on, False when it turns off, None when nothing changes."""
        crossing = value < self.low if self.active else value > self.high
        if not crossing:
            self._since = None
            return None
        if self._since is None:
            self._since = now
        if now - self._since < self.hold_s or now - self._last_change < self.cooldown_s:
            return None
        self.active = not self.active
        self._since = None
        self._last_change = now
        return self.active


def rule_actor(name: str) -> str:
    """Who a rule's switch flips are recorded as (`who` in the policy log and switches hash)."""
    return f"rule:{name}"


@dataclass(slots=True)
class SwitchRule:
    """Turn `switch` on while a figure stays high, off again once it is calm."""

    name: str
    figure: str  # "update_rate" or "lag"
    switch: str
    gate: Hysteresis
    enabled: bool = True
    #: the switch is on, but someone else (an operator) turned it on: theirs to turn off
    overridden: bool = False
    #: also raise an alert when it turns the switch on (a condition an operator must act on)
    alert: bool = False

    def sync(self, owner: str | None) -> None:
        """Take the switch's recorded state: `owner` is who turned it on, None if it is off.

        The gate's state otherwise lives only in memory: a control service restarted while its
        rule's switch was on would never turn it off again. A switch this rule turned on makes it
        active (it turns it off once calm); one somebody else turned on makes it stand aside
        (`overridden`) until they turn it off, so a rule never undoes an operator's decision.
        """
        self.overridden = owner is not None and owner != rule_actor(self.name)
        self.gate.set_active(owner is not None and not self.overridden)

    def evaluate(self, figures: Figures) -> list[Action]:
        if not self.enabled or self.overridden:
            return []
        value = float(getattr(figures, self.figure))
        turned = self.gate.update(value, figures.now)
        if turned is None:
            return []
        kind = ActionKind.SWITCH_ON if turned else ActionKind.SWITCH_OFF
        level = self.gate.high if turned else self.gate.low
        side = "above" if turned else "below"
        message = f"{self.figure} {value:.3g} {side} {level:.3g} for {self.gate.hold_s:g} s"
        actions = [Action(kind, self.name, message, switch=self.switch)]
        if turned and self.alert:
            actions.append(Action(ActionKind.ALERT, self.name, f"{message}: {self.switch} on"))
        return actions


@dataclass(slots=True)
class DropAlertRule:
    """Alert after `max_consecutive` drops in a row or a drop share above `max_share`."""

    max_consecutive: int
    max_share: float
    cooldown_s: float
    name: str = "drops"
    enabled: bool = True
    _last: float = float("-inf")

    def evaluate(self, figures: Figures) -> list[Action]:
        if not self.enabled or figures.now - self._last < self.cooldown_s:
            return []
        if figures.consecutive_drops >= self.max_consecutive:
            message = f"{figures.consecutive_drops} consecutive updates dropped"
        elif figures.drop_share > self.max_share:
            message = f"{figures.drop_share:.0%} of recent updates dropped"
        else:
            return []
        self._last = figures.now
        return [Action(ActionKind.ALERT, self.name, message)]


@dataclass(slots=True)
class FairnessRule:
    """Alert naming each client whose acceptance over its last `min_decisions` is below `min_rate`.

    The write-up's warning: a global acceptance of 95% can hide a few slow clients that are
    always dropped, and with them a class of data the model never learns.
    """

    min_rate: float
    min_decisions: int
    cooldown_s: float
    name: str = "fairness"
    enabled: bool = True
    _last: dict[str, float] = field(default_factory=dict)

    def evaluate(self, figures: Figures) -> list[Action]:
        if not self.enabled:
            return []
        actions = []
        for client, (applied, decided) in sorted(figures.clients.items()):
            if decided < self.min_decisions or applied / decided >= self.min_rate:
                continue
            if figures.now - self._last.get(client, float("-inf")) < self.cooldown_s:
                continue
            self._last[client] = figures.now
            message = f"client {client}: {applied} of its last {decided} updates applied"
            actions.append(Action(ActionKind.ALERT, self.name, message, client=client))
        return actions


@dataclass(slots=True)
class DecisionWindow:
    """Recent decisions turned into `Figures`: fed from the ledger (control service) or directly
    by the simulator, so both measure the rate, drops and acceptance the same way."""

    window_s: float
    per_client: int
    #: (decided at, outcome, τ, α) of the decisions still inside the window
    recent: deque[tuple[float, str, int | None, float | None]] = field(default_factory=deque)
    clients: dict[str, deque[bool]] = field(default_factory=dict)
    consecutive_drops: int = 0

    def add(
        self, at: float, outcome: str, client: str, tau: int | None, alpha: float | None
    ) -> None:
        if outcome == "duplicate":
            return
        self.recent.append((at, outcome, tau, alpha))
        self.consecutive_drops = self.consecutive_drops + 1 if outcome == "dropped" else 0
        history = self.clients.setdefault(client, deque(maxlen=self.per_client))
        history.append(outcome == "applied")

    def expire(self, now: float) -> None:
        while self.recent and self.recent[0][0] < now - self.window_s:
            self.recent.popleft()

    @property
    def update_rate(self) -> float:
        return len(self.recent) / self.window_s

    @property
    def drop_share(self) -> float:
        decided = len(self.recent)
        return sum(r[1] == "dropped" for r in self.recent) / decided if decided else 0.0

    def acceptance(self) -> dict[str, tuple[int, int]]:
        """(applied, decided) over each client's last decisions."""
        return {client: (sum(h), len(h)) for client, h in self.clients.items()}

    def figures(self, now: float, lag: float = 0.0, memory_share: float = 0.0) -> Figures:
        self.expire(now)
        return Figures(
            now=now,
            update_rate=self.update_rate,
            drop_share=self.drop_share,
            consecutive_drops=self.consecutive_drops,
            lag=lag,
            clients=self.acceptance(),
            memory_share=memory_share,
        )


Rule = SwitchRule | DropAlertRule | FairnessRule


def sync_switch_rules(rules: Iterable[Rule], owners: Mapping[str, str]) -> None:
    """Give every switch rule its switch's recorded state; `owners`: switch → who turned it on,
    for each switch that is on."""
    for rule in rules:
        if isinstance(rule, SwitchRule):
            rule.sync(owners.get(rule.switch))


#: every rule's name, in the order they are evaluated
RULE_NAMES = ("update-rate", "lag", "drops", "fairness", "memory")


def build_rules(
    *,
    rate_high: float,
    rate_low: float,
    lag_high: float,
    lag_low: float,
    hold_s: float,
    cooldown_s: float,
    max_consecutive_drops: int,
    max_drop_share: float,
    fairness_min_rate: float,
    fairness_decisions: int,
    disabled: Iterable[str] = (),
    rate_switch: str = "raise-gamma",
    memory_high: float = 0.8,
    memory_low: float = 0.6,
) -> list[Rule]:
    """The automatic rules, built one way for the control service and the simulator alike.

    The memory rule turns `pause-ingest` on, and alerts, while Redis's used memory stays above
    `memory_high` of its maxmemory, before Redis refuses writes; off again below `memory_low`.
    """
    rules: list[Rule] = [
        SwitchRule(
            "update-rate",
            "update_rate",
            rate_switch,
            Hysteresis(rate_high, rate_low, hold_s, cooldown_s),
        ),
        SwitchRule(
            "lag", "lag", "freshest-only", Hysteresis(lag_high, lag_low, hold_s, cooldown_s)
        ),
        DropAlertRule(max_consecutive_drops, max_drop_share, cooldown_s),
        FairnessRule(fairness_min_rate, fairness_decisions, cooldown_s),
        SwitchRule(
            "memory",
            "memory_share",
            "pause-ingest",
            Hysteresis(memory_high, memory_low, hold_s, cooldown_s),
            alert=True,
        ),
    ]
    off = set(disabled)
    for rule in rules:
        rule.enabled = rule.name not in off
    return rules
