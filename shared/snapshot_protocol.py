"""The snapshot service's wire contract: the paths a device polls and the headers it reads.

Shared by the service (services/snapshot/app.py and its fast path) and the device client
(fedasync.client), so both sides spell them the same way (docs/http-api.md); here, in the core, so
the client needs nothing of the service to speak it.
"""

from __future__ import annotations

from fedasync.shared.runs import run_path

#: the newest model (conditional GET, long-poll with `newer_than` and `wait`)
LATEST_PATH = "/v1/models/latest"
#: the newest model's metadata
LATEST_META_PATH = LATEST_PATH + "/meta"
#: one committed version (and `/meta` after it)
MODEL_PATH = "/v1/models/{version}"


def latest_path(run: str | None = None) -> str:
    """The newest model of `run`: LATEST_PATH for run None (the default run's legacy route),
    `/v1/runs/<run>/models/latest` otherwise."""
    return run_path(run, LATEST_PATH)


def latest_meta_path(run: str | None = None) -> str:
    """The newest model's metadata of `run` (LATEST_META_PATH for run None)."""
    return run_path(run, LATEST_META_PATH)


def model_path(version: int, run: str | None = None) -> str:
    """One committed version of `run`'s model (the legacy route for run None)."""
    return run_path(run, MODEL_PATH.format(version=version))


#: the version of the model an answer carries
VERSION_HEADER = "X-Fedasync-Version"
#: set on every answer once training ended: why (`max_updates`, `max_seconds`, ...)
DONE_HEADER = "X-Fedasync-Training-Done"
#: a model in fedasync's own format (msgpack: docs/wire-format.md)
MODEL_CONTENT_TYPE = "application/vnd.fedasync.model+msgpack"
#: a model as safetensors (`?format=safetensors`)
SAFETENSORS_CONTENT_TYPE = "application/vnd.safetensors"
