"""The deterministic, event-driven simulator: the core in shared/ plus virtual time."""
