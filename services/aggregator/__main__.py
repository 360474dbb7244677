"""Entry point: `python -m fedasync.services.aggregator`.

Exits 3 when fenced off by a newer aggregator, 4 when it refused to decide from a state that does
not match its ledger or consumer group (Redis lost writes; docs/operations.md) or data an
earlier release wrote that `fedasync migrate` must convert first.
"""

from __future__ import annotations

import sys

from fedasync.services.aggregator.commit import Fenced
from fedasync.services.aggregator.inspection import StateMismatch
from fedasync.services.aggregator.service import run
from fedasync.services.runtime.entry import run_service
from fedasync.services.stores.policy_store import OldPolicyLog


def main() -> int:
    return run_service(
        "aggregator",
        run,
        fatal=(Fenced,),
        refused=(StateMismatch, OldPolicyLog),
        builds_task=True,
        listens_on="aggregator",
    )


if __name__ == "__main__":
    sys.exit(main())
