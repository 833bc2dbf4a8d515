"""Secrets the operator configures never show up anywhere mana-ai writes, whatever a peer
echoes (issue 31, item 1; LiteLLM's CVE-2025-0330 is the same kind).

A distinct secret goes into every place an operator sets one: the three LLM endpoints' API
keys, the database password, an agent's MCP server header, the approval webhook's URL and the
OTLP exporter's headers. Then every peer echoes all of them: the primary endpoint refuses the
key and quotes it (401), the fallback endpoint writes them into its replies and the tool calls'
arguments, the MCP server returns them, the compaction endpoint refuses its key and quotes it.
Real processes (`tick --once`, `serve`, the CLI), real HTTP fakes, real PostgreSQL and a real
OTLP receiver (with content capture on, so that everything that could be exported is).

Looked for, in every form a text may carry it (as is, JSON-escaped, percent-encoded): every
row of every table, the logs of each process, every span, the API's answers, the console's
pages, the CLI's output."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

import httpx
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.e2e.daemon_harness import cli, env_for, run_cli, start_serve
from tests.fakes import FakeLLMServer, chat_completion_body
from tests.fakes.mcp_http_server import FakeMcpHttpServer
from tests.fakes.otlp_receiver import OtlpReceiver
from tests.fakes.webhook_server import FakeWebhook
from worker.database_url import parse_url
from worker.db.tables import metadata


def _secret(kind: str) -> str:
    return f"{kind}-{secrets.token_hex(10)}"


class Secrets:
    """One distinct secret per place an operator configures one."""

    def __init__(self) -> None:
        self.llm_key = _secret("sk-primary")
        self.fallback_key = _secret("sk-fallback")
        self.compact_key = _secret("sk-compact")
        self.db_password = _secret("dbpw")
        self.mcp_token = _secret("mcp-token")
        self.webhook_token = _secret("hooktoken")
        self.otlp_token = _secret("otlp-token")

    def all(self) -> list[str]:
        return [
            self.llm_key,
            self.fallback_key,
            self.compact_key,
            self.db_password,
            self.mcp_token,
            self.webhook_token,
            self.otlp_token,
        ]

    def echo(self) -> str:
        """Every secret, as a peer that quotes what it was given would."""
        return "Incorrect API key provided: " + ", ".join(self.all())


def leaks(where: str, texts: Iterable[str], found: Secrets) -> list[str]:
    """Where a secret shows in ``texts``, in any form it may take."""
    out = []
    for number, text_ in enumerate(texts):
        for secret in found.all():
            for form in {secret, quote(secret, safe=""), json.dumps(secret)[1:-1]}:
                if form in text_:
                    out.append(f"{where} #{number}: {secret}")
    return out


def with_password(url: str, password: str) -> str:
    """``url`` with ``password`` (the local server trusts its clients: it is never checked)."""
    parsed = parse_url(url)
    user = parsed.username or "postgres"
    return parsed._replace(username=user, password=password).render(hide_password=False)


async def test_no_secret_is_stored_logged_exported_served_or_printed_whatever_a_peer_echoes(
    db: AsyncEngine, database_url: str
) -> None:
    found = Secrets()
    echo = found.echo()

    def refuse(_body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 401, {"error": {"message": echo, "type": "invalid_request_error"}}

    def fallback(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        tool_results = [m for m in body["messages"] if m.get("role") == "tool"]
        if not tool_results:  # round 1: a write, an MCP call, both quoting every secret
            return 200, chat_completion_body(
                content=f"Working. {echo}",
                tool_calls=[
                    ("notes_create", {"title": "keys", "body": echo}),
                    ("raw__echo", {"text": echo}),
                ],
            )
        if len(tool_results) == 2:  # round 2: a destructive call, parked for approval; its
            # context near the limit, so that round 3 is compacted first (and the
            # compaction endpoint refuses its key, quoting it)
            return 200, chat_completion_body(
                content=f"Deleting. {echo}",
                tool_calls=[("notes_delete", {"id": 1})],
                prompt_tokens=1110,
            )
        return 200, chat_completion_body(content=f"Done. {echo}")

    with (
        FakeLLMServer(refuse) as primary,
        FakeLLMServer(fallback) as secondary,
        FakeLLMServer(refuse) as compactor,
        FakeMcpHttpServer() as mcp,
        FakeWebhook() as webhook,
        OtlpReceiver() as otlp,
    ):
        env = env_for(
            with_password(database_url, found.db_password),
            primary.base_url,
            MANA_AI_LLM_API_KEY=found.llm_key,
            MANA_AI_LLM_FALLBACK_BASE_URL=secondary.base_url,
            MANA_AI_LLM_FALLBACK_API_KEY=found.fallback_key,
            MANA_AI_COMPACT_BASE_URL=compactor.base_url,
            MANA_AI_COMPACT_API_KEY=found.compact_key,
            MANA_AI_COMPACT_MAX_CTX="1200",
            MANA_AI_POLICY_MODE="enforce",
            MANA_AI_POLICY_DESTRUCTIVE="ask",
            MANA_AI_APPROVAL_WEBHOOK_URL=f"{webhook.url}/hooks/T0001/{found.webhook_token}",
            MANA_AI_OTEL="on",
            MANA_AI_OTEL_CAPTURE_CONTENT="on",
            OTEL_EXPORTER_OTLP_ENDPOINT=otlp.endpoint,
            OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{found.otlp_token}",
            MANA_AI_API_PORT="0",
            MANA_AI_LOG_LEVEL="DEBUG",
        )
        outputs: list[str] = []
        await cli(
            env,
            "agents",
            "add",
            "--name",
            "keeper",
            "--owner",
            "u1",
            "--tools",
            "notes_create,notes_delete",
            "--mcp",
            f"raw={mcp.url}",
            "--mcp-header",
            f"raw=Authorization:Bearer {found.mcp_token}",
        )
        mission = await cli(
            env, "missions", "add", "--agent", "keeper", "--objective", "Keep it.", "--due-now"
        )
        for _ in range(2):  # parks at the delete, then goes on once approved
            code, out, err = await run_cli(env, "tick", "--once")
            assert code == 0, err
            outputs += [out, err]
            if _ == 0:
                [request] = await cli(env, "approvals", "list")
                code, out, err = await run_cli(env, "approvals", "approve", str(request["id"]))
                assert code == 0, err
                outputs += [out, err]
        await webhook.received(1)
        [iteration] = await cli(env, "iterations", "list", "--mission", str(mission["id"]))
        assert iteration["status"] == "succeeded", iteration
        for command in (
            ["iterations", "show", str(iteration["id"])],
            ["iterations", "show", str(iteration["id"]), "--json"],
            ["iterations", "list"],
            ["replay", str(iteration["id"])],
            ["replay", str(iteration["id"]), "--json"],
            ["approvals", "list"],
            ["missions", "show", str(mission["id"])],
            ["agents", "list"],
        ):
            code, out, err = await run_cli(env, *command)
            assert code == 0, (command, err)
            outputs += [out, err]

        made = await cli(env, "admin", "token", "create", "ci")
        server = await start_serve(env)
        api = server.url
        base = api.removesuffix("/api/v1")
        served: list[str] = []
        try:
            headers = {"Authorization": f"Bearer {made['token']}"}
            async with httpx.AsyncClient(headers=headers, timeout=30) as http:
                for path in (
                    "/iterations",
                    f"/iterations/{iteration['id']}",
                    f"/iterations/{iteration['id']}/replay",
                    "/approvals",
                    f"/missions/{mission['id']}",
                    "/agents",
                ):
                    answer = await http.get(api + path)
                    assert answer.status_code == 200, (path, answer.text)
                    served.append(answer.text)
            async with httpx.AsyncClient(base_url=base, timeout=30) as browser:
                signed = await browser.post(
                    "/login", data={"token": made["token"], "next": "/"}, headers={"Origin": base}
                )
                assert signed.status_code == 303
                for path in (
                    "/",
                    f"/missions/{mission['id']}",
                    f"/iterations/{iteration['id']}",
                    "/approvals",
                ):
                    page = await browser.get(path)
                    assert page.status_code == 200, (path, page.text[:300])
                    served.append(page.text)
        finally:
            code, serve_log = await server.stop()
        outputs.append(serve_log)

        spans = otlp.spans()
        assert spans, "tracing exported nothing"
        exported = [
            json.dumps(
                [
                    s.name,
                    s.status_message,
                    s.attributes,
                    [(e.name, e.attributes) for e in s.events],
                ],
                default=str,
            )
            for s in spans
        ]

    # every peer was asked with its own secret, and echoed them all
    assert primary.requests and compactor.requests and mcp.calls
    async with db.connect() as conn:
        rows = []
        for table in metadata.sorted_tables:
            if table.name == "agent_mcp_servers":
                continue  # where the operator configured the header: workers must send it
            rows += (
                await conn.execute(text(f"SELECT row_to_json(t)::text FROM {table.name} t"))
            ).scalars()
    problems = (
        leaks("row", rows, found)
        + leaks("cli/log", outputs, found)
        + leaks("span", exported, found)
        + leaks("served", served, found)
    )
    assert not problems, "\n".join(problems)
    # what the peers wrote was stored, shown and exported, masked: the checks read real text
    for where in (rows, outputs, exported, served):
        assert any("Incorrect API key provided: ***" in t for t in where)
