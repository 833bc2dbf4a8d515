"""Telling a person that a call waits for their approval: a JSON POST to
``MANA_AI_APPROVAL_WEBHOOK_URL`` for every new approval request.

``ApprovalWebhook.notify`` never blocks and never raises: it starts a delivery task and
returns. A delivery is retried (``tenacity``) with exponential backoff and jitter on a
connection error, a timeout, 408, 429 and 5xx answers, for ``DELIVERY_ATTEMPTS`` attempts
(about two minutes in all); any other answer (a 4xx: the URL or its secret is wrong) is not
retried. Every delivery is counted (``mana_ai_approval_webhooks_total{outcome}``: ``delivered``
or ``failed``) and a failure is logged with the request's id, never with the URL (incoming
webhook URLs carry their secret).

The body (``approval_notice``) is the request (``id``, ``user``, ``agent_id``,
``mission_id``, ``iteration_id``, ``round``, ``tool``, ``arguments``, ``reason``,
``reply_text``, ``target``: what the call would act on, as its tool read it back,
``created_at``, ``expires_at``), the commands that decide it (``decide``),
a one-line ``text`` for chat incoming webhooks (Slack, Mattermost, Rocket.Chat show it), and
``link``: the request in the console (``MANA_AI_CONSOLE_URL``; ``null`` when unset).
Each failed attempt is logged (the request's id, why, the wait before the next). A process that
stops (``mana-ai worker``, ``tick --once``, ``mcp serve``) waits up to its shutdown grace
(``MANA_AI_SHUTDOWN_GRACE_S``) for deliveries under way, then drops them, naming their
requests; the requests themselves stay (``mana-ai approvals list``,
``mana_ai_approvals_pending``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from worker import metrics
from worker.terminal_text import visible_line

__all__ = [
    "DELIVERY_ATTEMPTS",
    "ApprovalWebhook",
    "approval_notice",
]

logger = logging.getLogger(__name__)

DELIVERY_ATTEMPTS = 8
"""Attempts at one delivery: with waits of 1, 2, 4, … s (at most 30 s, plus up to 1 s of jitter)
between them, about two minutes in all."""

ATTEMPT_TIMEOUT_S = 10.0
"""Seconds one POST may take, connecting included."""

_RETRIED_STATUSES = frozenset({408, 429})


class _RetriableAnswer(Exception):
    """The webhook answered with a status worth trying again (408, 429, 5xx)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, _RetriableAnswer | httpx.TransportError)


def approval_notice(request: Mapping[str, Any], console_url: str | None = None) -> dict[str, Any]:
    """The JSON body of the notification of ``request`` (an ``approval_requests`` row, or the
    same keys): see the module docstring; with ``console_url``, ``link`` is the request in the
    console."""
    request_id = request["id"]
    arguments = json.dumps(request.get("arguments"), ensure_ascii=False, sort_keys=True)
    where = (
        f"mission {request['mission_id']}"
        if request.get("mission_id") is not None
        else "an MCP client"
    )
    expires = request.get("expires_at")
    approve = f"mana-ai approvals approve {request_id}"
    deny = f"mana-ai approvals deny {request_id} --reason '...'"
    text = (
        f"mana-ai: {where} (user {request['user_id']}) asks to run {request['tool']} "
        f"{_short(arguments)}; approve with `{approve}`, deny with `{deny}`"
        + (f" (expires {_iso(expires)})" if expires is not None else "")
    )
    return {
        "event": "approval_requested",
        "id": request_id,
        "consumer": request.get("consumer"),
        "user": request["user_id"],
        "agent_id": request.get("agent_id"),
        "mission_id": request.get("mission_id"),
        "iteration_id": request.get("iteration_id"),
        "round": request.get("round"),
        "tool": request["tool"],
        "arguments": request.get("arguments"),
        "reason": request.get("reason"),
        "reply_text": request.get("reply_text"),
        "target": request.get("target"),
        "created_at": _iso(request.get("created_at")),
        "expires_at": _iso(expires),
        "decide": {
            "approve": approve,
            "deny": deny,
            "show": f"mana-ai approvals show {request_id}",
        },
        "text": visible_line(text),
        "link": f"{console_url}/approvals#approval-{request_id}" if console_url else None,
    }


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ApprovalWebhook:
    """Delivers approval notices to one URL (see the module docstring).

    Args:
        url: the webhook's http(s) URL (never logged).
        attempts: attempts per delivery (default ``DELIVERY_ATTEMPTS``).
        timeout_s: seconds per attempt (default ``ATTEMPT_TIMEOUT_S``).
        max_wait_s: longest wait between two attempts (default 30 s).
        transport: an httpx transport (tests); default: httpx's own.
        console_url: the console's address (``MANA_AI_CONSOLE_URL``): notices link to it.
    """

    def __init__(
        self,
        url: str,
        *,
        console_url: str | None = None,
        attempts: int = DELIVERY_ATTEMPTS,
        timeout_s: float = ATTEMPT_TIMEOUT_S,
        max_wait_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.console_url = console_url
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.max_wait_s = max_wait_s
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[bool]] = set()

    def notify(self, request: Mapping[str, Any]) -> None:
        """Start delivering the notice of ``request`` (an ``approval_requests`` row or the
        same keys) and return at once; never raises. Call it from the event loop."""
        try:
            notice = approval_notice(request, self.console_url)
        except Exception:  # a notice that cannot be built must not stop the run
            logger.exception("could not build the notice of approval request %s", request.get("id"))
            metrics.APPROVAL_WEBHOOKS.labels(outcome="failed").inc()
            return
        task = asyncio.get_running_loop().create_task(
            self.deliver(notice), name=f"approval request {notice['id']}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def deliver(self, notice: Mapping[str, Any]) -> bool:
        """POST ``notice`` with retries; True when the webhook took it (2xx). Never raises
        except on cancellation."""
        body = json.dumps(notice, ensure_ascii=False).encode("utf-8")
        request_id = notice.get("id")

        def retrying(state: RetryCallState) -> None:
            failure = state.outcome.exception() if state.outcome is not None else None
            wait_s = state.next_action.sleep if state.next_action is not None else 0.0
            logger.warning(
                "approval webhook: attempt %d for approval request %s failed (%s); trying again "
                "in %.1f s",
                state.attempt_number,
                request_id,
                _reason(failure) if failure is not None else "?",
                wait_s,
            )

        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(self.attempts),
                wait=wait_exponential_jitter(initial=1, max=self.max_wait_s, jitter=1),
                retry=retry_if_exception(_retriable),
                before_sleep=retrying,
                reraise=True,
            ):
                with attempt:
                    await self._post(body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            metrics.APPROVAL_WEBHOOKS.labels(outcome="failed").inc()
            logger.error(
                "could not notify the approval webhook of approval request %s: %s (the request "
                "stays pending: `mana-ai approvals list`)",
                notice.get("id"),
                _reason(exc),
            )
            return False
        metrics.APPROVAL_WEBHOOKS.labels(outcome="delivered").inc()
        logger.info("approval webhook notified of approval request %s", notice.get("id"))
        return True

    async def _post(self, body: bytes) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=self.timeout_s, transport=self._transport, follow_redirects=False
            )
        response = await self._client.post(
            self.url,
            content=body,
            headers={"Content-Type": "application/json", "User-Agent": "mana-ai"},
        )
        status = response.status_code
        if status in _RETRIED_STATUSES or status >= 500:
            raise _RetriableAnswer(status)
        if not 200 <= status < 300:
            raise RuntimeError(f"the webhook answered HTTP {status}; not retried")

    async def aclose(self, grace_s: float = 0.0) -> None:
        """Wait up to ``grace_s`` seconds for the deliveries under way, cancel the rest, and
        close the HTTP client."""
        pending = set(self._tasks)
        if pending and grace_s > 0:
            _, pending = await asyncio.wait(pending, timeout=grace_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
            metrics.APPROVAL_WEBHOOKS.labels(outcome="failed").inc(len(pending))
            logger.warning(
                "approval webhook: not delivered before shutdown: %s (the requests stay pending: "
                "`mana-ai approvals list`)",
                ", ".join(sorted(t.get_name() for t in pending)),
            )
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _reason(exc: BaseException) -> str:
    """Why a delivery failed, without the URL (httpx's messages may quote it)."""
    if isinstance(exc, _RetriableAnswer):
        return f"the webhook answered HTTP {exc.status} every time"
    if isinstance(exc, httpx.TimeoutException):
        return "the webhook did not answer in time"
    if isinstance(exc, httpx.TransportError):
        return f"could not reach the webhook ({type(exc).__name__})"
    return str(exc)
