"""The JSON API under ``/api/v1``: agents, missions, iterations (with replay and rerun), the
policy report, approvals and MCP tokens, each endpoint the same operation as its command
(``worker.admin``), with the same rules and messages.

Every endpoint but ``GET /api/v1/openapi.json`` needs ``Authorization: Bearer <admin token>``;
one that changes something needs a token that is not read-only. Bodies are JSON objects
(``worker.api.bodies``); answers are JSON, errors ``{"error": {"status", "message"}}`` (see
``worker.api.app``). Lists are newest first; ``limit`` (1-10000) and ``before`` (an id: the
rows after the last one shown) page through them, and ``next`` is the ``before`` of the next
page (``null`` at the end).

``ENDPOINTS`` is the table routes and the OpenAPI document (``worker.api.openapi``) are made
from.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker import redaction
from worker.admin import agents as agent_ops
from worker.admin import missions as mission_ops
from worker.admin.deciding import decide
from worker.admin.values import aware_datetime, catch_up_window, limit, parse_since, row_id
from worker.admin.verdict import verdict, warning, with_warnings
from worker.api.auth import Forbidden, bearer_principal
from worker.api.bodies import (
    AgentBody,
    AgentChangesBody,
    ApproveBody,
    DecisionBody,
    DenyBody,
    MissionBody,
    RerunBody,
    field_label,
    parsed,
    read_body,
)
from worker.api.services import Services
from worker.errors import UsageError
from worker.names import checked_name
from worker.queries.admin_tokens import AdminPrincipal
from worker.queries.stored import jsonable
from worker.schedule import in_zone
from worker.terminal_text import visible_json

__all__ = ["ENDPOINTS", "Endpoint", "routes"]

Handler = Callable[[Request, Services, AdminPrincipal], Awaitable[Any]]


@dataclass(frozen=True)
class Endpoint:
    """One endpoint: what it does (``summary``), its body (``body``: a model, or ``None``), its
    query parameters (``query``: name -> description), whether it changes anything
    (``write``), the status of its answer (``status``), its ``tag`` and the schema of its answer
    (``response``: a name of ``worker.api.responses.RESPONSE_SCHEMAS``)."""

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    body: type[BaseModel] | None = None
    query: tuple[tuple[str, str], ...] = ()
    write: bool = False
    status: int = 200
    response: str = ""


class VisibleJSONResponse(JSONResponse):
    """JSON whose strings show every hidden character (bidi overrides, ESC, zero-width) as a
    ``\\u`` escape (``worker.terminal_text.visible_json``): it parses to the same data, and
    ``curl`` in a terminal shows the text as stored instead of reordering or restyling it."""

    def render(self, content: Any) -> bytes:
        # and never a secret of the process (``worker.redaction``), in rows stored before
        # it was configured too
        return redaction.redact(visible_json(content, separators=(",", ":"))).encode()


def _json(data: Any, status: int = 200) -> JSONResponse:
    return VisibleJSONResponse(jsonable(data), status_code=status)


def _id(request: Request, name: str = "id") -> int:
    return parsed(request.path_params[name], row_id, name)


def _page(request: Request, default: int) -> tuple[int, int | None]:
    q = request.query_params
    size = parsed(q["limit"], limit, "limit") if "limit" in q else default
    before = parsed(q["before"], row_id, "before") if "before" in q else None
    return size, before


def _paged(key: str, rows: list[dict[str, Any]], size: int) -> dict[str, Any]:
    return {key: rows, "next": rows[-1]["id"] if len(rows) == size else None}


def _choice(request: Request, name: str, choices: tuple[str, ...]) -> str | None:
    value = request.query_params.get(name)
    if value is not None and value not in choices:
        raise UsageError(f"{name}: must be one of {', '.join(choices)}; got {value!r}")
    return value


# -- agents ----------------------------------------------------------------------------------


async def list_agents(request: Request, s: Services, who: AdminPrincipal) -> Any:
    return {"agents": await s.admin.list_agents()}


async def create_agent(request: Request, s: Services, who: AdminPrincipal) -> Any:
    body = await read_body(request, AgentBody)
    agent = await agent_ops.create_agent(
        s.admin,
        agent_ops.AgentRequest(
            name=body.name,
            owner=body.owner,
            system_prompt=body.system_prompt,
            model=body.model,
            max_rounds=parsed(body.max_rounds, agent_ops.max_rounds, "max_rounds"),
            max_tokens_per_day=None
            if body.max_tokens_per_day is None
            else parsed(body.max_tokens_per_day, agent_ops.max_tokens, "max_tokens_per_day"),
            tools=body.tools,
            policy_mode=body.policy_mode,
            destructive=body.destructive,
            compact_max_ctx=None
            if body.compact_max_ctx is None
            else parsed(body.compact_max_ctx, agent_ops.context_tokens, "compact_max_ctx"),
        ),
        s.known_tools,
        field_label,
    )
    return agent


async def change_agent(request: Request, s: Services, who: AdminPrincipal) -> Any:
    body = await read_body(request, AgentChangesBody)
    values = {k: getattr(body, k) for k in body.model_fields_set}
    rules = {
        "max_rounds": agent_ops.max_rounds,
        "max_tokens_per_day": agent_ops.max_tokens,
        "compact_max_ctx": agent_ops.context_tokens,
    }
    for key, rule in rules.items():
        if values.get(key) is not None:
            values[key] = parsed(values[key], rule, key)
    if values.get("max_rounds", 0) is None:
        raise UsageError("max_rounds: must be a number of rounds (it has no default to go back to)")
    agent, _ = await agent_ops.change_agent(
        s.admin,
        checked_name(request.path_params["name"], "the agent name"),
        agent_ops.AgentChanges(values=values),
        s.known_tools,
        lambda f: "the agent name" if f == "agent" else f,
    )
    return agent


# -- missions --------------------------------------------------------------------------------

MISSION_STATUSES = ("active", "paused", "completed")


async def list_missions(request: Request, s: Services, who: AdminPrincipal) -> Any:
    size, before = _page(request, 100)
    status = _choice(request, "status", MISSION_STATUSES)
    agent = request.query_params.get("agent")
    if agent is not None:
        agent = checked_name(agent, "agent:")
    rows = await s.admin.list_missions(
        status=status, agent=agent, limit=size, before_id=before, last_run=True
    )
    waiting = await s.approvals.pending_by_mission([r["id"] for r in rows])
    for row in rows:
        row["awaiting_approval"] = waiting.get(row["id"])
        row["next_run_local"] = in_zone(row["next_run_at"], row["timezone"])
    await _with_warnings(s, rows, "last_iteration_id")
    return _paged("missions", rows, size)


async def create_mission(request: Request, s: Services, who: AdminPrincipal) -> Any:
    body = await read_body(request, MissionBody)
    mission = await mission_ops.create_mission(
        s.admin,
        mission_ops.MissionRequest(
            agent=body.agent,
            objective=body.objective,
            cron=body.cron,
            timezone=body.timezone,
            at=None if body.at is None else parsed(body.at, aware_datetime, "at"),
            due_now=body.due_now,
            deadline=None
            if body.deadline is None
            else parsed(body.deadline, aware_datetime, "deadline"),
            catch_up=body.catch_up,
            catch_up_window=None
            if body.catch_up_window is None
            else parsed(body.catch_up_window, catch_up_window, "catch_up_window"),
        ),
        field_label,
    )
    return mission


async def get_mission(request: Request, s: Services, who: AdminPrincipal) -> Any:
    mission_id = _id(request)
    mission = await s.admin.get_mission(mission_id)
    waiting = await s.approvals.pending_by_mission([mission_id])
    local = in_zone(mission["next_run_at"], mission["timezone"])
    return mission | {"awaiting_approval": waiting.get(mission_id), "next_run_local": local}


def _course(
    operation: Callable[[Any, int], Awaitable[mission_ops.Course]],
) -> Handler:
    async def handler(request: Request, s: Services, who: AdminPrincipal) -> Any:
        course = await operation(s.admin, _id(request))
        return {"mission": course.mission, "changed": course.changed, "note": course.note}

    return handler


# -- iterations ------------------------------------------------------------------------------


async def list_iterations(request: Request, s: Services, who: AdminPrincipal) -> Any:
    size, before = _page(request, 20)
    mission = request.query_params.get("mission")
    mission_id = None if mission is None else parsed(mission, row_id, "mission")
    if mission_id is not None:
        await s.admin.get_mission(mission_id)  # 404 rather than an empty list
    rows = await s.admin.list_iterations(mission_id=mission_id, limit=size, before_id=before)
    await _with_warnings(s, rows)
    return _paged("iterations", rows, size)


async def _with_warnings(s: Services, rows: list[dict[str, Any]], key: str = "id") -> None:
    """Each of ``rows`` with the verdict's warning on its iteration (``key``): ``warning``,
    or ``last_warning`` for a mission's last run (``worker.admin.verdict.with_warnings``)."""
    ids = [r[key] for r in rows if r.get(key) is not None]
    with_warnings(rows, await s.admin.answers_of(ids), key)


async def get_iteration(request: Request, s: Services, who: AdminPrincipal) -> Any:
    iteration = await s.admin.get_iteration(_id(request))
    # the verdict as the detail views show it, and its warning as the lists do
    said, warned = await run_in_threadpool(lambda: (verdict(iteration), warning(iteration)))
    return {**iteration, "verdict": said, "warning": warned}


async def replay_iteration(request: Request, s: Services, who: AdminPrincipal) -> Any:
    from worker.admin.replay import replay_document

    iteration = await s.admin.get_iteration(_id(request))
    return await run_in_threadpool(replay_document, iteration)  # CPU: off the event loop


async def rerun_iteration(request: Request, s: Services, who: AdminPrincipal) -> Any:
    from worker.admin.rerun import rerun_iteration as rerun
    from worker.daemon.app import rerun_config

    body = await read_body(request, RerunBody)
    if body.policy_mode is not None and body.policy_mode not in agent_ops.POLICY_MODE_CHOICES:
        raise UsageError(
            f"policy_mode: must be one of {', '.join(agent_ops.POLICY_MODE_CHOICES)}; got "
            f"{body.policy_mode!r}"
        )
    iteration = await s.admin.get_iteration(_id(request))
    config = await rerun_config(s.admin, s.settings, iteration, body.policy_mode)
    return (await rerun(iteration, config)).to_json()


# -- policy, approvals, MCP tokens --------------------------------------------------------------


async def policy_report(request: Request, s: Services, who: AdminPrincipal) -> Any:
    since = parsed(request.query_params.get("since", "7d"), parse_since, "since")
    return (await s.policy.report(since=since)).to_json()


APPROVAL_STATUSES = ("pending", "approved", "denied", "expired")


async def list_approvals(request: Request, s: Services, who: AdminPrincipal) -> Any:
    size, before = _page(request, 100)
    status = _choice(request, "status", APPROVAL_STATUSES)
    rows = await s.approvals.list_requests(status=status, limit=size, before_id=before)
    return _paged("approvals", rows, size)


async def get_approval(request: Request, s: Services, who: AdminPrincipal) -> Any:
    return await s.approvals.get(_id(request))


def _decision(approve: bool) -> Handler:
    async def handler(request: Request, s: Services, who: AdminPrincipal) -> Any:
        body = await read_body(request, DecisionBody)
        if approve and body.reason is not None:
            raise UsageError("reason: goes with a denial; an approval takes a note")
        if not approve and body.note is not None:
            raise UsageError("note: goes with an approval; a denial takes a reason")
        return await decide(
            s.approvals,
            _id(request),
            approve=approve,
            by=who.name,
            note=body.note if approve else body.reason,
            labels=lambda f: f if f == "by" else ("note" if approve else "reason"),
        )

    return handler


async def list_mcp_tokens(request: Request, s: Services, who: AdminPrincipal) -> Any:
    return {"tokens": await s.mcp.list_tokens()}


async def revoke_mcp_token(request: Request, s: Services, who: AdminPrincipal) -> Any:
    row, was_live = await s.mcp.revoke_token(_id(request))
    return {"token": row, "changed": was_live}


PAGING = (
    ("limit", "rows at most, 1-10000"),
    ("before", "only rows with a smaller id (the previous page's next)"),
)

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("GET", "/agents", list_agents, "List agents.", "agents", response="Agents"),
    Endpoint(
        "POST", "/agents", create_agent, "Create an agent.", "agents", AgentBody,
        response="Agent", write=True,
        status=201,
    ),
    Endpoint(
        "PATCH", "/agents/{name}", change_agent, "Change an agent.", "agents",
        AgentChangesBody, response="Agent", write=True,
    ),
    Endpoint(
        "GET", "/missions", list_missions, "List missions with their last run.", "missions",
        response="Missions",
        query=(
            ("status", "active | paused | completed"),
            ("agent", "an agent's name"),
            *PAGING,
        ),
    ),
    Endpoint(
        "POST", "/missions", create_mission, "Create a mission.", "missions", MissionBody,
        response="Mission",
        write=True, status=201,
    ),
    Endpoint("GET", "/missions/{id}", get_mission, "Show a mission.", "missions",
        response="Mission"),
    Endpoint(
        "POST", "/missions/{id}/pause", _course(mission_ops.pause_mission),
        "Pause a mission.", "missions", response="Course", write=True,
    ),
    Endpoint(
        "POST", "/missions/{id}/resume", _course(mission_ops.resume_mission),
        "Resume a paused mission.", "missions", response="Course", write=True,
    ),
    Endpoint(
        "POST", "/missions/{id}/run", _course(mission_ops.run_now),
        "Run an active mission now.", "missions", response="Course", write=True,
    ),
    Endpoint(
        "GET", "/iterations", list_iterations, "List iterations (without their logs).",
        "iterations", response="Iterations", query=(("mission", "a mission's id"), *PAGING),
    ),
    Endpoint(
        "GET", "/iterations/{id}", get_iteration,
        "Show an iteration: its log, calls, compactions and approvals.", "iterations",
        response="Iteration",
    ),
    Endpoint(
        "GET", "/iterations/{id}/replay", replay_iteration,
        "Replay an iteration: its conversation as events, folded turns restored.",
        "iterations", response="Replay",
    ),
    Endpoint(
        "POST", "/iterations/{id}/rerun", rerun_iteration,
        "Rerun an iteration with today's rules against its recording; the differences.",
        "iterations", RerunBody, response="Rerun",
    ),
    Endpoint(
        "GET", "/policy/report", policy_report, "The policy gate's decisions over a period.",
        "policy",
        response="PolicyReport", query=(("since", "a duration such as 7d, 24h, 30m (default 7d)"),),
    ),
    Endpoint(
        "GET", "/approvals", list_approvals, "List approval requests.", "approvals",
        response="Approvals",
        query=(("status", "pending | approved | denied | expired"), *PAGING),
    ),
    Endpoint("GET", "/approvals/{id}", get_approval, "Show an approval request.", "approvals",
        response="Approval"),
    Endpoint(
        "POST", "/approvals/{id}/approve", _decision(True),
        "Approve a pending request (the first decision wins).", "approvals", ApproveBody,
        response="Approval",
        write=True,
    ),
    Endpoint(
        "POST", "/approvals/{id}/deny", _decision(False),
        "Deny a pending request (the first decision wins).", "approvals", DenyBody,
        response="Approval",
        write=True,
    ),
    Endpoint("GET", "/mcp/tokens", list_mcp_tokens, "List MCP tokens.", "mcp",
        response="McpTokens"),
    Endpoint(
        "POST", "/mcp/tokens/{id}/revoke", revoke_mcp_token, "Revoke an MCP token.", "mcp",
        response="McpTokenRevoked",
        write=True,
    ),
)  # fmt: skip
"""Every endpoint, under ``/api/v1``."""


def _endpoint(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    async def serve(request: Request) -> Response:
        services: Services = request.app.state.services
        who = await bearer_principal(request, services.tokens)
        if endpoint.write and who.read_only:
            raise Forbidden("this token is read-only: it cannot change anything")
        data = await endpoint.handler(request, services, who)
        # a long iteration is megabytes of JSON: written in a thread, never on the event
        # loop that answers /healthz
        return await run_in_threadpool(_json, data, endpoint.status)

    return serve


def routes(prefix: str = "/api/v1") -> list[Route]:
    """The routes of ``ENDPOINTS`` under ``prefix``."""
    return [
        Route(prefix + e.path, _endpoint(e), methods=[e.method], name=f"{e.method} {e.path}")
        for e in ENDPOINTS
    ]
