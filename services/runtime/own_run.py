"""Which run a single-run process (an aggregator, a worker) serves, as devices name it.

A deployment's default run is the one its legacy routes serve; its devices sign under the v1
domain (shared/device_auth.update_domain). Every other run's processes are started with their
run's id as key prefix and `FEDASYNC_AUTH__DEFAULT_RUN` naming the deployment's default run, so
they know to speak for a named run: the run's own routes and its own signature domain. Unset, the
process's key prefix is the default run (every deployment before runs existed, and every test
deployment with a prefix of its own).
"""

from __future__ import annotations

from fedasync.services.runtime.settings import Settings
from fedasync.shared.device_auth import update_domain


def own_run(settings: Settings) -> str | None:
    """The run this process serves as a device client names it: None for the deployment's
    default run (the legacy routes and domain), else the run's id (its key prefix)."""
    prefix = settings.redis.key_prefix
    default = settings.auth.default_run
    return None if default is None or default == prefix else prefix


def own_domain(settings: Settings) -> bytes:
    """The domain the updates of this process's run are signed under."""
    return update_domain(own_run(settings))
