"""The snapshot service's wire contract: the paths a device polls and the headers it reads.

Shared by the service (services/snapshot/app.py and its fast path) and the device client
(fedasync.client), so both sides spell them the same way (docs/http-api.md); here, in the core, so
the client needs nothing of the service to speak it.
"""

from __future__ import annotations

#: the newest model (conditional GET, long-poll with `newer_than` and `wait`)
LATEST_PATH = "/v1/models/latest"
#: the newest model's metadata
LATEST_META_PATH = LATEST_PATH + "/meta"
#: the version of the model an answer carries
VERSION_HEADER = "X-Fedasync-Version"
#: set on every answer once training ended: why (`max_updates`, `max_seconds`, ...)
DONE_HEADER = "X-Fedasync-Training-Done"
#: a model in fedasync's own format (msgpack: docs/wire-format.md)
MODEL_CONTENT_TYPE = "application/vnd.fedasync.model+msgpack"
#: a model as safetensors (`?format=safetensors`)
SAFETENSORS_CONTENT_TYPE = "application/vnd.safetensors"
