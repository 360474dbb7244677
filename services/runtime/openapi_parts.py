"""The parts every service's OpenAPI document shares: the JSON response shape and the
operational routes (metrics, liveness, readiness, the document itself), which all services serve
the same way (services/runtime/http_service.py), and the whole document of a service that serves
nothing else (the evaluator, the aggregator's metrics port). Each service serves its document at
/openapi.json, and takes no query key it does not name (services/runtime/http_query.py)."""

from __future__ import annotations

from typing import Any

#: every error answer of every service: a message, and (but for some handlers' own) a reason code
ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "reason": {"type": "string"}},
    "required": ["error"],
}


def json_response(schema: dict[str, Any], description: str) -> dict[str, Any]:
    """An OpenAPI response whose body is JSON of `schema`."""
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def operational_paths(metrics_summary: str) -> dict[str, Any]:
    """/metrics, /livez, /readyz and /openapi.json; `metrics_summary` says what the metrics are."""
    obj = {"type": "object"}
    return {
        "/metrics": {
            "get": {
                "summary": f"Prometheus metrics: {metrics_summary}",
                "responses": {"200": {"description": "text/plain; version=0.0.4"}},
            }
        },
        "/livez": {
            "get": {
                "summary": "Liveness: the process answers",
                "responses": {"200": json_response(obj, "alive")},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness: Redis answers",
                "responses": {
                    "200": json_response(obj, "ready"),
                    "503": json_response(obj, "Redis unreachable"),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": json_response(obj, "OpenAPI 3.1")},
            }
        },
    }


def operational_document(service: str, metrics_summary: str) -> dict[str, Any]:
    """The document of a service whose HTTP side is only the operational routes."""
    return {
        "openapi": "3.1.0",
        "info": {"title": f"fedasync {service}", "version": "1"},
        "paths": operational_paths(metrics_summary),
    }
