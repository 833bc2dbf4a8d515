"""The OpenAPI document against the server (issue 31, item 12): every documented request
schema refuses what the server refuses (bodies mutated field by field: empty and blank text,
hidden characters, nulls, wrong types, values out of range, missing fields, unknown fields,
contradicting fields), accepts what the server takes, and every answer the server sends (each
endpoint's result and its errors) validates against the schema the document gives it."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.api_harness import api_client, token
from tests.integration.test_console import parked_request
from worker.api.openapi import openapi_document
from worker.api.v1 import ENDPOINTS
from worker.queries.mcp_tokens import McpStore

DOCUMENT = openapi_document()

MUTANTS: tuple[Any, ...] = (
    "",
    "   ",
    "\n\t",
    None,
    "x\x00y",
    "a\u202eb",
    "a\u200bb",
    "x" * 201,
    "x" * 20_001,
    0,
    -1,
    1,
    255,
    1001,
    2**31,
    5.5,
    5.0,  # JSON Schema's integer takes a number with no fraction; so does the server
    1000.0,
    True,
    False,
    [],
    [""],
    ["clock_now"],
    ["no_such_tool"],
    {},
    "default",
    "all",
    "enforce",
    "nope",
    "0 9 * * *",
    "not a cron",
    "60 * * * *",
    "*/0 * * * *",
    "0 9 * * fri-sun",
    "Europe/Berlin",
    "Mars/Olympus",
    "2999-01-01T09:00:00+00:00",
    "2999-01-01T09:00:00",
    "2999-01-01t09:00Z",  # RFC 3339 allows a lower-case t
    "2999-01-01T09:00:00z",  # and a lower-case z
    "6h",
    "100d",
    "once",
)
"""Values every field of every body is tried with."""


def validator(ref: dict[str, Any]) -> Draft202012Validator:
    """A validator of the document's schema ``ref`` (its ``$ref`` resolved in the document)."""
    return Draft202012Validator({**ref, "components": DOCUMENT["components"]})


def request_schema(method: str, path: str) -> Draft202012Validator:
    body = DOCUMENT["paths"][f"/api/v1{path}"][method.lower()]["requestBody"]
    return validator(body["content"]["application/json"]["schema"])


def response_schema(method: str, path: str, status: int) -> Draft202012Validator:
    responses = DOCUMENT["paths"][f"/api/v1{path}"][method.lower()]["responses"]
    assert str(status) in responses, f"{method} {path} answered {status}, not documented"
    return validator(responses[str(status)]["content"]["application/json"]["schema"])


def bodies(base: dict[str, Any], fields: list[str]) -> list[dict[str, Any]]:
    """``base``, each field of ``fields`` set to each mutant and left out, an unknown field,
    and pairs of fields set to mutants that may contradict each other."""
    found = [dict(base), {}, base | {"unknown": 1}]
    for field in fields:
        found.append({k: v for k, v in base.items() if k != field})
        found += [base | {field: value} for value in MUTANTS]
    for a, b in itertools.combinations(fields, 2):
        found += [
            base | {a: x, b: y} for x, y in (("0 9 * * *", True), (None, True), ("all", "6h"))
        ]
    return found


async def check_bodies(
    client: httpx.AsyncClient,
    method: str,
    template: str,
    path: str,
    base: dict[str, Any],
    vary: Any = None,
) -> int:
    """Send every body of ``bodies(base)``; a 400 must be refused by the schema, a 2xx taken
    by it. Returns how many were sent."""
    schema = request_schema(method, template)
    fields = sorted(schema.schema.get("properties") or _properties(schema))
    sent = 0
    for n, body in enumerate(bodies(base, fields)):
        if vary is not None:
            body = vary(n, body)
        answer = await client.request(method, path, json=body)
        sent += 1
        valid = schema.is_valid(body)
        if answer.status_code == 400:
            assert not valid, f"{method} {template}: the server refused {body!r} ({answer.text}) "
        elif answer.is_success:
            assert valid, f"{method} {template}: the server took {body!r}, the schema refuses it"
        response_schema(method, template, answer.status_code).validate(answer.json())
    return sent


def _properties(schema: Draft202012Validator) -> dict[str, Any]:
    ref = schema.schema["$ref"].rsplit("/", 1)[1]
    return DOCUMENT["components"]["schemas"][ref]["properties"]  # type: ignore[no-any-return]


async def test_request_schemas_are_as_strict_as_the_server(
    db: AsyncEngine, database_url: str
) -> None:
    await parked_request(db)
    async with api_client(db, database_url, bearer=await token(db)) as client:
        agent = {"name": "base", "owner": "u1"}
        assert (await client.post("/api/v1/agents", json=agent)).status_code == 201

        def new_name(n: int, body: dict[str, Any]) -> dict[str, Any]:
            return body | {"name": f"agent-{n}"} if body.get("name") == "base" else body

        sent = await check_bodies(client, "POST", "/agents", "/api/v1/agents", agent, new_name)
        sent += await check_bodies(
            client, "PATCH", "/agents/{name}", "/api/v1/agents/base", {"max_rounds": 7}
        )
        mission = {"agent": "base", "objective": "Tell the time.", "cron": "0 9 * * *"}
        sent += await check_bodies(client, "POST", "/missions", "/api/v1/missions", mission)
        sent += await check_bodies(
            client, "POST", "/iterations/{id}/rerun", "/api/v1/iterations/1/rerun", {}
        )
        [pending] = (await client.get("/api/v1/approvals?status=pending")).json()["approvals"]
        for verb, field in (("deny", "reason"), ("approve", "note")):
            sent += await check_bodies(
                client,
                "POST",
                f"/approvals/{{id}}/{verb}",
                f"/api/v1/approvals/{pending['id']}/{verb}",
                {field: "checked"},
            )
    assert sent > 1000


async def test_every_answer_validates_against_its_documented_schema(
    db: AsyncEngine, database_url: str
) -> None:
    await parked_request(db)
    await McpStore(db).create_token("u1", label="laptop")
    async with api_client(db, database_url, bearer=await token(db)) as client:
        await client.post("/api/v1/agents", json={"name": "b", "owner": "u1"})
        made = await client.post(
            "/api/v1/missions",
            json={"agent": "b", "objective": "o", "cron": "0 9 * * *", "timezone": "Asia/Tokyo"},
        )
        assert made.status_code == 201
        answered = 0
        for endpoint in ENDPOINTS:
            path = endpoint.path.replace("{id}", "1").replace("{name}", "b")
            body: dict[str, Any] | None = {} if endpoint.method in ("POST", "PATCH") else None
            if endpoint.path == "/agents":
                body = {"name": "c", "owner": "u1"} if endpoint.method == "POST" else None
            elif endpoint.path == "/agents/{name}":
                body = {"max_rounds": 3}
            elif endpoint.path == "/missions" and endpoint.method == "POST":
                body = {"agent": "b", "objective": "o", "due_now": True}
            for suffix in ("", "?limit=1"):
                answer = await client.request(endpoint.method, f"/api/v1{path}{suffix}", json=body)
                response_schema(endpoint.method, endpoint.path, answer.status_code).validate(
                    answer.json()
                )
                answered += answer.is_success
        assert answered >= len(ENDPOINTS)
        for path in ("/api/v1/missions/999", "/api/v1/iterations/x", "/api/v1/agents/none"):
            answer = await client.get(path)
            assert 400 <= answer.status_code < 500
            validator({"$ref": "#/components/schemas/Error"}).validate(answer.json())


def test_the_issues_nine_bodies_are_refused_by_the_schemas() -> None:
    """The examples of the issue: empty strings, missing enums, approve and deny sharing one
    body, ``max_rounds: null``."""
    agent = request_schema("POST", "/agents")
    assert not agent.is_valid({"name": "", "owner": "u1"})
    assert not agent.is_valid({"name": "a", "owner": "  "})
    assert not agent.is_valid({"name": "a", "owner": "u1", "policy_mode": "strict"})
    assert not agent.is_valid({"name": "a", "owner": "u1", "destructive": "maybe"})
    assert not request_schema("PATCH", "/agents/{name}").is_valid({"max_rounds": None})
    assert not request_schema("PATCH", "/agents/{name}").is_valid({})
    assert not request_schema("POST", "/missions").is_valid({"agent": "a", "objective": "o"})
    assert not request_schema("POST", "/approvals/{id}/approve").is_valid({"reason": "r"})
    assert not request_schema("POST", "/approvals/{id}/deny").is_valid({"note": "n"})
    assert not request_schema("POST", "/iterations/{id}/rerun").is_valid({"policy_mode": "x"})
