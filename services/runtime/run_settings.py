"""The settings of one run's processes: the deployment's settings, with the run's own on top.

A process that serves one run (its aggregator, its evaluator) gets the deployment's settings for
everything the deployment decides (Redis, wire limits, auth, HTTP limits, logging) and the run's
spec for what the run decides: its key prefix (the run id), its task, its policy and its budget.
The run's tables replace the deployment's whole sections rather than merging into them, so a run
created with `mode = "fedbuff"` gets FedBuff's preset for every field it leaves unset, never a mix
with whatever mode the supervisor's own environment named.
"""

from __future__ import annotations

from typing import Any

from fedasync.services.runtime.settings import Settings, validated
from fedasync.shared.runs import RunSpec

#: the sections a run's spec decides (each replaced whole; `redis.key_prefix` besides)
RUN_SECTIONS = ("task", "policy", "budget")


def settings_for_run(base: Settings, spec: RunSpec | None, **sections: dict[str, Any]) -> Settings:
    """`base` with `spec`'s prefix, task, policy and budget (spec None: the default run, whose
    task, policy and budget are the deployment's own); `sections` change further fields of a
    section (a child's own port: `aggregator={"port": 9100}`). SettingsError names a bad field
    of the spec by the variable that would set it (FEDASYNC_POLICY__BUFFER_SIZE)."""
    data: dict[str, Any] = {
        name: dict(getattr(base, name).model_dump()) for name in type(base).model_fields
    }
    if spec is not None:
        # the deployment's default run is the base's prefix: a named run's processes sign,
        # verify and fetch as that run (services/runtime/own_run.py)
        if spec.id != base.redis.key_prefix:
            data["auth"]["default_run"] = base.auth.default_run or base.redis.key_prefix
        data["redis"]["key_prefix"] = spec.id
        data["task"] = spec.task.to_dict()
        data["policy"] = dict(spec.policy)
        data["budget"] = dict(spec.budget)
    for name, changes in sections.items():
        data[name] = {**data[name], **changes}
    return validated(data)
