"""Prometheus metrics of the control service: what the rules did, and the policy in force."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


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
        self.policy_version = Gauge(
            "fedasync_control_policy_version", "Version of the policy in force", registry=r
        )
