"""The arguments of ``OpenAICompatibleChatModel`` checked: the endpoint's URL and the ranges
of the numbers (the class docstring's), each refusal a ``ValueError`` naming the argument."""

from __future__ import annotations

import httpx

from worker.llm.openai_failures import shown_url

__all__ = ["check_limits", "completions_url", "endpoint_url"]


def endpoint_url(base_url: str) -> httpx.URL:
    """``base_url`` parsed; ``ValueError`` unless an http(s) URL with a host and a valid port."""
    try:
        url = httpx.URL(base_url)
    except httpx.InvalidURL as exc:  # a ValueError-like refusal, as for any bad argument
        raise ValueError(f"base_url is not a usable URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        shown = shown_url(base_url)
        raise ValueError(f"base_url must be an http(s) URL with a host, got {shown!r}")
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError(f"base_url has an invalid port ({url.port}); a port is 1 to 65535")
    return url


def check_limits(
    max_retries: int,
    timeout_s: float,
    backoff_initial_s: float,
    backoff_max_s: float,
    max_response_bytes: int,
    max_connections: int,
) -> None:
    """``ValueError`` naming the first argument out of its range (the class docstring's)."""
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if timeout_s <= 0 or backoff_initial_s < 0 or backoff_max_s < 0:
        raise ValueError(
            "timeout_s must be > 0 and backoff_initial_s, backoff_max_s >= 0; got "
            f"{timeout_s}, {backoff_initial_s}, {backoff_max_s}"
        )
    if max_response_bytes < 1:
        raise ValueError(f"max_response_bytes must be >= 1, got {max_response_bytes}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be >= 1, got {max_connections}")


def completions_url(url: httpx.URL) -> str:
    """``{url}/chat/completions``, the path before a query (``…/v1?key=…`` →
    ``…/v1/chat/completions?key=…``)."""
    return str(url.copy_with(path=url.path.rstrip("/") + "/chat/completions"))
