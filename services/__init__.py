"""fedasync's services, in layers whose imports point down only (docs/architecture.md): `runtime/`
(plumbing every service shares), `stores/` (what lives in Redis), one folder per service
(`aggregator`, `control`, `evaluator`, `ingest`, `snapshot`, `worker`), and `commands/` (the
`fedasync` command, `up`, `chaos`, the Redis launchers) on top. tests/unit/test_architecture.py
holds the layers.

A package (not a namespace) so that this check runs before any service module is imported under a
name other than `fedasync.services`.
"""

if __name__ != "fedasync.services":  # one import path per module (fedasync/_import_guard.py)
    from fedasync._import_guard import refuse

    refuse(__name__, "services")
