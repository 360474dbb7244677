"""The control service's OpenAPI document; a test keeps it true to the routes that exist."""

from __future__ import annotations

import copy
from typing import Any

from fedasync.learning.tasks import TASKS
from fedasync.services.runtime.openapi_parts import json_response as _json
from fedasync.services.runtime.openapi_parts import operational_paths
from fedasync.shared.policy import CHANGEABLE, SCHEMA, START
from fedasync.shared.runs import RUN_ID, RunStatus
from fedasync.shared.switches import SWITCHES

#: where every run's twin of a legacy `/v1/...` route lives
RUN_PREFIX = "/v1/runs/{run}"


def twin(path: str) -> str:
    """The route pattern of a legacy `/v1/...` route's twin for any run: `/v1/runs/{run}/...`."""
    return RUN_PREFIX + path.removeprefix("/v1")


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


#: the `{run}` path parameter of every run route: the run id grammar (shared/runs.py)
_RUN_PARAMETER = {
    "name": "run",
    "in": "path",
    "required": True,
    "description": "a run id: 1 to 63 of a-z, 0-9, '_' and '-', starting with a letter or digit",
    "schema": {"type": "string", "pattern": f"^{RUN_ID.pattern}$"},
}

#: what a run route answers for a run it cannot serve
_RUN_ERRORS = {
    "400": _json(_ERROR, "bad_run_id: not a run id (or a bad body or query string)"),
    "404": _json(_ERROR, "unknown_run: no run of that id"),
}

#: a run route's 409 for a run created and not started (control/app.py redis_answers)
_NOT_STARTED = "not_started: the run's aggregator has not started (no policy yet)"

_IDENTIFIER = "[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = f"{_IDENTIFIER}(\\.{_IDENTIFIER})*"

#: a run's task as POST /v1/runs takes it (shared/runs.py TaskSpec, checked as FEDASYNC_TASK__*)
_TASK = {
    "type": "object",
    "properties": {
        "name": {
            "anyOf": [
                {"type": "string", "enum": sorted(TASKS)},
                {"type": "string", "pattern": f"^{_DOTTED}:{_DOTTED}$"},
            ],
            "description": "a built-in task, or an import path package.module:attribute",
        },
        "params": {"type": "object"},
        "seed": {"type": "integer", "minimum": 0},
        "num_devices": {"type": "integer", "minimum": 1},
        "partition": {
            "type": "string",
            "enum": ["iid", "dirichlet", "shards", "rare_class_on_slow"],
        },
    },
    "additionalProperties": False,
}

#: one run as GET /v1/runs lists it (app.py `run_view`)
_RUN_SUMMARY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "status": {"type": "string", "enum": [s.value for s in RunStatus]},
        "version": {"type": ["integer", "null"]},
        "training_done": {"type": ["object", "null"]},
    },
    "required": ["id", "status", "version", "training_done"],
}


def _run_spec(policy: dict[str, Any]) -> dict[str, Any]:
    """The body of POST /v1/runs: a RunSpec without created_at/created_by (the service's)."""
    start = {k: v for k, v in policy["properties"].items() if k in START}
    return {
        "type": "object",
        "properties": {
            "id": _RUN_PARAMETER["schema"],
            "task": _TASK,
            "policy": {"type": "object", "properties": start, "additionalProperties": False},
            "budget": {
                "type": "object",
                "properties": {
                    "max_updates": {"type": "integer", "minimum": 1},
                    "max_seconds": {"type": "number", "exclusiveMinimum": 0},
                },
                "additionalProperties": False,
            },
        },
        "required": ["id"],
        "additionalProperties": False,
    }


def _twins(paths: dict[str, Any]) -> dict[str, Any]:
    """Each legacy `/v1/...` operation again under `/v1/runs/{run}/...`, for any run: the same
    operation with the `run` parameter, and the answers for a run that cannot be served."""
    out: dict[str, Any] = {}
    for path, operations in paths.items():
        if not path.startswith("/v1/"):
            continue
        twinned: dict[str, Any] = {}
        for method, operation in operations.items():
            again = copy.deepcopy(operation)
            again["summary"] = f"{operation['summary']} (of the run named)"
            again["parameters"] = [_RUN_PARAMETER, *operation.get("parameters", [])]
            responses = again["responses"] = {**again["responses"], **_RUN_ERRORS}
            said = responses.get("409", {}).get("description")
            responses["409"] = _json(_ERROR, f"{said}; or {_NOT_STARTED}" if said else _NOT_STARTED)
            twinned[method] = again
        out[twin(path)] = twinned
    return out


def _runs_paths(policy: dict[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    """POST/GET /v1/runs and a run's own routes (show, pause, stop)."""
    body_errors = {
        "400": _json(_ERROR, "bad_run_id, bad_spec, or not JSON of the expected shape"),
        "415": _json(_ERROR, "a Content-Encoding: bodies are taken as sent, never inflated"),
    }
    run_view = {
        "type": "object",
        "properties": {
            **_RUN_SUMMARY["properties"],
            "spec": {
                "type": ["object", "null"],
                "description": "as created (null for a run not created through the API)",
            },
        },
        "required": [*_RUN_SUMMARY["required"], "spec"],
    }
    changed = _json({"type": "object", "properties": {"policy": policy}}, "the new policy")

    def action(summary: str, fields: dict[str, Any], required: list[str]) -> dict[str, Any]:
        return {
            "post": {
                "summary": summary,
                "security": _TOKEN,
                "parameters": [_RUN_PARAMETER],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": fields,
                                "required": required,
                            }
                        }
                    },
                },
                "responses": {
                    "200": changed,
                    **body_errors,
                    **_RUN_ERRORS,
                    "409": _json(
                        _ERROR,
                        f"already so, training ended, or the policy changed; or {_NOT_STARTED}",
                    ),
                    **errors,
                },
            }
        }

    return {
        "/v1/runs": {
            "get": {
                "summary": "Every run: the default run first, then the created ones, by id",
                "security": _TOKEN,
                "responses": {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"runs": {"type": "array", "items": _RUN_SUMMARY}},
                            "required": ["runs"],
                        },
                        "the runs and where each stands",
                    ),
                    **errors,
                },
            },
            "post": {
                "summary": "Create a run (its aggregator is started by the supervisor or up)",
                "security": _TOKEN,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _run_spec(policy)}},
                },
                "responses": {
                    "201": {
                        **_json(run_view, "the run as created"),
                        "headers": {
                            "Location": {
                                "description": "/v1/runs/<id>",
                                "schema": {"type": "string"},
                            }
                        },
                    },
                    **body_errors,
                    "409": _json(
                        _ERROR,
                        "run_exists: a run of that id exists; conflict: a start policy whose "
                        "fields cannot go together (field, allowed)",
                    ),
                    **errors,
                },
            },
        },
        RUN_PREFIX: {
            "get": {
                "summary": "One run: its spec, status, version and why it is done",
                "security": _TOKEN,
                "parameters": [_RUN_PARAMETER],
                "responses": {"200": _json(run_view, "the run"), **_RUN_ERRORS, **errors},
            }
        },
        f"{RUN_PREFIX}/pause": action(
            "Pause (on) or resume (off) the run's aggregation: a new policy version",
            {"on": {"type": "boolean"}, "why": {"type": "string"}},
            ["on"],
        ),
        f"{RUN_PREFIX}/stop": action(
            "Stop the run for good: policy.stopped, one-way; its aggregator closes it (stopped)",
            {"reason": {"type": "string"}},
            [],
        ),
    }


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
    document: dict[str, Any] = {
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
                    "parameters": [
                        {
                            "name": "run",
                            "in": "query",
                            "description": "the run it shows (default: the default run); read "
                            "by the page itself, which lists the runs",
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {"description": "text/html"},
                        "400": _json(_ERROR, "a query key other than run, or one given twice"),
                    },
                }
            },
            **operational_paths("rule actions, policy changes, policy version"),
        },
    }
    document["paths"] |= _twins(document["paths"]) | _runs_paths(policy, errors)
    return document
