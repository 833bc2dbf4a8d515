"""The HTTP API described as OpenAPI 3.1 (``GET /api/v1/openapi.json``), made from the
endpoint table (``worker.api.v1.ENDPOINTS``) and the request bodies' JSON Schemas (pydantic),
so it cannot drift from what is served."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

from worker.api import schema_rules as rules
from worker.api.responses import RESPONSE_SCHEMAS, response_ref
from worker.api.v1 import APPROVAL_STATUSES, ENDPOINTS, MISSION_STATUSES, Endpoint
from worker.version import package_version

__all__ = ["openapi_document"]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["status", "message"],
            "properties": {"status": {"type": "integer"}, "message": {"type": "string"}},
        }
    },
}

_ERRORS = {
    "400": "malformed: not JSON, an unknown field, a value of the wrong type or refused",
    "401": "no admin token, or not a live one",
    "403": "a read-only token asking to change something",
    "404": "no such agent, mission, iteration, request or token",
    "409": "it clashes with what exists (a taken name, a decided request, a paused mission)",
    "413": "the body is larger than MANA_AI_API_MAX_BODY_BYTES",
    "503": "the database does not answer; try again",
}

_REPLAY_ERROR = "the iteration cannot be replayed (its stored log and archive do not fit)"


def _name() -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    rules.name(schema)
    return schema


_PARAMETERS: dict[str, dict[str, Any]] = {
    "id": rules.ROW_ID,
    "before": rules.ROW_ID,
    "mission": rules.ROW_ID,
    "limit": rules.LIMIT,
    "since": {"type": "string", "pattern": rules.DURATION},
}
"""Parameters' schemas (``worker.admin.values``' rules): ids and limits are whole numbers in
ASCII digits."""


def _schema(endpoint: Endpoint, name: str) -> dict[str, Any]:
    """A parameter's JSON Schema: its rule, the statuses of what the endpoint lists, a name."""
    if name == "status":
        statuses = APPROVAL_STATUSES if "/approvals" in endpoint.path else MISSION_STATUSES
        return {"type": "string", "enum": list(statuses)}
    if name in ("agent", "name"):
        return _name()
    return _PARAMETERS.get(name, {"type": "string"})


@cache
def openapi_document() -> dict[str, Any]:
    """The document (built once)."""
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {"Error": _ERROR, **RESPONSE_SCHEMAS}
    for endpoint in ENDPOINTS:
        operation = _operation(endpoint)
        if endpoint.body is not None:
            name = endpoint.body.__name__
            schema = endpoint.body.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[name] = schema
            operation["requestBody"] = {
                "required": bool(schema.get("required") or schema.get("minProperties")),
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}
                },
            }
        paths.setdefault(f"/api/v1{endpoint.path}", {})[endpoint.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "mana-ai",
            "version": package_version(),
            "description": "Agents, missions, iterations (replay, rerun), the policy report, "
            "approvals and MCP tokens of a mana-ai database. Every endpoint needs "
            "'Authorization: Bearer <admin token>' (`mana-ai admin token create NAME`); one that "
            "changes something needs a token that is not read-only.",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    """One endpoint's operation object, without its request body."""
    operation: dict[str, Any] = {
        "summary": endpoint.summary,
        "tags": [endpoint.tag],
        "operationId": f"{endpoint.method.lower()}_{endpoint.handler.__name__}"
        if endpoint.handler.__name__ != "handler"
        else f"{endpoint.method.lower()}_{_slug(endpoint.path)}",
        "security": [{"bearer": []}],
        "responses": _responses(endpoint),
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": _schema(endpoint, name)}
        for name in re.findall(r"\{(\w+)\}", endpoint.path)
    ]
    parameters += [
        {"name": name, "in": "query", "required": False, "description": about,
         "schema": _schema(endpoint, name)}
        for name, about in endpoint.query
    ]  # fmt: skip
    if parameters:
        operation["parameters"] = parameters
    return operation


def _responses(endpoint: Endpoint) -> dict[str, Any]:
    """The result and the errors an endpoint can answer with (403 only for writes, 422 for
    an iteration's replay and rerun)."""
    errors = {
        **_ERRORS,
        **({"422": _REPLAY_ERROR} if "/iterations/{id}/" in endpoint.path else {}),
    }
    return {
        str(endpoint.status): {
            "description": "the result",
            "content": {"application/json": {"schema": response_ref(endpoint.response)}},
        },
        **{
            code: {
                "description": why,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
            for code, why in errors.items()
            if code != "403" or endpoint.write
        },
    }


def _slug(path: str) -> str:
    """``path`` as an identifier: ``/agents/{id}`` -> ``agents_id``."""
    return re.sub(r"[^a-z0-9]+", "_", path.lower()).strip("_")
