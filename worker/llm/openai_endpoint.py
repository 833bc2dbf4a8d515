"""The endpoint an ``OpenAICompatibleChatModel`` talks to: its base URL checked, the model's
numeric arguments checked, and the one ``httpx2.AsyncClient`` that carries its requests."""

from __future__ import annotations

import httpx2

from worker.llm.openai_failures import shown_url
from worker.llm.response_body import ACCEPT_ENCODING

__all__ = ["check_limits", "endpoint_url", "http_client"]


def endpoint_url(base_url: str) -> httpx2.URL:
    """``base_url`` parsed; ``ValueError`` unless an http(s) URL with a host and a valid port."""
    try:
        url = httpx2.URL(base_url)
    except httpx2.InvalidURL as exc:  # a ValueError-like refusal, as for any bad argument
        raise ValueError(f"base_url is not a usable URL ({exc})") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(
            f"base_url must be an http(s) URL with a host, got {shown_url(base_url)!r}"
        )
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError(f"base_url has an invalid port ({url.port}); a port is 1 to 65535")
    return url


def check_limits(
    *,
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


def http_client(
    url: str,
    *,
    api_key: str | None,
    timeout_s: float,
    max_connections: int,
    transport: httpx2.AsyncBaseTransport | None,
) -> tuple[httpx2.URL, httpx2.AsyncClient]:
    """The URL to post to (credentials in ``url`` taken out: they go as Basic auth, over a
    Bearer ``api_key``, as httpx2 sends them) and the client that posts: JSON accepted, only the
    codings ``read_body`` decodes with bounded output asked for (httpx2 adds ``br`` when
    brotli is installed, whose decoder it cannot bound), at most ``max_connections`` open,
    every one kept for the next rounds' requests (5 s idle), ``timeout_s`` for connecting,
    each read, each write and the wait for a pooled connection."""
    target = httpx2.URL(url)
    auth = None
    if target.userinfo:
        auth = httpx2.BasicAuth(target.username, target.password)
        target = target.copy_with(userinfo=b"")
    headers = {"Accept": "application/json", "Accept-Encoding": ACCEPT_ENCODING}
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    limits = httpx2.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections
    )
    client = httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(timeout_s),
        limits=limits,
        transport=transport,
        auth=auth,
    )
    return target, client
