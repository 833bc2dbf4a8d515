"""The http(s) URLs an operator gives (LLM endpoints, agents' MCP servers): whether one can be
used, said before anything connects, and how it is shown without its secrets.

``http_url_problem`` judges a URL with the standard library only (``urllib.parse``,
``ipaddress``; the HTTP clients are not imported, so a command's start stays fast), by the
rules of RFC 3986 that the HTTP clients (httpx, aiohttp) enforce when they first use it:

* scheme ``http`` or ``https`` (any case);
* no whitespace and no hidden character (``worker.terminal_text.is_hidden``: a control, a
  bidi or zero-width character) anywhere: what a URL needs of them is percent-encoded
  (``%20``);
* a host: a name whose characters a host may have (RFC 3986 ``reg-name``: letters, digits,
  ``-._~``, ``%``-escapes and the sub-delimiters; a non-ASCII name must encode as IDNA, as must
  an ``xn--`` label decode), an IPv4 address when it is all digits and dots, or an IPv6
  address in brackets (a zone ``%eth0`` allowed);
* a port, when given, of 1 to 65535.

``redact_url`` shows a URL with its password and the values of its query as ``***``.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from worker.terminal_text import describe_char, is_hidden

__all__ = ["http_url_problem", "normalize_domain", "redact_url"]

_REG_NAME = re.compile(r"^(?:[A-Za-z0-9\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})+$")
"""RFC 3986 §3.2.2 ``reg-name`` (unreserved, pct-encoded, sub-delims), non-empty."""
_DOTTED_DIGITS = re.compile(r"^[0-9.]+$")


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is no usable http(s) URL (see the module docstring), or ``None`` when it is.

    The reason names the offending part (the character and its position, the port, the
    host) without echoing the URL, which may hold a password."""
    for position, char in enumerate(url, start=1):
        if char.isspace() or is_hidden(char):
            what = "whitespace" if char.isspace() and not is_hidden(char) else "a hidden character"
            escape = "".join(f"%{b:02X}" for b in char.encode("utf-8"))
            return (
                f"must not contain {what} ({describe_char(char)} at position {position}); "
                f"percent-encode it ({escape}) where it belongs, or remove it"
            )
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL": a bracket left open
        return f"is not a URL ({exc})"
    if parts.scheme.lower() not in ("http", "https"):
        return "must be an http:// or https:// URL"
    host = parts.netloc.rpartition("@")[2]
    if host.startswith("["):
        end = host.find("]")
        problem = _ipv6_problem(host[1:end]) if end > 0 else "a bracket left open"
        if problem is not None:
            return f"has an invalid IPv6 host ({problem})"
    else:
        host = host.partition(":")[0]
        if not host:
            return "has no host (e.g. http://localhost:8000/v1)"
        problem = _host_problem(host)
        if problem is not None:
            return f"has an invalid host ({problem})"
    try:
        port = parts.port
    except ValueError as exc:
        return f"has an invalid port ({exc}); a port is 1 to 65535"
    if port == 0:
        return "has an invalid port (0); a port is 1 to 65535"
    return None


def _ipv6_problem(text: str) -> str | None:
    address = text.partition("%")[0]  # a zone (fe80::1%eth0) names an interface
    try:
        ipaddress.IPv6Address(address)
    except ValueError as exc:
        return str(exc)
    return None


def _host_problem(host: str) -> str | None:
    if _DOTTED_DIGITS.match(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError as exc:
            return str(exc)
        return None
    if not host.isascii():
        try:
            host.encode("idna")
        except UnicodeError:
            return "a name that does not encode as IDNA"
        return None
    if not _REG_NAME.match(host):
        bad = next(c for c in host if not _REG_NAME.match(c))
        return f"{bad!r} is not a character of a host name"
    for label in host.split("."):
        if label.lower().startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                return f"the label {label!r} is not valid IDNA (punycode)"
    return None


def redact_url(url: str) -> str:
    """``url`` fit for logs and output: a password in it and the values of its query replaced
    by ``***`` (a user name stays), also when it does not parse."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, host = netloc.rpartition("@")
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"
        query = urlencode(
            [(k, "***") for k, _ in parse_qsl(parts.query, keep_blank_values=True)], safe="*"
        )
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    except ValueError:  # the same, by its text: ``//user:password@`` and ``?query``
        url = _PASSWORD.sub(r"\1***@", url, count=1)
        return url.partition("?")[0] + ("?***" if "?" in url else "")


_PASSWORD = re.compile(r"(//[^/?#@:]*:)[^/?#]*@")


def normalize_domain(text: str) -> str:
    """A domain as the host check compares it: lower-case ASCII (IDNA), no trailing dot, no
    leading ``*.`` or ``.`` (a listed domain covers its subdomains anyway).

    Raises:
        ValueError: ``text`` is not a host name (empty, a URL, a path, a port...).
    """
    name = text.strip().lower().removeprefix("*.").removeprefix(".").rstrip(".")
    if "*" in name:
        raise ValueError(
            f"{text!r}: wildcards are not supported; a domain covers its subdomains, and an "
            "empty allow-list allows every public domain"
        )
    if not name or any(c in name for c in "/:@?#[] "):
        raise ValueError(f"not a domain name: {text!r}")
    import httpx  # here, not at import: the settings check domains, and a command's start is fast

    try:
        host = httpx.URL(f"http://{name}/").raw_host.decode("ascii")
    except (httpx.InvalidURL, UnicodeError) as exc:
        raise ValueError(f"not a domain name: {text!r} ({exc})") from None
    return host.rstrip(".")
