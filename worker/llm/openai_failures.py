"""How an attempt of the OpenAI-compatible client failed, in the words its errors use: which
statuses are retried, what ``Retry-After`` asks, which failures of the HTTP stack are an
unusable answer (not retried) and which a connection failure (retried), and the text of the
final ``LLMStatusError``. The rules themselves are in ``worker.llm.openai_compat``'s docstring.
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime

import aiohttp
import httpx

from planner.errors import LLMConnectionError, LLMError, LLMResponseError, LLMStatusError
from worker.llm.openai_reply import EXCERPT_CHARS, body_text, excerpt
from worker.llm.response_body import Answer, BodyTooLarge

__all__ = [
    "RETRYABLE_STATUS",
    "Retryable",
    "attempts_text",
    "final_error",
    "head",
    "retry_after_s",
    "retryable_status",
    "shown_url",
    "status_error",
    "status_text",
    "too_large",
    "transport_cause",
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
    """What an endpoint did, in words, when the HTTP stack failed with ``exc``, which is none
    of httpx's transport errors (those are connection failures or timeouts, retried); ``None``
    when ``exc`` is a connection failure all the same (worth retrying).

    aiohttp's client raises ``ClientResponseError`` for an answer its parser refuses (a
    header line over 8190 bytes, more than 32768 headers, a broken status line, a bad
    ``Content-Length``) and ``httpx-aiohttp`` passes it on unmapped: the endpoint answered
    something that is not HTTP, and asking again gets the same. A connection failure that
    reaches here unmapped (aiohttp's ``ClientConnectionError``, an ``OSError``) is retried.
    Anything else (an httpx error that is not a transport error, a ``ValueError`` of the
    stack) fails the request at once, named by its type.
    """
    if isinstance(exc, aiohttp.ClientConnectionError | OSError):
        return None
    if isinstance(exc, aiohttp.ClientResponseError):
        # its message says what the parser met; its str() would add the URL (a secret in
        # the query) and the request's headers are on it too (the API key): neither is used
        detail = " ".join(str(exc.message).split())[:EXCERPT_CHARS]
        return f"sent an answer that is not valid HTTP ({detail or f'status {exc.status}'})"
    detail = " ".join(str(exc).split())[:EXCERPT_CHARS]
    named = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return f"sent an answer the HTTP client could not read ({named})"


def transport_cause(exc: BaseException) -> BaseException:
    """What went wrong under an httpx transport error: aiohttp's own exception when the
    aiohttp transport mapped it (its mapping calls a refused connection or a server that hung
    up a ``ConnectTimeout``), else ``exc``."""
    cause = exc.__cause__
    return cause if isinstance(cause, aiohttp.ClientError) else exc


def shown_url(url: str) -> str:
    """``url`` fit for errors and logs: a password in it and the values of its query replaced
    by ``***`` (they may be credentials: ``user:secret@``, ``?key=…``)."""
    parsed = httpx.URL(url)
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


def too_large(exc: BodyTooLarge, url: str, limit_name: str, attempts: int) -> LLMResponseError:
    """The error of an answer over the byte cap (``limit_name``, as the operator knows it)."""
    limit = f"larger than {limit_name} ({exc.limit_bytes} bytes)"
    if exc.announced_bytes is not None:
        what = f"announced an answer of {exc.announced_bytes} bytes (Content-Length), {limit}"
        how = "not read"
    else:
        what, how = f"sent an answer {limit}", "reading stopped at the limit"
    return LLMResponseError(
        f"LLM endpoint {url} {what}, {how} ({attempts_text(attempts)}; not retried)"
    )


def final_error(exc: Retryable, url: str, timeout_s: float, attempts: int) -> LLMError:
    """The error of a request whose last attempt failed with ``exc`` (retryable, retries
    spent): ``LLMStatusError`` for a status, else ``LLMConnectionError``."""
    if exc.status is not None:
        return status_error(url, exc.status, exc.answered, exc.body, attempts)
    cause = exc.exc
    detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
    if isinstance(cause, TimeoutError):
        detail = "the whole answer had not arrived by the deadline"
    if exc.reason == "timeout":
        return LLMConnectionError(
            f"LLM endpoint {url} did not answer within {timeout_s:g} s "
            f"({attempts_text(attempts)}): {detail}"
        )
    return LLMConnectionError(
        f"could not reach LLM endpoint {url} ({attempts_text(attempts)}): {detail}"
    )
