"""Durable mode as a writer applies it: how many replicas must hold a write before it counts.

Plain values, in the core: the services build it from their settings (RedisSettings.durability)
and a device writing straight to Redis is given one (DeviceClient's `durability`); both wait for
the replicas the same way (fedasync.client.redis_link.replicated).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Durability:
    """Durable mode as the writers apply it: WAIT for `replicas` (0: off), `timeout_ms` each."""

    replicas: int = 0
    timeout_ms: int = 1000
