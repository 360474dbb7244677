"""Runs the automatic rules (shared/rules.py) on the live ledger and stream.

Each tick reads the decisions committed since the last one, keeps a sliding window of them, turns
it into `Figures`, lets every enabled rule decide, and carries out what they ask: switches go
through the same switchboard as an operator's (an audited policy version), alerts are appended to
the alerts stream. The clock is injected so tests step it instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import msgpack
import redis.asyncio as aioredis

from services.control.switchboard import set_switch
from services.keys import AGGREGATOR_GROUP, Keys
from services.policy_store import PolicyConflict
from services.redis_conn import TRANSIENT
from shared.rules import (
    Action,
    ActionKind,
    DropAlertRule,
    FairnessRule,
    Figures,
    Hysteresis,
    SwitchRule,
)
from shared.settings import ControlSettings
from shared.switches import SwitchError

log = logging.getLogger(__name__)

Rule = SwitchRule | DropAlertRule | FairnessRule


def build_rules(cfg: ControlSettings) -> list[Rule]:
    rules: list[Rule] = [
        SwitchRule(
            "update-rate",
            "update_rate",
            "raise-gamma",
            Hysteresis(cfg.rate_high, cfg.rate_low, cfg.hold_s, cfg.cooldown_s),
        ),
        SwitchRule(
            "lag",
            "lag",
            "freshest-only",
            Hysteresis(cfg.lag_high, cfg.lag_low, cfg.hold_s, cfg.cooldown_s),
        ),
        DropAlertRule(cfg.max_consecutive_drops, cfg.max_drop_share, cfg.cooldown_s),
        FairnessRule(cfg.fairness_min_rate, cfg.fairness_decisions, cfg.cooldown_s),
    ]
    for rule in rules:
        rule.enabled = rule.name not in cfg.disabled_rules
    return rules


class RuleRunner:
    def __init__(
        self,
        cfg: ControlSettings,
        redis: aioredis.Redis,
        keys: Keys,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.redis = redis
        self.keys = keys
        self.clock = clock
        self.rules = build_rules(cfg)
        self._cursor = "0-0"
        self._window: deque[tuple[float, bool]] = deque()  # (decided at, dropped)
        self._clients: dict[str, deque[bool]] = {}  # last decisions per client: applied?
        self._consecutive_drops = 0

    async def tick(self) -> list[Action]:
        """Read what was committed since the last tick, evaluate the rules, act."""
        await self._read_ledger()
        figures = await self._figures()
        actions = [a for rule in self.rules for a in rule.evaluate(figures)]
        for action in actions:
            await self._carry_out(action)
        return actions

    async def _read_ledger(self) -> None:
        while True:
            entries: Any = await self.redis.xrange(
                self.keys.ledger, min="(" + self._cursor, max="+", count=1000
            )
            for entry_id, fields in entries:
                record = msgpack.unpackb(fields[b"d"], raw=False)
                if record["outcome"] == "duplicate":
                    continue
                dropped = record["outcome"] == "dropped"
                self._window.append((float(record["at"]), dropped))
                self._consecutive_drops = self._consecutive_drops + 1 if dropped else 0
                history = self._clients.setdefault(
                    record["client_id"], deque(maxlen=self.cfg.fairness_decisions)
                )
                history.append(record["outcome"] == "applied")
                self._cursor = entry_id.decode()
            if len(entries) < 1000:
                return

    async def _figures(self) -> Figures:
        now = self.clock()
        while self._window and self._window[0][0] < now - self.cfg.window_s:
            self._window.popleft()
        decided = len(self._window)
        drops = sum(1 for _, dropped in self._window if dropped)
        lag = 0.0
        if await self.redis.exists(self.keys.updates):
            groups: Any = await self.redis.xinfo_groups(self.keys.updates)
            for group in groups:
                if group["name"] in (AGGREGATOR_GROUP, AGGREGATOR_GROUP.encode()):
                    lag = float(group.get("lag") or 0) + float(group["pending"])
        return Figures(
            now=now,
            update_rate=decided / self.cfg.window_s,
            drop_share=drops / decided if decided else 0.0,
            consecutive_drops=self._consecutive_drops,
            lag=lag,
            clients={c: (sum(h), len(h)) for c, h in self._clients.items()},
        )

    async def _carry_out(self, action: Action) -> None:
        log.warning("rule %s: %s (%s)", action.rule, action.kind.value, action.message)
        if action.kind is ActionKind.ALERT:
            fields: dict[Any, Any] = {
                "rule": action.rule,
                "message": action.message,
                "at": repr(self.clock()),
            }
            if action.client:
                fields["client"] = action.client
            await self.redis.xadd(self.keys.alerts, fields, maxlen=10_000, approximate=True)
            return
        assert action.switch is not None
        try:
            await set_switch(
                self.redis,
                self.keys,
                action.switch,
                action.kind is ActionKind.SWITCH_ON,
                reason=f"rule {action.rule}: {action.message}",
                who=f"rule:{action.rule}",
            )
        except (SwitchError, PolicyConflict) as exc:  # an operator got there first
            log.info("rule %s did not flip %s: %s", action.rule, action.switch, exc)

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.tick()
            except TRANSIENT as exc:
                log.warning("rules skipped a tick: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.cfg.rules_interval_s)
