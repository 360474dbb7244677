"""The ingest service's OpenAPI document; a test keeps it true to the routes that exist."""

from __future__ import annotations

from typing import Any

from fedasync.services.runtime.openapi_parts import json_response as _json
from fedasync.services.runtime.openapi_parts import operational_paths
from fedasync.shared.ingest_protocol import (
    CLIENT_HEADER,
    CONTENT_TYPE,
    PATH,
    RECEIPT_PATH,
    SIGNATURE_HEADER,
    TIME_HEADER,
)

#: a run's twins of PATH and RECEIPT_PATH (the legacy ones serve the default run)
RUN_PATH = "/v1/runs/{run}" + PATH.removeprefix("/v1")
RUN_RECEIPT_PATH = RUN_PATH + "/{update_id}"

_RUN_PARAMETER = {
    "name": "run",
    "in": "path",
    "required": True,
    "description": "the run's id (400 bad_run_id outside the grammar, 404 unknown_run if no "
    "such run)",
    "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"},
}

_ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["error", "reason"],
}

_SIGNATURE_HEADERS = [
    {
        "name": CLIENT_HEADER,
        "in": "header",
        "required": True,
        "description": "the device's client id (the one its key was issued for)",
        "schema": {"type": "string", "minLength": 1, "maxLength": 128},
    },
    {
        "name": TIME_HEADER,
        "in": "header",
        "required": True,
        "description": "signing time, Unix milliseconds",
        "schema": {"type": "string", "pattern": "^[0-9]{1,15}$"},
    },
    {
        "name": SIGNATURE_HEADER,
        "in": "header",
        "required": True,
        "description": "Ed25519, 128 lowercase hex, or HMAC-SHA256, 64 lowercase hex, by the "
        "kind of the device's key (docs/http-api.md)",
        "schema": {"type": "string", "pattern": "^[0-9a-f]{64}([0-9a-f]{64})?$"},
    },
]


def _receipt_schema() -> dict[str, Any]:
    """A ledger record (docs/http-api.md#the-ledger-record) and its ledger entry id."""
    number = {"type": ["number", "null"]}
    return {
        "type": "object",
        "properties": {
            "outcome": {"type": "string", "enum": ["applied", "dropped", "rejected", "duplicate"]},
            "update_id": {"type": "string"},
            "client_id": {"type": "string"},
            "base_version": {"type": "integer"},
            "version": {"type": "integer"},
            "policy_version": {"type": "integer"},
            "tau": {"type": ["integer", "null"]},
            "alpha": number,
            "step_norm": number,
            "server_step": {"type": "boolean"},
            "reason": {"type": ["string", "null"]},
            "detail": {"type": "string"},
            "delta_norm": number,
            "clipped": {"type": "boolean"},
            "stream_id": {"type": "string"},
            "at": {"type": "number"},
            "ledger_id": {"type": "string"},
            # only with differential privacy on; the clip only when it adapts (dp_quantile)
            "epsilon_sampled": number,
            "epsilon_conservative": number,
            "adaptive_clip": {"type": "number"},
            # only when the device trains with DP-SGD (shared/device_privacy.py)
            "device_epsilon": {"type": "number"},
            "device_delta": {"type": "number"},
        },
        "required": ["outcome", "update_id", "client_id", "version", "ledger_id"],
    }


def spec() -> dict[str, Any]:
    refused = {
        "401": _json(_ERROR, "no valid signature, or an unknown or revoked device"),
        "429": _json(_ERROR, "too many requests from this device; Retry-After in seconds"),
        "503": _json(
            _ERROR,
            (
                "Redis unavailable or full; for a POST also ingest paused or its budget of"
                " unverified bytes spent (unverified_budget); Retry-After"
            ),
        ),
    }
    post: dict[str, Any] = {
        "summary": "Add a signed update to the updates stream, once per update id",
        "parameters": _SIGNATURE_HEADERS,
        "requestBody": {
            "required": True,
            "content": {CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        },
        "responses": {
            "202": _json(
                {
                    "type": "object",
                    "properties": {
                        "status": {"const": "accepted"},
                        "update_id": {"type": "string"},
                        "entry_id": {"type": "string"},
                        "retry": {"type": "boolean"},
                    },
                },
                "added (or already added: a retry gets the first entry id)",
            ),
            "403": _json(_ERROR, "client_mismatch: the message names another client"),
            "409": _json(_ERROR, "update_id_reused with another body"),
            "413": _json(_ERROR, "too_large"),
            "415": _json(_ERROR, "unsupported_media_type"),
            "422": _json(_ERROR, "not a valid update message (a wire reason)"),
            **refused,
        },
    }
    get: dict[str, Any] = {
        "summary": "The decision about one of the signing device's own updates",
        "parameters": [
            {
                "name": "update_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1, "maxLength": 128},
            },
            *_SIGNATURE_HEADERS,
        ],
        "responses": {
            "200": _json(_receipt_schema(), "the ledger record of the decision"),
            "404": _json(
                _ERROR,
                "not_decided: no decision recorded for this device's update id (not "
                "yet decided, unknown, another device's, or older than kept)",
            ),
            **refused,
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "fedasync ingest service", "version": "1"},
        "paths": {
            PATH: {"post": post},
            RECEIPT_PATH: {"get": get},
            RUN_PATH: {"post": _of_a_run(post, "unknown_run: no such run")},
            RUN_RECEIPT_PATH: {
                "get": _of_a_run(
                    get, "not_decided (as on the legacy route), or unknown_run: no such run"
                )
            },
            **operational_paths("accepted, refusals by reason, receipts"),
        },
    }


def _of_a_run(operation: dict[str, Any], not_found: str) -> dict[str, Any]:
    """A legacy route's operation on a run's twin: the run in the path, and the answers of a
    run that is not served (bad id, no such run, more runs than this process serves)."""
    responses = dict(operation["responses"])
    responses["400"] = _json(_ERROR, "bad_run_id: not a run id")
    responses["404"] = _json(_ERROR, not_found)
    responses["503"] = _json(
        _ERROR,
        responses["503"]["description"] + "; too_many_runs: FEDASYNC_INGEST__MAX_RUNS reached",
    )
    return {
        **operation,
        "summary": operation["summary"] + " (of the run named in the path)",
        "parameters": [_RUN_PARAMETER, *operation["parameters"]],
        "responses": responses,
    }
