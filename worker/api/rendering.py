"""How the console draws a page: its templates (Jinja2, autoescaped) and their filters, the
fixed texts a page says after a button, and ``render``, which draws a page in a worker thread so
that a long one never holds the event loop (``/healthz`` answers meanwhile)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse

from worker import redaction
from worker.api.auth import SESSION_COOKIE
from worker.api.timeline import page_of_round
from worker.api.times import duration, local_when, when
from worker.queries.admin_tokens import csrf_token
from worker.queries.stored import decided_text
from worker.terminal_text import visible

__all__ = ["ENFORCE_SWITCH_SHARE", "FLASHES", "render", "templates"]

_HERE = Path(__file__).parent

ENFORCE_SWITCH_SHARE = 0.01
"""The rollout's switch criterion: under 1 % would-be denials over a week of log-only."""


def _shown(value: Any) -> str:
    """Stored text as shown: hidden characters as escapes (autoescape does the HTML)."""
    return visible("" if value is None else str(value))


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "), default=str)
"""One line of JSON per value, by the C encoder (an indented dump takes the pure-Python one,
ten times slower: most of a long timeline's render time)."""


def _pretty(value: Any) -> str:
    """A JSON value (arguments) for a <pre>, hidden characters escaped; text (a tool result:
    what the model read) as it is."""
    if isinstance(value, str):
        return visible(value)
    return visible(_JSON.encode(value))


def templates() -> Environment:
    """The console's templates, autoescaped, with the filters they use: ``shown`` (hidden
    characters escaped), ``when`` (a time in UTC, the console's one format), ``local_when``
    (in a mission's zone), ``duration``, ``pretty`` (JSON on one line), ``decided``."""
    env = Environment(
        loader=FileSystemLoader(_HERE / "templates"),
        autoescape=select_autoescape(["html"], default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shown"] = _shown
    env.filters["when"] = when
    env.filters["local_when"] = local_when
    env.filters["duration"] = duration
    env.filters["pretty"] = _pretty
    env.filters["decided"] = lambda row: decided_text(row, when=when)
    env.globals["round_link"] = _round_link
    env.globals["switch_share"] = ENFORCE_SWITCH_SHARE
    return env


FLASHES = {
    "run": "Made due now: a worker starts it at once when it listens for wake-ups, else at its "
    "next tick.",
    "pause": "Paused: no run starts until it is resumed.",
    "resume": "Resumed.",
    "unchanged": "Nothing changed: it already was so.",
    "parked": "Its run waits for an approval; deciding it is what makes the run go on.",
    "deadline": "Resumed, but its deadline has passed: the next tick completes it without a run.",
}
"""What a page says after a button did something (``?done=KEY``): fixed texts only, so a link
cannot make the console say something of its own."""


def _round_link(iteration_id: Any, round_no: Any) -> str:
    """The URL of round ``round_no`` of an iteration: on its page of rounds, at its anchor."""
    page = page_of_round(round_no)
    return (
        f"/iterations/{iteration_id}"
        + (f"?page={page}" if page > 1 else "")
        + (f"#round-{round_no}" if round_no else "")
    )


async def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Page ``name`` drawn in a worker thread: a long page takes CPU for a while, and the event
    loop goes on answering (``/healthz`` above all) meanwhile."""
    env: Environment = request.app.state.templates
    session_id = request.cookies.get(SESSION_COOKIE, "")
    context.setdefault("flash", FLASHES.get(request.query_params.get("done", "")))
    kept = [(k, v) for k, v in request.query_params.multi_items() if k in ("page", "before")]
    context.setdefault("here", request.url.path + (f"?{urlencode(kept)}" if kept else ""))
    template = env.get_template(name)

    def draw() -> str:
        html = template.render(
            request=request, csrf=csrf_token(session_id) if session_id else "", **context
        )
        return redaction.redact(html)  # never a secret of the process (``worker.redaction``)

    html = await run_in_threadpool(draw)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})
