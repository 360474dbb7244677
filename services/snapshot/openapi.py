"""The snapshot service's OpenAPI document (served at /openapi.json, and the table of the query
keys each route takes: runtime/http_query.py); a test keeps it true to the routes that exist."""

from __future__ import annotations

from typing import Any

from fedasync.services.runtime.openapi_parts import ERROR, json_response, operational_paths
from fedasync.shared.snapshot_protocol import MODEL_CONTENT_TYPE, SAFETENSORS_CONTENT_TYPE

#: a version as a URL spells it (app.py, parse_version), to 18 digits: the service also takes
#: 19 up to 2^63-1, which no pattern says briefly
VERSION_PATTERN = "0|[1-9][0-9]{0,17}"

_FORMAT = {
    "name": "format",
    "in": "query",
    "description": "safetensors: the same weights as a safetensors file (other bytes, own ETag)",
    "schema": {"type": "string", "enum": ["safetensors"]},
}
_MODEL = {
    "description": "the model message (or, with ?format=safetensors, the safetensors file)",
    "content": {MODEL_CONTENT_TYPE: {}, SAFETENSORS_CONTENT_TYPE: {}},
}
_META = {
    "type": "object",
    "properties": {
        "version": {"type": "integer"},
        "layout": {"type": "array"},
        "parameters": {"type": "integer"},
        "created_at": {"type": "number"},
        "sha256": {"type": "string"},
        "size": {"type": "integer"},
        "etag": {"type": "string"},
        "training_done": {"type": ["object", "null"]},
    },
    "required": ["version", "layout", "sha256", "size", "etag", "training_done"],
}


_VERSION = {
    "name": "version",
    "in": "path",
    "required": True,
    "description": "decimal digits, no sign or leading zero (up to 2^63-1)",
    "schema": {"type": "string", "pattern": f"^({VERSION_PATTERN})$"},
}
_LONG_POLL = [
    {
        "name": "newer_than",
        "in": "query",
        "description": "wait for a version above this one (-1: any)",
        "schema": {"type": "string", "pattern": f"^(-1|{VERSION_PATTERN})$"},
    },
    {
        "name": "wait",
        "in": "query",
        "description": "with newer_than: seconds to wait at most (capped by "
        "FEDASYNC_SNAPSHOT__LONG_POLL_MAX_S; below 0 is 0); finite",
        "schema": {"type": "number"},
    },
]
_TIMED_OUT = {"description": "the long-poll timed out: no newer version"}


def spec() -> dict[str, Any]:
    unavailable = json_response(ERROR, "no model committed yet, or Redis unavailable")
    bad_version = json_response(ERROR, "not a version as a URL spells it, or a bad query string")
    return {
        "openapi": "3.1.0",
        "info": {"title": "fedasync snapshot service", "version": "1"},
        "paths": {
            "/v1/models/latest": {
                "get": {
                    "summary": "The newest committed model; a long-poll with newer_than",
                    "parameters": [*_LONG_POLL, _FORMAT],
                    "responses": {
                        "200": _MODEL,
                        "204": _TIMED_OUT,
                        "304": {"description": "If-None-Match holds the current ETag"},
                        "400": bad_version,
                        "503": unavailable,
                    },
                }
            },
            "/v1/models/{version}": {
                "get": {
                    "summary": "A committed version: immutable, cacheable for ever",
                    "parameters": [_VERSION, _FORMAT],
                    "responses": {
                        "200": _MODEL,
                        "304": {"description": "If-None-Match holds this version's ETag"},
                        "400": bad_version,
                        "404": json_response(ERROR, "version not kept"),
                        "503": unavailable,
                    },
                }
            },
            "/v1/models/latest/meta": {
                "get": {
                    "summary": "The newest version's metadata; a long-poll with newer_than",
                    "parameters": _LONG_POLL,
                    "responses": {
                        "200": json_response(_META, "the metadata"),
                        "204": _TIMED_OUT,
                        "400": bad_version,
                        "503": unavailable,
                    },
                }
            },
            "/v1/models/{version}/meta": {
                "get": {
                    "summary": "A version's metadata (layout, sha256, size, ETag) without weights",
                    "parameters": [_VERSION],
                    "responses": {
                        "200": json_response(_META, "the metadata"),
                        "400": bad_version,
                        "404": json_response(ERROR, "version not kept"),
                        "503": unavailable,
                    },
                }
            },
            **operational_paths("requests by route and status, bytes sent, long-poll waiters"),
        },
    }
