"""The web console: server-rendered pages (Jinja2, autoescaped) that read and steer missions.

Pages: missions (status, schedule, next run, last outcome, parked for approval), a mission's
iterations, an iteration's timeline (``worker.api.timeline``: rounds with their reminders,
replies, calls with decisions side by side where reads ran in parallel, compactions that open
to the turns they folded and the summary read instead, the verdict, a rerun with today's
rules), the approvals inbox, and the policy report with the would-be deny share per day.

Every page needs a signed-in session (``worker.api.auth``); the rest is sent to ``/login``.
Every form that changes something carries the session's CSRF token and must come from this
origin. Forms work without JavaScript (they post and come back); with the vendored htmx
(``/static/htmx.min.js``, the only script, served from here under a CSP that allows nothing
else) a rerun or a decision updates its part of the page in place. Every text that came from
the database, a model, a tool or a peer is HTML-escaped and has its hidden characters shown
as escapes (``worker.terminal_text.visible``: a bidi override cannot reorder what is shown).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from worker.admin import missions as mission_ops
from worker.admin.deciding import decide
from worker.admin.values import parse_since, row_id
from worker.admin.verdict import verdict, with_warnings
from worker.api.auth import (
    SESSION_COOKIE,
    Forbidden,
    check_csrf,
    check_origin,
    public_origin,
    session_principal,
)
from worker.api.bodies import parsed
from worker.api.rendering import FLASHES, templates
from worker.api.rendering import render as _render
from worker.api.services import Services
from worker.api.timeline import ROUNDS_PER_PAGE, rounds_page, timeline
from worker.errors import ManaAIError, NotFoundError
from worker.queries.admin_tokens import AdminPrincipal

__all__ = ["FLASHES", "routes", "templates"]

_HERE = Path(__file__).parent


Page = Callable[[Request, Services, AdminPrincipal], Awaitable[Response]]


def _page(
    handler: Page, *, post: bool = False, write: bool = False
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` for a signed-in session (else the sign-in page); with ``post``, for a
    request with its session's CSRF token, from this origin; with ``write`` as well, for a
    session whose token may change things."""
    post = post or write

    async def serve(request: Request) -> Response:
        services: Services = request.app.state.services
        who = await session_principal(request, services.tokens)
        if who is None:
            if post:
                raise Forbidden("you are not signed in (or your session ended); sign in again")
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
        if post:
            await check_csrf(request)
        if write and who.read_only:
            raise Forbidden("your token is read-only: it cannot change anything")
        return await handler(request, services, who)

    return serve


def _is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def _back(request: Request, fallback: str, done: str | None = None) -> RedirectResponse:
    """303 to the page the form was on (this origin's path only), else ``fallback``; with
    ``done`` (a key of ``FLASHES``), that page says what happened."""
    referer = urlsplit(request.headers.get("referer", ""))
    own = request.url.netloc
    path = referer.path
    same = referer.netloc == own and path.startswith("/") and not path.startswith("//")
    target = path if same else fallback  # ("//host/x" would be another site)
    if done is not None:
        target += f"?done={done}"
    return RedirectResponse(target, status_code=303)


# -- sign-in ------------------------------------------------------------------------------------


async def _login(request: Request) -> Response:
    """``/login``: the sign-in page (GET), signing in (POST); one route, so that a 405 lists
    both methods."""
    return await (login(request) if request.method == "POST" else login_form(request))


async def login_form(request: Request) -> Response:
    return await _render(request, "login.html", next=_local(request.query_params.get("next")))


async def login(request: Request) -> Response:
    services: Services = request.app.state.services
    check_origin(request)  # no signing in from another site (login CSRF)
    form = await request.form()
    token, target = form.get("token"), _local(form.get("next"))
    started = None
    if isinstance(token, str) and token.strip() and len(token) <= 200:
        started = await services.tokens.start_session(token.strip(), ttl=services.session_ttl)
    if started is None:
        return await _render(
            request,
            "login.html",
            status=401,
            next=target,
            error="That token is not valid (unknown or revoked).",
        )
    _, session_id = started
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=int(services.session_ttl.total_seconds()),
        httponly=True,
        # lax: a link from elsewhere (an approval notice in chat) opens signed in; forms
        # still need the CSRF token and this origin
        samesite="lax",
        secure=request.url.scheme == "https" or (public_origin(request) or "").startswith("https:"),
        path="/",
    )
    return response


async def logout(request: Request) -> Response:
    services: Services = request.app.state.services
    session_id = request.cookies.get(SESSION_COOKIE)
    if session_id:
        await check_csrf(request)
        await services.tokens.end_session(session_id)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def _local(target: Any) -> str:
    """A path on this server to go to after signing in (anything else: the missions)."""
    if isinstance(target, str) and target.startswith("/") and not target.startswith("//"):
        return target if "\\" not in target else "/"
    return "/"


# -- pages --------------------------------------------------------------------------------------


MISSIONS_PER_PAGE = 50
ITERATIONS_PER_PAGE = 25
APPROVALS_PER_PAGE = 50
"""Rows of the missions list, of a mission's iterations and of each part of the approvals inbox
per page (``?before=ID`` pages on)."""
INBOX = ("pending", "decided")
"""The parts of the approvals inbox (its ``?status=``)."""


def _due(mission: dict[str, Any]) -> bool:
    """Whether a worker is about to start ``mission`` (active, its next run not in the future,
    not waiting for an approval): its page follows it live."""
    next_run = mission.get("next_run_at")
    return (
        mission.get("status") == "active"
        and not mission.get("awaiting_approval")
        and isinstance(next_run, datetime)
        and next_run <= datetime.now(UTC)
    )


async def missions_page(request: Request, s: Services, who: AdminPrincipal) -> Response:
    before = _before(request)
    rows = await s.admin.list_missions(limit=MISSIONS_PER_PAGE, before_id=before, last_run=True)
    waiting = await s.approvals.pending_by_mission([r["id"] for r in rows])
    for row in rows:
        row["awaiting_approval"] = waiting.get(row["id"])
    ids = [r["last_iteration_id"] for r in rows if r["last_iteration_id"] is not None]
    with_warnings(rows, await s.admin.answers_of(ids), "last_iteration_id")
    live = any(r["last_status"] == "running" or _due(r) for r in rows)
    more = rows[-1]["id"] if len(rows) == MISSIONS_PER_PAGE else None
    return await _render(
        request, "missions.html", who=who, missions=rows, live=live, more=more, before=before
    )


async def mission_page(request: Request, s: Services, who: AdminPrincipal) -> Response:
    mission_id = _int(request.path_params["id"])
    mission = await s.admin.get_mission(mission_id)
    waiting = await s.approvals.pending_by_mission([mission_id])
    mission["awaiting_approval"] = waiting.get(mission_id)
    before = _before(request)
    iterations = await s.admin.list_iterations(
        mission_id=mission_id, limit=ITERATIONS_PER_PAGE, before_id=before
    )
    with_warnings(iterations, await s.admin.answers_of([it["id"] for it in iterations]))
    live = _due(mission) or any(it["status"] == "running" for it in iterations)
    more = iterations[-1]["id"] if len(iterations) == ITERATIONS_PER_PAGE else None
    return await _render(
        request, "mission.html", who=who, mission=mission, iterations=iterations, live=live,
        more=more, before=before,
    )  # fmt: skip


def _before(request: Request) -> int | None:
    """The ``before`` of a list's page (an id: the rows after the previous page's last)."""
    before = request.query_params.get("before")
    return None if before is None else _int(before, "before")


def _course(operation: Callable[[Any, int], Awaitable[mission_ops.Course]], done: str) -> Page:
    """The button of ``operation``; the page it goes back to says what happened (``done``,
    or that nothing changed, or that a parked run waits for its approval)."""

    async def act(request: Request, s: Services, who: AdminPrincipal) -> Response:
        course = await operation(s.admin, _int(request.path_params["id"]))
        said = done
        if course.note is not None and course.note.startswith("parked run"):
            said = "parked"
        elif course.note == "deadline passed":
            said = "deadline"
        elif not course.changed:
            said = "unchanged"
        return _back(request, f"/missions/{request.path_params['id']}", said)

    return act


async def iteration_page(request: Request, s: Services, who: AdminPrincipal) -> Response:
    return await _iteration(request, s, who, report=None)


async def rerun(request: Request, s: Services, who: AdminPrincipal) -> Response:
    from worker.admin.rerun import rerun_iteration
    from worker.daemon.app import rerun_config

    iteration = await s.admin.get_iteration(_int(request.path_params["id"]))
    config = await rerun_config(s.admin, s.settings, iteration, None)
    report = await rerun_iteration(iteration, config)
    if _is_htmx(request):
        return await _render(request, "rerun.html", report=report)
    return await _iteration(request, s, who, report=report, iteration=iteration)


async def _iteration(
    request: Request,
    s: Services,
    who: AdminPrincipal,
    *,
    report: Any,
    iteration: Any = None,
) -> Response:
    page = _page_number(request.query_params.get("page", "1"))
    if iteration is None:
        iteration = await s.admin.get_iteration(_int(request.path_params["id"]))
    blocks, pages, said = await run_in_threadpool(
        _iteration_view, iteration, page, request.app.state.hints
    )
    if page > pages:
        raise NotFoundError(
            f"no such page: page: pages run from 1 to {pages} for iteration {iteration['id']},"
            f" got {page}"
        )
    return await _render(
        request,
        "iteration.html",
        who=who,
        it=iteration,
        blocks=blocks,
        verdict=said,
        report=report,
        page=page,
        pages=pages,
        per_page=ROUNDS_PER_PAGE,
        live=iteration["status"] == "running",
    )


def _iteration_view(
    iteration: Any, page: int, hints: dict[str, str]
) -> tuple[list[dict[str, Any]], int, str]:
    """The timeline's blocks of ``page`` of ``iteration``, its number of pages and its
    verdict: CPU for a long iteration, so run in a thread (``_iteration``)."""
    from worker.admin.replay import replay_events

    events, pages = rounds_page(replay_events(iteration), page)
    return timeline(events, hints), pages, verdict(iteration)


async def approvals_page(
    request: Request,
    s: Services,
    who: AdminPrincipal,
    errors: dict[int, str] | None = None,
) -> Response:
    """The inbox: the requests that wait, then the decided ones, each newest first and paged
    (``?status=pending|decided&before=ID`` pages on through one of them); ``errors`` by
    request id shows why a decision was refused at its row (the page is then answered 409)."""
    status = request.query_params.get("status")
    if status is not None and status not in INBOX:
        raise NotFoundError(f"no such page: status {status!r} is not one of {', '.join(INBOX)}")
    before = _before(request)
    parts = []
    for part in INBOX:
        if status in (None, part):
            rows = await s.approvals.list_requests(
                status=part, limit=APPROVALS_PER_PAGE + 1, before_id=before
            )
            rows, more = rows[:APPROVALS_PER_PAGE], len(rows) > APPROVALS_PER_PAGE
            parts.append({"key": part, "rows": rows, "more": rows[-1]["id"] if more else None})
    return await _render(
        request,
        "approvals.html",
        status=409 if errors else 200,
        who=who,
        parts=parts,
        before=before,
        errors=errors or {},
    )


def _decision(approve: bool) -> Page:
    async def act(request: Request, s: Services, who: AdminPrincipal) -> Response:
        form = await request.form()
        note = form.get("note")
        note_text = note.strip() if isinstance(note, str) and note.strip() else None
        request_id = _int(request.path_params["id"])
        error = None
        try:
            await decide(
                s.approvals,
                request_id,
                approve=approve,
                by=who.name,
                note=note_text,
                labels=lambda f: {"by": "your name", "note": "the note"}[f],
            )
        except ManaAIError as exc:  # decided elsewhere first, expired: say so on the row
            if isinstance(exc, NotFoundError):
                raise
            error = str(exc)
        if _is_htmx(request):
            row = await s.approvals.get(request_id)
            return await _render(request, "approval_row.html", who=who, a=row, error=error)
        if error is not None:  # without JavaScript: the inbox, saying so at the row
            return await approvals_page(request, s, who, errors={request_id: error})
        return _back(request, "/approvals")

    return act


async def policy_page(request: Request, s: Services, who: AdminPrincipal) -> Response:
    since = parsed(request.query_params.get("since", "7d"), parse_since, "since")
    report = await s.policy.report(since=since)
    days = _every_day(await s.policy.daily_would_deny(since=since), report.since)
    peak = max((d["calls"] for d in days), default=0)
    for day in days:
        day["share"] = day["would_deny"] / day["calls"] if day["calls"] else 0.0
        day["height"] = round(100 * day["calls"] / peak) if peak else 0
    return await _render(request, "policy.html", who=who, report=report, days=days)


def _every_day(days: list[dict[str, Any]], since: datetime) -> list[dict[str, Any]]:
    """``days`` with the days of the period that had no log-only call (up to 62 of them) as
    zeros, so the chart's bars stand for days."""
    start = since.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if (today - start).days > 62:
        return days
    found = {d["day"].astimezone(UTC).date(): d for d in days}
    filled = []
    day = start
    while day <= today:
        filled.append(found.get(day.date(), {"day": day, "calls": 0, "would_deny": 0}))
        day += timedelta(days=1)
    return filled


def _int(text: str, field: str = "id") -> int:
    """An id of the path or of ``field`` of the query (``worker.admin.values.row_id``'s rule);
    anything else is no page, and the message says what ``field`` takes, as the API's 400s
    do."""
    try:
        return row_id(text)
    except argparse.ArgumentTypeError as exc:
        raise NotFoundError(f"no such page: {field}: {exc}") from None


def _page_number(text: str) -> int:
    """The ``?page=`` of a long iteration: 1, 2, …; anything else is no page."""
    try:
        return row_id(text)
    except argparse.ArgumentTypeError:
        raise NotFoundError(f"no such page: page: pages run from 1, got {text!r}") from None


def routes() -> list[Route | Mount]:
    """The console's routes, its static files under ``/static``."""
    return [
        Route("/login", _login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", _page(missions_page), methods=["GET"]),
        Route("/missions/{id}", _page(mission_page), methods=["GET"]),
        Route(
            "/missions/{id}/run",
            _page(_course(mission_ops.run_now, "run"), write=True),
            methods=["POST"],
        ),
        Route(
            "/missions/{id}/pause",
            _page(_course(mission_ops.pause_mission, "pause"), write=True),
            methods=["POST"],
        ),
        Route(
            "/missions/{id}/resume",
            _page(_course(mission_ops.resume_mission, "resume"), write=True),
            methods=["POST"],
        ),
        Route("/iterations/{id}", _page(iteration_page), methods=["GET"]),
        Route("/iterations/{id}/rerun", _page(rerun, post=True), methods=["POST"]),
        Route("/approvals", _page(approvals_page), methods=["GET"]),
        Route("/approvals/{id}/approve", _page(_decision(True), write=True), methods=["POST"]),
        Route("/approvals/{id}/deny", _page(_decision(False), write=True), methods=["POST"]),
        Route("/policy", _page(policy_page), methods=["GET"]),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
