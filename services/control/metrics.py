"""Prometheus metrics of the control service: what the rules did, and the policy in force."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from fedasync.services.stores.memory import Memory

#: why a run of the automatic rules was skipped
RULE_FAILURE_REASONS = ("connection", "redis", "error")


class ControlMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.rule_actions = Counter(
            "fedasync_control_rule_actions",
            "Actions taken by the automatic rules, by rule and kind",
            ["rule", "action"],
            registry=r,
        )
        self.policy_changes = Counter(
            "fedasync_control_policy_changes",
            "Policy versions written through this service, by source",
            ["source"],
            registry=r,
        )
        self.rule_failures = Counter(
            "fedasync_control_rule_failures",
            "Rule runs that failed and were skipped, by reason: connection (Redis unreachable), "
            "redis (an error reply, e.g. NOPERM or OOM), error (a bug)",
            ["reason"],
            registry=r,
        )
        for reason in RULE_FAILURE_REASONS:  # every series from 0
            self.rule_failures.labels(reason)
        self.redis_unavailable = Counter(
            "fedasync_control_redis_unavailable",
            "Requests answered 503 because Redis failed or refused while serving them, by kind: "
            "connection (unreachable, timed out), redis (an error reply)",
            ["kind"],
            registry=r,
        )
        for kind in ("connection", "redis"):
            self.redis_unavailable.labels(kind)
        self.policy_version = Gauge(
            "fedasync_control_policy_version", "Version of the policy in force", registry=r
        )
        self.redis_used_memory = Gauge(
            "fedasync_redis_used_memory_bytes", "Memory Redis uses (INFO used_memory)", registry=r
        )
        self.redis_maxmemory = Gauge(
            "fedasync_redis_maxmemory_bytes", "Redis's maxmemory; 0 = no limit", registry=r
        )
        self.redis_memory_share = Gauge(
            "fedasync_redis_memory_share",
            "Used memory ÷ maxmemory (0 without a limit); the memory rule's figure: above "
            "FEDASYNC_CONTROL__MEMORY_HIGH it turns pause-ingest on and alerts",
            registry=r,
        )

    def observe_memory(self, memory: Memory) -> None:
        self.redis_used_memory.set(memory.used)
        self.redis_maxmemory.set(memory.limit)
        self.redis_memory_share.set(memory.share)
