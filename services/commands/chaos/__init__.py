"""The chaos harness: the real services as processes, seeded faults, a total-queue check.

`fedasync chaos` (or `python -m fedasync.services.commands.chaos`) runs aggregator, snapshot
service and workers against a private Redis, kills and pauses them on a seeded schedule, drains the
stream and checks that every acknowledged update has exactly one terminal decision, that versions
are contiguous, that the ledger replays to the committed model and that the served model is the
committed one, and that no update waited longer for its decision than the bound allows.
Modules: schedule (what and when), system (the processes), proxy (the aggregator's way to Redis,
which can stall a command), links (replicas on other hosts, for the failover profile's
replicated Redis), faults (injecting and recovering), probe and audit (reading the outcome),
waits (XADD to decision), report (the figures, and the failover table), harness (the phases),
cli (the command); the check itself is services/stores/exactly_once.py, shared with the load
benchmark and the kill -9 test. `fedasync chaos --compose` (compose/) crashes the containers of
the Docker Compose stack instead and counts with the same check.
"""
