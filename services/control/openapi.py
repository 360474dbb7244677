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
        "reason": {"type": "string"},
        "field": {"type": "string"},
        "allowed": {"type": "string"},
    },
    "required": ["error"],
}

#: the most records a list route returns (`?count=`); app.py refuses more, as it says here
MAX_COUNT = 10_000

#: the bearer token: every write needs it, and every read unless reads are open
_TOKEN: list[dict[str, list[str]]] = [{"bearer": []}]


def _count(default: int) -> dict[str, Any]:
    """The `count` query parameter every list route takes, with its bounds."""
    return {
        "name": "count",
        "in": "query",
        "description": f"at most this many records (default {default}); outside [1, "
        f"{MAX_COUNT}], or not decimal digits, is a 400",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_COUNT, "default": default},
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


_NUMBER_OR_NULL = {"type": ["number", "null"]}
#: `/v1/status` (app.py `status`); only `privacy` is spelled out, the rest is described in
#: docs/operations.md
_STATUS = {
    "type": "object",
    "properties": {
        "privacy": {
            "description": "differential privacy (services/control/privacy.py): ε spent after "
            "the newest decision, under each accounting model, and the policy's DP settings; "
            "null while DP is off",
            "type": ["object", "null"],
            "properties": {
                "epsilon_sampled": _NUMBER_OR_NULL,
                "epsilon_conservative": _NUMBER_OR_NULL,
                "delta": {"type": "number"},
                "budget": _NUMBER_OR_NULL,
                "model": {"type": "string", "enum": ["conservative", "sampled"]},
                "clip": {
                    **_NUMBER_OR_NULL,
                    "description": "the clip C updates are clipped to now: with adaptive "
                    "clipping (dp_quantile) the newest decision's, else dp_clip",
                },
                "clip_configured": {**_NUMBER_OR_NULL, "description": "the policy's dp_clip"},
            },
            "required": [
                "epsilon_sampled",
                "epsilon_conservative",
                "delta",
                "budget",
                "model",
                "clip",
                "clip_configured",
            ],
        }
    },
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
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "FEDASYNC_CONTROL__TOKEN; reads need it too unless "
                    "FEDASYNC_CONTROL__OPEN_READS=true",
                }
            },
        },
        "paths": {
            "/v1/policy": {
                "get": {
                    "summary": "The policy in force and the allowed range of each parameter",
                    "security": _TOKEN,
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
                    "summary": "Change the policy (at least one change); its version rises by one",
                    "security": _TOKEN,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "changes": {
                                            "type": "object",
                                            "properties": changes,
                                            "additionalProperties": False,
                                            "minProperties": 1,
                                        },
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
                            "used up, or a budget change after training ended, or a privacy "
                            "change a run cannot take back (privacy_budget raised, unset or "
                            "already spent, privacy_model changed, dp_clip unset), or a value "
                            "in conflict with the policy's other fields (a robust rule, Zeno++ "
                            "or DP in a mode or combination that cannot take it): field, and "
                            "used",
                        ),
                        "422": _json(_ERROR, "a value outside its range: field and allowed"),
                        **errors,
                    },
                },
            },
            "/v1/policy/history": {
                "get": {
                    "summary": "Every policy change (who, when, why, the policy), newest first",
                    "security": _TOKEN,
                    "parameters": [_count(100)],
                    "responses": {
                        "200": _json(
                            {"type": "array", "items": _policy_change(policy)}, "policy changes"
                        ),
                        "400": _json(_ERROR, "a count out of bounds, or a bad query string"),
                        **errors,
                    },
                }
            },
            "/v1/switches": {
                "get": {
                    "summary": "Every degrade switch, what it does, and whether it is on",
                    "security": _TOKEN,
                    "responses": {"200": _json({"type": "object"}, "switches"), **errors},
                }
            },
            "/v1/switches/{name}": {
                "post": {
                    "summary": "Flip a switch; on and off are each a new policy version",
                    "security": _TOKEN,
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
                    "security": _TOKEN,
                    "parameters": [_count(100)],
                    "responses": {
                        "200": _json({"type": "array", "items": _ALERT}, "alerts"),
                        "400": _json(_ERROR, "a count out of bounds, or a bad query string"),
                        **errors,
                    },
                }
            },
            "/v1/evaluations": {
                "get": {
                    "summary": "The evaluator's scores per version, oldest first (accuracy curve)",
                    "security": _TOKEN,
                    "parameters": [_count(500)],
                    "responses": {
                        "200": _json({"type": "array", "items": {"type": "object"}}, "records"),
                        "400": _json(_ERROR, "a count out of bounds, or a bad query string"),
                        **errors,
                    },
                }
            },
            "/v1/status": {
                "get": {
                    "summary": "Versions, recent figures, backlog, latest evaluation, done",
                    "security": _TOKEN,
                    "responses": {"200": _json(_STATUS, "status"), **errors},
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
