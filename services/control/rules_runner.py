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
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from fedasync.services.control.metrics import ControlMetrics
from fedasync.services.control.switchboard import set_switch, switch_owners
from fedasync.services.control.window import LedgerWindow, RunWindows
from fedasync.services.runtime.redis_conn import TRANSIENT
from fedasync.services.runtime.run_clients import RunClients
from fedasync.services.runtime.settings import ControlSettings
from fedasync.services.stores.alerts import add_alert
from fedasync.services.stores.backlog import read_backlog
from fedasync.services.stores.memory import read_memory
from fedasync.services.stores.policy_store import PolicyConflict
from fedasync.services.stores.runs import list_runs, run_status
from fedasync.shared.keys import Keys
from fedasync.shared.rules import Action, ActionKind, Rule, rule_actor, sync_switch_rules
from fedasync.shared.rules import build_rules as shared_build_rules
from fedasync.shared.runs import RunStatus
from fedasync.shared.switches import SwitchError

log = logging.getLogger(__name__)


def build_rules(cfg: ControlSettings) -> list[Rule]:
    """The rules with the configured thresholds (the simulator builds them the same way)."""
    return shared_build_rules(
        rate_high=cfg.rate_high,
        rate_low=cfg.rate_low,
        lag_high=cfg.lag_high,
        lag_low=cfg.lag_low,
        hold_s=cfg.hold_s,
        cooldown_s=cfg.cooldown_s,
        max_consecutive_drops=cfg.max_consecutive_drops,
        max_drop_share=cfg.max_drop_share,
        fairness_min_rate=cfg.fairness_min_rate,
        fairness_decisions=cfg.fairness_decisions,
        disabled=cfg.disabled_rules,
        memory_high=cfg.memory_high,
        memory_low=cfg.memory_low,
    )


class RuleRunner:
    def __init__(
        self,
        cfg: ControlSettings,
        redis: aioredis.Redis,
        keys: Keys,
        clock: Callable[[], float] = time.time,
        window: LedgerWindow | None = None,
        metrics: ControlMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.redis = redis
        self.keys = keys
        self.clock = clock
        self.rules = build_rules(cfg)
        self.window = window or LedgerWindow(redis, keys, cfg.window_s, cfg.fairness_decisions)
        self.metrics = metrics or ControlMetrics()

    async def tick(self) -> list[Action]:
        """Read what was committed since the last tick, evaluate the rules, act.

        Each switch rule first takes its switch's state from the switches hash: that is what is in
        force, whatever this process remembers (a restart, an operator's flip, a lost race).
        """
        now = self.clock()
        await self.window.refresh(now)
        backlog = await read_backlog(self.redis, self.keys)
        sync_switch_rules(self.rules, await switch_owners(self.redis, self.keys))
        memory = await read_memory(self.redis, key=self.keys.state)
        self.metrics.observe_memory(memory)
        figures = self.window.figures(now, float(backlog.waiting), memory.share)
        actions = [a for rule in self.rules for a in rule.evaluate(figures)]
        for action in actions:
            await self._carry_out(action)
        return actions

    async def _carry_out(self, action: Action) -> None:
        log.warning("rule %s: %s (%s)", action.rule, action.kind.value, action.message)
        self.metrics.rule_actions.labels(action.rule, action.kind.value).inc()
        if action.kind is ActionKind.ALERT:
            await add_alert(
                self.redis, self.keys, action.rule, action.message, self.clock(), action.client
            )
            return
        assert action.switch is not None
        try:
            policy = await set_switch(
                self.redis,
                self.keys,
                action.switch,
                action.kind is ActionKind.SWITCH_ON,
                reason=f"rule {action.rule}: {action.message}",
                who=rule_actor(action.rule),
            )
            self.metrics.policy_changes.labels("rule").inc()
            self.metrics.policy_version.set(policy.version)
        except (SwitchError, PolicyConflict) as exc:  # an operator got there first
            log.info("rule %s did not flip %s: %s", action.rule, action.switch, exc)

    async def run(self, stopping: asyncio.Event) -> None:
        """Tick every `rules_interval_s` until `stopping`; a failed tick is logged, counted and
        skipped, never the end of the loop (a refused command, e.g. NOPERM or OOM, may pass)."""
        while not stopping.is_set():
            try:
                await self.tick()
            except TRANSIENT as exc:
                self.metrics.rule_failures.labels("connection").inc()
                log.warning("rules skipped a run, Redis unreachable: %s", exc)
            except RedisError as exc:
                self.metrics.rule_failures.labels("redis").inc()
                log.error("rules skipped a run, Redis refused: %s", exc)
            except Exception:
                self.metrics.rule_failures.labels("error").inc()
                log.exception("rules skipped a run")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.cfg.rules_interval_s)


class RunsRules:
    """The rules of every run other than the default one, which keeps its own RuleRunner (as
    before runs existed). Each tick lists the runs and ticks a RuleRunner for each one that is
    training or paused, made on first use; a run not started yet has nothing to judge, a done
    one nothing left to steer (its runner is forgotten). One run's failure is logged, counted
    and skipped: it never holds back another's rules."""

    def __init__(
        self,
        cfg: ControlSettings,
        clients: RunClients,
        windows: RunWindows,
        metrics: ControlMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg, self.clients, self.windows, self.metrics = cfg, clients, windows, metrics
        self.clock = clock
        self._runners: dict[str, RuleRunner] = {}

    async def tick(self) -> dict[str, list[Action]]:
        """Tick every active run's rules once; the actions taken, by run."""
        runs = await list_runs(self.clients.shared, self.clients.default)
        taken: dict[str, list[Action]] = {}
        for run in runs:
            if run == self.clients.default:
                continue
            redis, keys = self.clients.for_run(run), Keys(run)
            try:
                if await run_status(redis, keys) in (RunStatus.CREATED, RunStatus.DONE):
                    self._runners.pop(run, None)
                    continue
                runner = self._runners.get(run)
                if runner is None:
                    window = self.windows.of(run, redis)
                    runner = RuleRunner(self.cfg, redis, keys, self.clock, window, self.metrics)
                    self._runners[run] = runner
                taken[run] = await runner.tick()
            except (*TRANSIENT, RedisError) as exc:
                self.metrics.rule_failures.labels("redis").inc()
                log.warning("rules of run %s skipped: %r", run, exc)
        for gone in set(self._runners) - set(runs):
            del self._runners[gone]
        return taken

    async def run(self, stopping: asyncio.Event) -> None:
        """Tick every `rules_interval_s` until `stopping`, as RuleRunner.run does."""
        while not stopping.is_set():
            try:
                await self.tick()
            except TRANSIENT as exc:
                self.metrics.rule_failures.labels("connection").inc()
                log.warning("runs' rules skipped, Redis unreachable: %s", exc)
            except RedisError as exc:
                self.metrics.rule_failures.labels("redis").inc()
                log.error("runs' rules skipped, Redis refused: %s", exc)
            except Exception:
                self.metrics.rule_failures.labels("error").inc()
                log.exception("runs' rules skipped")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self.cfg.rules_interval_s)
