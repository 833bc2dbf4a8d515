"""The built-in web reader: ``web_fetch`` (``read``, scope ``web``) GETs an http(s) URL.

It answers ``{"url", "final_url", "status", "content_type", "title", "text", "truncated",
"redirects"}``: HTML is reduced to readable text by resiliparse (block structure and list
bullets kept; scripts, styles, ``noscript`` and elements marked hidden dropped), other text
types are decoded as they are, and the text is cut to ``max_chars`` characters. A non-2xx
status is still an answer (the page says why). A refused URL raises ``URLRefusedError``; a
binary content type, a failed connection or the deadline raise ``WebFetchError`` (the loop
turns either into an error tool result).

Safety (see ``worker.tools.ssrf`` for the address rules):

* every hop (the URL, then each redirect) is checked and resolved before a connection is made;
  the request goes to the checked address with the original ``Host`` header and TLS server
  name (SNI; the certificate is verified against the host name), so a DNS answer cannot change
  between check and connect;
* at most ``max_redirects`` redirects, ``max_bytes`` body bytes (read as a stream and stopped
  there; gzip is decoded with the same bound) and ``timeout_s`` seconds in all (one deadline
  for resolution, connects, redirects and body, not a per-read timeout);
* no cookies, credentials or proxies from the environment; GET only.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import ssl
import zlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from resiliparse.extract.html2text import extract_plain_text
from resiliparse.parse.encoding import bytes_to_str, detect_encoding
from resiliparse.parse.html import HTMLTree

from planner.errors import ToolError
from planner.tools import ToolContext, ToolSpec
from worker.tools.ssrf import (
    IPAddress,
    Resolver,
    check_destination,
    normalize_domain,
    system_resolve,
)

__all__ = [
    "SCOPE",
    "URL_MAX_CHARS",
    "WebFetchConfig",
    "WebFetchError",
    "fetch",
    "web_tools",
]

SCOPE = "web"
URL_MAX_CHARS = 2048
USER_AGENT = "mana-ai-web-fetch/1 (an LLM agent's reader; GET only)"
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/xml",
        "application/rss+xml",
        "application/atom+xml",
        "application/javascript",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/csv",
    }
)
_HIDDEN = ["[hidden]", '[aria-hidden="true" i]']
"""CSS selectors of elements a reader does not see; their text is left out (and so are the
elements whose inline style hides them, whatever its spelling: ``_drop_styled_hidden``)."""
_HIDING_STYLES = ("display:none", "visibility:hidden", "visibility:collapse")
_TIMEOUT_MARGIN_S = 5.0
"""The tool's own timeout is the fetch deadline plus this, so the fetch's clearer message wins."""


class WebFetchError(ToolError):
    """A fetch failed or was refused; the message (shown to the model) says what happened."""


@dataclass(frozen=True)
class WebFetchConfig:
    """Limits and rules of ``web_fetch``; the composition root builds it from Settings.

    Attributes:
        allow_private: connect to non-public addresses (loopback, private, link-local...);
            metadata addresses stay refused. Default ``False``.
        allow_domains: when non-empty, only these domains (and their subdomains).
        deny_domains: never these domains (and their subdomains); wins over the allow-list.
        timeout_s: one deadline for the whole fetch, redirects included (default 20 s).
        max_bytes: body bytes read at most, after gzip decoding (default 2,000,000).
        max_chars: text characters returned at most (default 20,000, about 5,000 tokens).
        max_redirects: redirects followed at most (default 5).

    Raises:
        ValueError: a domain is not a host name, or a limit is out of range.
    """

    allow_private: bool = False
    allow_domains: tuple[str, ...] = ()
    deny_domains: tuple[str, ...] = ()
    timeout_s: float = 20.0
    max_bytes: int = 2_000_000
    max_chars: int = 20_000
    max_redirects: int = 5

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "allow_domains", tuple(normalize_domain(d) for d in self.allow_domains)
        )
        object.__setattr__(
            self, "deny_domains", tuple(normalize_domain(d) for d in self.deny_domains)
        )
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_bytes < 1 or self.max_chars < 1 or self.max_redirects < 0:
            raise ValueError("max_bytes and max_chars must be >= 1, max_redirects >= 0")


@dataclass(frozen=True)
class _Body:
    data: bytes
    truncated: bool


def web_tools(
    config: WebFetchConfig | None = None,
    *,
    resolve: Resolver = system_resolve,
    ssl_context: ssl.SSLContext | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[ToolSpec]:
    """The ``web_fetch`` tool under ``config`` (default ``WebFetchConfig()``).

    ``resolve`` (DNS), ``ssl_context`` (trusted CAs) and ``transport`` (instead of real
    connections) are seams for tests; by default the system resolver, the certifi CA bundle
    (httpx's default) and httpx's connection pool are used.
    """
    cfg = config or WebFetchConfig()

    async def web_fetch(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return await fetch(
            str(args["url"]), cfg, resolve=resolve, ssl_context=ssl_context, transport=transport
        )

    return [
        ToolSpec(
            name="web_fetch",
            description=(
                "Read a web page or text document (GET an http or https URL). Returns the "
                "HTTP status, the final URL after redirects, the content type, the page title "
                f"and its text (HTML reduced to readable text, at most {cfg.max_chars} "
                "characters; `truncated` is true when it was cut). Public addresses only; "
                "no logins, forms or JavaScript."
            ),
            input_schema={
                "type": "object",
                "properties": {
                    "url": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": URL_MAX_CHARS,
                        "description": "The http:// or https:// URL to read.",
                    }
                },
                "required": ["url"],
                "additionalProperties": False,
            },
            policy_hint="read",
            scope=SCOPE,
            handler=web_fetch,
            timeout_s=cfg.timeout_s + _TIMEOUT_MARGIN_S,
        )
    ]


async def fetch(
    url: str,
    config: WebFetchConfig,
    *,
    resolve: Resolver = system_resolve,
    ssl_context: ssl.SSLContext | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """GET ``url`` under ``config``'s rules and return the ``web_fetch`` answer (module
    docstring). ``ssl_context`` decides which certificates are trusted (default: httpx's, the
    certifi bundle); ``transport`` replaces the connections (a test seam; every check runs).

    Raises:
        URLRefusedError: the URL or a redirect is refused (scheme, credentials, host, address)
            or does not resolve.
        WebFetchError: too many redirects, an unreadable body (binary content type, unknown
            content encoding), no connection, or not done within ``config.timeout_s``.
    """
    try:
        target = httpx.URL(url.strip())
    except httpx.InvalidURL as exc:
        raise WebFetchError(f"not a valid URL: {url!r} ({exc})") from None
    try:
        async with asyncio.timeout(config.timeout_s):
            return await _fetch(target, config, resolve, ssl_context or _default_tls(), transport)
    except TimeoutError:
        raise WebFetchError(
            f"no complete answer from {target.host or url} within {config.timeout_s:g} s "
            "(the limit for one fetch, redirects included)"
        ) from None


async def _fetch(
    target: httpx.URL,
    config: WebFetchConfig,
    resolve: Resolver,
    ssl_context: ssl.SSLContext,
    transport: httpx.AsyncBaseTransport | None,
) -> dict[str, Any]:
    requested = str(target)
    current = target
    async with httpx.AsyncClient(
        transport=transport,
        verify=ssl_context,
        trust_env=False,  # no proxies or .netrc credentials from the environment
        follow_redirects=False,  # each hop is checked here
        timeout=httpx.Timeout(config.timeout_s),  # a backstop; the deadline is the caller's
        limits=httpx.Limits(max_keepalive_connections=0),  # no reuse across hops (SNI)
    ) as client:
        for hop in range(config.max_redirects + 1):
            addresses = await check_destination(
                current,
                allow_private=config.allow_private,
                allow_domains=config.allow_domains,
                deny_domains=config.deny_domains,
                resolve=resolve,
            )
            client.cookies.clear()
            async with _open(client, current, addresses) as response:
                location = response.headers.get("location")
                if response.status_code in _REDIRECTS and location:
                    try:
                        current = current.join(location.strip())
                    except httpx.InvalidURL as exc:
                        raise WebFetchError(
                            f"{current} redirects to an invalid URL: {exc}"
                        ) from None
                    continue
                body = await _read(response, config.max_bytes)
                return await _answer(requested, current, response, body, hop, config)
    raise WebFetchError(f"{requested} redirected more than {config.max_redirects} times")


@functools.cache
def _default_tls() -> ssl.SSLContext:
    """httpx's default client context (certifi CAs), built once: loading the bundle takes
    tens of milliseconds, too much for every fetch."""
    return httpx.create_ssl_context()


@asynccontextmanager
async def _open(
    client: httpx.AsyncClient, url: httpx.URL, addresses: Sequence[IPAddress]
) -> AsyncIterator[httpx.Response]:
    """GET ``url`` from the first of the checked ``addresses`` that accepts a connection, with
    the URL's own ``Host`` header and TLS server name (SNI, also the name the certificate is
    verified against); yields the response with its body not yet read."""
    headers = {
        "Host": url.netloc.decode("ascii"),
        "User-Agent": USER_AGENT,
        "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
        "Accept-Encoding": "gzip",
    }
    sni = url.raw_host.decode("ascii")  # the A-label of an international name
    extensions = {"sni_hostname": sni} if url.scheme == "https" else {}
    error: httpx.ConnectError | None = None
    for ip in addresses:
        request = client.build_request(
            "GET", url.copy_with(host=str(ip)), headers=headers, extensions=extensions
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.ConnectError as exc:  # refused or unreachable: try the next address
            error = exc
            continue
        except httpx.HTTPError as exc:
            raise WebFetchError(f"{url.host}: {_transport_failure(exc)}") from None
        try:
            yield response
        finally:
            await response.aclose()
        return
    raise WebFetchError(f"could not connect to {url.host}: {error}")


def _transport_failure(exc: httpx.HTTPError) -> str:
    """What an httpx failure means, in the words the model reads (no class names)."""
    said = str(exc).strip()
    detail = f" ({said})" if said else ""
    if isinstance(exc, httpx.TimeoutException):
        return f"it did not answer in time{detail}"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"its answer broke the HTTP protocol{detail}"
    if isinstance(exc, httpx.NetworkError):
        return f"the connection failed{detail}"
    return said or "the request failed"


async def _read(response: httpx.Response, max_bytes: int) -> _Body:
    """The body, decoded from gzip if sent so, reading no more than ``max_bytes`` of it."""
    coding = response.headers.get("content-encoding", "identity").strip().lower()
    if coding in ("", "identity"):
        decoder = None
    elif coding in ("gzip", "x-gzip", "deflate"):
        decoder = zlib.decompressobj(wbits=47)  # gzip or zlib header, detected
    else:
        raise WebFetchError(f"unsupported Content-Encoding {coding!r} (web_fetch asks for gzip)")
    chunks: list[bytes] = []
    room = max_bytes
    try:
        async for raw in response.aiter_raw():
            pending = raw
            while pending:
                if decoder is None:
                    data, pending = pending, b""
                else:  # bounded: a small compressed chunk cannot inflate past the cap
                    data = decoder.decompress(pending, room + 1)
                    pending = decoder.unconsumed_tail
                if len(data) > room:
                    chunks.append(data[:room])
                    return _Body(b"".join(chunks), truncated=True)
                chunks.append(data)
                room -= len(data)
        if decoder is not None:
            rest = decoder.flush()
            if len(rest) > room:
                chunks.append(rest[:room])
                return _Body(b"".join(chunks), truncated=True)
            chunks.append(rest)
    except zlib.error as exc:
        raise WebFetchError(f"could not decode the {coding} body: {exc}") from None
    except httpx.HTTPError as exc:
        raise WebFetchError(f"reading the body failed: {_transport_failure(exc)}") from None
    return _Body(b"".join(chunks), truncated=False)


async def _answer(
    requested: str,
    final: httpx.URL,
    response: httpx.Response,
    body: _Body,
    redirects: int,
    config: WebFetchConfig,
) -> dict[str, Any]:
    header = response.headers.get("content-type", "")
    mime, _, params = header.partition(";")
    mime = mime.strip().lower()
    charset = _charset(params)
    html = mime in _HTML_TYPES or (not mime and _looks_like_html(body.data))
    if not html and not _is_text(mime) and body.data:
        raise WebFetchError(
            f"{final} is {mime or 'of unknown type'}, not text: web_fetch reads HTML and text "
            f"only (status {response.status_code})"
        )
    # HTML parsing is CPU work (tens of ms for a large page): keep it off the event loop.
    title, text = await asyncio.to_thread(_to_text, body.data, charset, html)
    return {
        "url": requested,
        "final_url": str(final),
        "status": response.status_code,
        "content_type": mime or None,
        "title": title,
        "text": text[: config.max_chars],
        "truncated": body.truncated or len(text) > config.max_chars,
        "redirects": redirects,
    }


def _to_text(data: bytes, charset: str | None, html: bool) -> tuple[str | None, str]:
    encoding = charset or detect_encoding(data, from_html_meta=html) or "utf-8"
    decoded = bytes_to_str(data, encoding, errors="replace")
    if not html:
        return None, decoded
    tree = HTMLTree.parse(decoded)
    _drop_styled_hidden(tree)
    title = (tree.title or "").strip() or None
    text = extract_plain_text(
        tree,
        preserve_formatting=True,
        main_content=False,  # its heuristics drop lists and tables that may be the answer
        list_bullets=True,
        alt_texts=False,
        links=False,
        skip_elements=_HIDDEN,
    )
    return title, text.strip()


def _drop_styled_hidden(tree: HTMLTree) -> None:
    """Remove the elements whose inline style hides them, matched after lower-casing and
    removing whitespace (``DISPLAY : None`` counts): hidden text is a classic place for
    instructions aimed at a model, not at the reader."""
    root = tree.document
    if root is None:
        return
    # in reverse document order, so a hidden element inside another is removed before its
    # ancestor (never touched after the ancestor, and its memory, are gone)
    for node in reversed(list(root.query_selector_all("[style]"))):
        style = "".join((node.getattr("style") or "").lower().split())
        if any(hiding in style for hiding in _HIDING_STYLES):
            node.decompose()


def _charset(params: str) -> str | None:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            name = value.strip().strip("\"'")
            try:
                return codecs.lookup(name).name
            except LookupError:
                return None
    return None


def _is_text(mime: str) -> bool:
    return mime.startswith("text/") or mime in _TEXT_TYPES or mime.endswith(("+json", "+xml"))


def _looks_like_html(data: bytes) -> bool:
    start = data[:512].lstrip().lower()
    return start.startswith((b"<!doctype html", b"<html"))
