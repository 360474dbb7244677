"""The snapshot service's OpenAPI document (served at /openapi.json, and the table of the query
keys each route takes: runtime/http_query.py); a test keeps it true to the routes that exist."""

from __future__ import annotations

from typing import Any

from fedasync.services.runtime.openapi_parts import ERROR, json_response, operational_paths
from fedasync.shared.runs import BAD_RUN_ID, UNKNOWN_RUN
from fedasync.shared.snapshot_protocol import (
    LATEST_META_PATH,
    LATEST_PATH,
    MODEL_CONTENT_TYPE,
    MODEL_PATH,
    SAFETENSORS_CONTENT_TYPE,
)

#: a version's metadata (the route's pattern, as MODEL_PATH)
MODEL_META_PATH = MODEL_PATH + "/meta"
#: where a named run's twins of the legacy routes live (as the OpenAPI document names them)
RUN_BASE = "/v1/runs/{run}"
#: the same as a route pattern: any one segment, braces included, so that a segment which is no
#: run id reaches the runs middleware (400 bad_run_id) instead of matching no route (404)
_RUN_PATTERN = "/v1/runs/{run:[^/]+}"


def run_route(legacy: str, *, pattern: bool = False) -> str:
    """A named run's twin of a legacy `/v1/...` route (the path form of shared/runs.run_path:
    the same path, the run a route variable); `pattern`: as the router takes it."""
    return (_RUN_PATTERN if pattern else RUN_BASE) + legacy.removeprefix("/v1")


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


_RUN = {
    "name": "run",
    "in": "path",
    "required": True,
    "description": "a run id: 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter or digit",
    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"},
}


def _for_a_run(operations: dict[str, Any]) -> dict[str, Any]:
    """A legacy route's operations as its run twin has them: the run a path parameter, and the
    answers for a run id that is no id (400) or names no run (404)."""
    twin: dict[str, Any] = {}
    for method, operation in operations.items():
        responses = dict(operation["responses"])
        responses["400"] = json_response(
            ERROR, f"not a version, a bad query string, or not a run id ({BAD_RUN_ID})"
        )
        missing = responses.get("404", {}).get("description")
        responses["404"] = json_response(
            ERROR, ("version not kept, or " if missing else "") + f"no such run ({UNKNOWN_RUN})"
        )
        responses["503"] = json_response(
            ERROR, "no model committed yet, Redis unavailable, or too many runs held"
        )
        twin[method] = {
            **operation,
            "summary": operation["summary"] + " (of a run)",
            "parameters": [_RUN, *operation["parameters"]],
            "responses": responses,
        }
    return twin


def spec() -> dict[str, Any]:
    legacy = _legacy_paths()
    twins = {run_route(path): _for_a_run(operations) for path, operations in legacy.items()}
    return {
        "openapi": "3.1.0",
        "info": {"title": "fedasync snapshot service", "version": "1"},
        "paths": {
            **legacy,
            **twins,
            **operational_paths("requests by route and status, bytes sent, long-poll waiters"),
        },
    }


def _legacy_paths() -> dict[str, Any]:
    """The default run's routes, as before runs existed."""
    unavailable = json_response(ERROR, "no model committed yet, or Redis unavailable")
    bad_version = json_response(ERROR, "not a version as a URL spells it, or a bad query string")
    return {
        LATEST_PATH: {
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
        MODEL_PATH: {
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
        LATEST_META_PATH: {
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
        MODEL_META_PATH: {
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
    }
