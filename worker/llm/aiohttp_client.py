"""aiohttp's client as the OpenAI-compatible provider uses it: the session (its pool), the
answer under the names ``read_body`` reads (``Answer``), and the environment's proxy, read
once as httpx would read it."""

from __future__ import annotations

import base64
import codecs
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import httpx

__all__ = [
    "AIOHTTP_TRANSPORT",
    "AiohttpAnswer",
    "AiohttpPost",
    "aiohttp_post",
    "env_proxy",
    "open_session",
]


AIOHTTP_TRANSPORT = "aiohttp.ClientSession"
"""Requests to an endpoint go straight through aiohttp's client and its connection pool (one
``ClientSession`` per model, made at the first request). httpcore's own pool cost about 1.7
ms of CPU per request on the 2-core CI machine and scans every connection for every request
it assigns (encode/httpcore#1035); aiohttp's about 0.45 ms, whatever the number of
connections. httpx's API on top of aiohttp's pool (``httpx-aiohttp``, as before) cost both:
its request, header and response objects were a third of the request path's CPU
(bench/concurrency.py). httpx stays for what it is given as ``transport`` (tests'
``MockTransport``)."""


@dataclass(frozen=True, slots=True)
class AiohttpPost:
    """What every post to one endpoint passes to aiohttp, set once: the URL (no credentials
    in it), the headers, the environment's proxy, the timeouts, the pool's size."""

    url: str
    headers: dict[str, str]
    proxy: str | None
    timeout: aiohttp.ClientTimeout
    max_connections: int


def aiohttp_post(
    url: httpx.URL,
    headers: dict[str, str],
    *,
    basic: tuple[str, str] | None,
    timeout_s: float,
    max_connections: int,
) -> AiohttpPost:
    """``AiohttpPost`` for ``url`` as httpx's client would send it: ``basic`` credentials (the
    URL's) as a Basic ``Authorization`` header over a Bearer key; the environment's proxy
    (``HTTP(S)_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) read once, not in a thread per request
    as aiohttp's ``trust_env`` would; ``timeout_s`` for connecting, each read and the wait
    for a pooled connection, as ``httpx.Timeout(timeout_s)``."""
    headers = dict(headers)
    if basic is not None:
        userpass = f"{basic[0]}:{basic[1]}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(userpass).decode()
    return AiohttpPost(
        url=str(url),
        headers=headers,
        proxy=env_proxy(url.scheme, url.host),
        timeout=aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=timeout_s, sock_read=timeout_s
        ),
        max_connections=max_connections,
    )


def open_session(max_connections: int) -> aiohttp.ClientSession:
    """aiohttp's session (its pool of at most ``max_connections``, every one kept open for
    the next rounds' requests: httpx.Limits' 5 s keep-alive), made in the running loop;
    certificates verified as httpx verifies them (its default SSL context); bodies left
    compressed (``read_body`` decodes them with bounded output)."""
    connector = aiohttp.TCPConnector(
        limit=max_connections,
        keepalive_timeout=_KEEPALIVE_S,
        ssl=httpx.create_ssl_context(),
    )
    return aiohttp.ClientSession(connector=connector, auto_decompress=False)


def env_proxy(scheme: str, host: str) -> str | None:
    """The proxy the environment names for ``scheme``://``host`` (``HTTPS_PROXY``,
    ``HTTP_PROXY``, ``ALL_PROXY``; none when ``NO_PROXY`` covers the host), as httpx's
    ``trust_env`` reads it."""
    proxies = urllib.request.getproxies_environment()
    # NO_PROXY, as urllib.request reads it (a function typeshed does not list)
    if urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
        return None
    return proxies.get(scheme) or proxies.get("all") or None


_KEEPALIVE_S = 5.0
"""Seconds an idle pooled connection is kept open (httpx.Limits' ``keepalive_expiry``)."""


class AiohttpAnswer:
    """An aiohttp ``ClientResponse`` under the names the client reads (``Answer``): status,
    reason, headers (case-insensitive ``get``), the charset (``utf-8`` when it names none or
    one Python does not know, as httpx's ``encoding``), the raw body in chunks as they
    arrive; ``aclose`` releases it (a body not read to its end drops the connection)."""

    CHUNK_BYTES = 16 * 1024

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.reason_phrase = response.reason or ""
        self.is_success = 200 <= response.status < 300
        self.headers = response.headers
        self.is_stream_consumed = False
        self.content = b""

    @property
    def encoding(self) -> str:
        charset = self._response.charset
        if charset:
            try:
                return codecs.lookup(charset).name
            except LookupError:
                pass
        return "utf-8"

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.content.iter_chunked(self.CHUNK_BYTES):
            yield chunk

    async def aclose(self) -> None:
        self._response.release()
