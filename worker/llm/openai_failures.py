"""How an attempt of the OpenAI-compatible client failed, in the words its errors use: which
statuses are retried, what ``Retry-After`` asks, which failures of the HTTP stack are an
unusable answer (not retried) and which a connection failure (retried), and the text of the
final ``LLMStatusError``. The rules themselves are in ``worker.llm.openai_compat``'s docstring.
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime

import httpx2

from planner.errors import LLMStatusError
from worker.llm.openai_reply import EXCERPT_CHARS, body_text, excerpt
from worker.llm.response_body import Answer

__all__ = [
    "RETRYABLE_STATUS",
    "Retryable",
    "attempts_text",
    "head",
    "is_timeout",
    "retry_after_s",
    "retryable_status",
    "shown_url",
    "status_error",
    "status_text",
    "unusable_answer",
]

RETRYABLE_STATUS = frozenset({408, 429})
"""Non-5xx statuses worth retrying: Request Timeout and Too Many Requests (RFC 9110, RFC 6585)."""


class Retryable(Exception):
    """An attempt failed in a way worth retrying; carries what the final error needs."""

    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        answered: str = "",
        body: str = "",
        exc: BaseException | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.answered = answered
        self.body = body
        self.exc = exc
        self.retry_after_s = retry_after_s


def unusable_answer(exc: Exception) -> str | None:
    """What an endpoint did, in words, when an attempt failed with ``exc`` (an exception of
    the HTTP stack); ``None`` when ``exc`` is a connection failure or a timeout (worth
    retrying).

    httpx2's transport errors are connection failures (refused, reset, the server hung up, a
    body cut off: ``peer closed connection …``), and so is an ``OSError`` that reaches here
    unmapped; a timeout is a ``TimeoutError`` or an ``httpx2.TimeoutException``. The one
    exception is an answer HTTP/1.1's parser (h11, under httpcore2) refuses: a header block
    over httpcore2's 100 KiB, a broken status or header line, a bad ``Content-Length``. The
    endpoint answered something that is not HTTP, and asking again gets the same: it is
    named as such. Anything else (an httpx2 error that is not a transport error, a
    ``ValueError`` of the stack) fails the request at once, named by its type.
    """
    if isinstance(exc, httpx2.RemoteProtocolError) and _refused_by_parser(exc):
        # the parser's words; the request (with the API key) rides on httpx2's error, unused
        detail = " ".join(str(exc).split())[:EXCERPT_CHARS]
        return f"sent an answer that is not valid HTTP ({detail or 'unparseable'})"
    if isinstance(exc, httpx2.TransportError | OSError | TimeoutError):
        return None
    detail = " ".join(str(exc).split())[:EXCERPT_CHARS]
    named = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return f"sent an answer the HTTP client could not read ({named})"


def is_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a deadline that passed (the attempt's, or one of httpx2's)."""
    return isinstance(exc, TimeoutError | httpx2.TimeoutException)


def _refused_by_parser(exc: BaseException) -> bool:
    """Whether h11 raised the error under ``exc`` for what it read (not for a connection that
    closed early: ``peer closed connection without sending complete message body``)."""
    cause: BaseException | None = exc
    for _ in range(5):  # httpx2's error, httpcore2's, h11's (httpcore2's keeps it as context)
        if cause is None:
            break
        if type(cause).__module__.split(".")[0] == "h11":
            return not str(cause).startswith("peer closed connection")
        cause = cause.__cause__ or cause.__context__
    return False


def shown_url(url: str) -> str:
    """``url`` fit for errors and logs: a password in it and the values of its query replaced
    by ``***`` (they may be credentials: ``user:secret@``, ``?key=…``)."""
    parsed = httpx2.URL(url)
    if parsed.password:
        parsed = parsed.copy_with(username=parsed.username, password="***")
    if parsed.query:
        parsed = parsed.copy_with(params=[(k, "***") for k, _ in parsed.params.multi_items()])
    return str(parsed).replace("%2A%2A%2A", "***")


def retryable_status(status: int) -> bool:
    return status >= 500 or status in RETRYABLE_STATUS


def attempts_text(n: int) -> str:
    return f"after {n} attempt{'s' if n != 1 else ''}"


def head(response: Answer, content: bytes) -> str:
    """The first ``EXCERPT_CHARS`` characters of a body (4 bytes hold any character)."""
    return body_text(response, content[: 4 * EXCERPT_CHARS])[:EXCERPT_CHARS]


def status_text(response: Answer) -> str:
    return f"{response.status_code} {response.reason_phrase}".strip()


def status_error(url: str, status: int, answered: str, body: str, attempts: int) -> LLMStatusError:
    return LLMStatusError(
        f"LLM endpoint {url} answered {answered} {attempts_text(attempts)}: "
        f"{excerpt(body) or '(empty body)'}",
        status_code=status,
        body=body[:EXCERPT_CHARS],
    )


def retry_after_s(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (RFC 9110 §10.2.3), or ``None``.

    Accepts delta-seconds (``"7"``, fractional values tolerated) or an HTTP-date (a date in the
    past means 0). Anything unparseable is ignored (``None``: fall back to jittered backoff).
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:  # RFC 9110 HTTP-dates are always GMT
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
