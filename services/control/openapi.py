"""The control service's OpenAPI document; a test keeps it true to the routes that exist."""

from __future__ import annotations

from typing import Any

from fedasync.services.runtime.openapi_parts import json_response as _json
from fedasync.services.runtime.openapi_parts import operational_paths
from fedasync.shared.policy import CHANGEABLE, SCHEMA
from fedasync.shared.switches import SWITCHES

_ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "field": {"type": "string"},
        "allowed": {"type": "string"},
    },
    "required": ["error"],
}

#: one alert (services/stores/alerts.py, alert_record)
_ALERT = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "the alerts stream's entry id"},
        "rule": {"type": "string"},
        "message": {"type": "string"},
        "at": {"type": "number", "description": "Unix seconds"},
        "client": {"type": "string", "description": "for a per-device alert"},
    },
    "required": ["id", "rule", "message", "at"],
}


def _policy_change(policy: dict[str, Any]) -> dict[str, Any]:
    """One record of the policy log (services/stores/policy_store.py, log_entry)."""
    return {
        "type": "object",
        "properties": {
            "version": {"type": "integer", "description": "the version this change put in force"},
            "policy": policy,
            "who": {"type": "string", "description": "X-Fedasync-Operator, or rule:<name>"},
            "why": {"type": "string"},
            "at": {"type": "number", "description": "Unix seconds"},
        },
        "required": ["version", "policy", "who", "why", "at"],
    }


def _policy_schema() -> dict[str, Any]:
    """The policy's JSON schema, from the core's schema: every field, its type and range."""
    properties: dict[str, Any] = {}
    for field in SCHEMA:
        prop: dict[str, Any] = {"description": field.description}
        if field.choices:
            prop |= {"type": "string", "enum": list(field.choices)}
        elif field.kind is bool:
            prop["type"] = "boolean"
        else:
            allowed = field.allowed
            assert allowed is not None  # every number has a range (shared/policy.py)
            kind = "integer" if allowed.integer else "number"
            prop["type"] = [kind, "null"] if allowed.optional else kind
            prop["exclusiveMinimum" if allowed.low_open else "minimum"] = allowed.low
            prop["exclusiveMaximum" if allowed.high_open else "maximum"] = allowed.high
        properties[field.name] = prop
    return {"type": "object", "properties": properties}


def spec() -> dict[str, Any]:
    policy = _policy_schema()
    changes = {k: v for k, v in policy["properties"].items() if k in CHANGEABLE}
    errors = {
        "401": _json(_ERROR, "no bearer token (writes; reads unless reads are open)"),
        "403": _json(_ERROR, "wrong token, or no token configured"),
        "503": _json(_ERROR, "no policy yet: the aggregator has not started"),
    }
    body_errors = {
        "400": _json(_ERROR, "not JSON of the expected shape (or nested too deep)"),
        "415": _json(_ERROR, "a Content-Encoding: bodies are taken as sent, never inflated"),
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "fedasync control service", "version": "1"},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "paths": {
            "/v1/policy": {
                "get": {
                    "summary": "The policy in force and the allowed range of each parameter",
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {"policy": policy, "ranges": {"type": "object"}},
                            },
                            "the policy",
                        ),
                        **errors,
                    },
                },
                "patch": {
                    "summary": "Change the policy; its version rises by one",
                    "security": [{"bearer": []}],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "changes": {"type": "object", "properties": changes},
                                        "why": {"type": "string"},
                                    },
                                    "required": ["changes"],
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json(
                            {"type": "object", "properties": {"policy": policy}}, "the new policy"
                        ),
                        **body_errors,
                        "409": _json(
                            _ERROR,
                            "the policy changed meanwhile (read and retry), or a budget already "
                            "used up, or a budget change after training ended",
                        ),
                        "422": _json(_ERROR, "a value outside its range: field and allowed"),
                        **errors,
                    },
                },
            },
            "/v1/policy/history": {
                "get": {
                    "summary": "Every policy change (who, when, why, the policy), newest first",
                    "parameters": [
                        {
                            "name": "count",
                            "in": "query",
                            "description": "at most this many, the newest (default 100; "
                            "taken into [1, 10000])",
                            "schema": {"type": "integer"},
                        }
                    ],
                    "responses": {
                        "200": _json(
                            {"type": "array", "items": _policy_change(policy)}, "policy changes"
                        ),
                        "400": _json(_ERROR, "count is not an int"),
                        **errors,
                    },
                }
            },
            "/v1/switches": {
                "get": {
                    "summary": "Every degrade switch, what it does, and whether it is on",
                    "responses": {"200": _json({"type": "object"}, "switches"), **errors},
                }
            },
            "/v1/switches/{name}": {
                "post": {
                    "summary": "Flip a switch; on and off are each a new policy version",
                    "security": [{"bearer": []}],
                    "parameters": [
                        {
                            "name": "name",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string", "enum": sorted(SWITCHES)},
                        }
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "on": {"type": "boolean"},
                                        "reason": {"type": "string"},
                                    },
                                    "required": ["on"],
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": _json({"type": "object"}, "the switch and the new policy"),
                        **body_errors,
                        "404": _json(_ERROR, "no such switch"),
                        "409": _json(_ERROR, "already in that state, or the policy changed"),
                        **errors,
                    },
                }
            },
            "/v1/alerts": {
                "get": {
                    "summary": "Alerts raised by the automatic rules, newest first",
                    "parameters": [{"name": "count", "in": "query", "schema": {"type": "integer"}}],
                    "responses": {
                        "200": _json({"type": "array", "items": _ALERT}, "alerts"),
                        "400": _json(_ERROR, "count is not an int"),
                        **errors,
                    },
                }
            },
            "/v1/evaluations": {
                "get": {
                    "summary": "The evaluator's scores per version, oldest first (accuracy curve)",
                    "parameters": [{"name": "count", "in": "query", "schema": {"type": "integer"}}],
                    "responses": {
                        "200": _json({"type": "array", "items": {"type": "object"}}, "records"),
                        "400": _json(_ERROR, "count is not an int in [1, 10000]"),
                        **errors,
                    },
                }
            },
            "/v1/status": {
                "get": {
                    "summary": "Versions, recent figures, backlog, latest evaluation, done",
                    "responses": {"200": _json({"type": "object"}, "status"), **errors},
                }
            },
            "/": {
                "get": {
                    "summary": "The dashboard (HTML); switches ask for the token once",
                    "responses": {"200": {"description": "text/html"}},
                }
            },
            **operational_paths("rule actions, policy changes, policy version"),
        },
    }
