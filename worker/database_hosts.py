"""Several hosts in one PostgreSQL URL, as libpq reads them, in the one form SQLAlchemy's
asyncpg dialect opens.

libpq takes a list of hosts two ways (the PostgreSQL manual, "Connection URIs" and "Specifying
Multiple Hosts"): in the authority, ``postgresql://u@h1:5432,h2:5433/db``, or as query
parameters, ``?host=h1,h2&port=5432,5433`` (``port`` one port for every host, or one per host;
an empty one is 5432). SQLAlchemy's URL grammar reads the first as a host ``h1`` with the port
``5432,h2:5433``, and its asyncpg dialect opens a list only with one port per host
(``?host=h1:p1&host=h2:p2``, or ``host=h1,h2&port=p1,p2``). So a URL that names several hosts
is rewritten to ``?host=h1,h2&port=p1,p2`` with every port spelled out; asyncpg tries the hosts
in order and keeps the first that accepts the connection and matches the URL's
``target_session_attrs`` (``read-write``: the primary).

Plain functions of the text, below the settings (``worker.database_url`` uses them).
"""

from __future__ import annotations

import re
from urllib.parse import quote_plus

__all__ = ["DEFAULT_PORT", "host_list", "lift_authority_hosts"]

DEFAULT_PORT = 5432
"""PostgreSQL's port, for a host of a list that gives none (as libpq and asyncpg default)."""

_AUTHORITY = re.compile(
    r"""
        (?P<head>[\w\+]+://(?:[^:/]*(?::[^@]*)?@)?)  # scheme, user info (as SQLAlchemy)
        (?P<hosts>[^/\?]*)
        (?P<tail>.*)
    """,
    re.X | re.S,
)

_HOST_PORT = re.compile(r"(?:\[(?P<v6>[^\]]*)\]|(?P<name>[^:\[\]]*))(?::(?P<port>[^:]*))?")


def lift_authority_hosts(text: str) -> str:
    """``text`` with a list of hosts in its authority (``u@h1:5432,h2/db``) moved into its
    query (``u@/db?host=h1,h2&port=5432,5432``); any other URL as it is.

    A host without a port gets 5432 (``DEFAULT_PORT``); an IPv6 address is written in
    brackets (``[::1]:5432``).

    Raises:
        ValueError: a host of the list is empty, a port is not a number from 1 to 65535, or
            the query names hosts too (``?host=``/``?port=``: give them one way).
    """
    match = _AUTHORITY.fullmatch(text)
    if match is None or "," not in match["hosts"]:
        return text
    hosts = [
        (host, _port(port, empty_is_default=False))
        for host, port in (
            _host_and_port(i, text=match["hosts"], bare_ipv6=False)
            for i in match["hosts"].split(",")
        )
    ]
    tail = match["tail"]
    query = tail.partition("?")[2]
    if re.search(r"(?:^|&)(?:host|port)=", query):
        raise ValueError(
            "names hosts both before the database and in its query (?host=, ?port=); "
            "give them one way"
        )
    lifted = "host=" + ",".join(quote_plus(h) for h, _ in hosts)
    lifted += "&port=" + ",".join(str(p) for _, p in hosts)
    joiner = ("&" if query else "") if "?" in tail else "?"
    return match["head"] + tail + joiner + lifted


def _host_and_port(item: str, *, text: str, bare_ipv6: bool = True) -> tuple[str, str | None]:
    """``item``'s host and port (``None``: none given); an IPv6 address without brackets
    (``::1``, allowed in a query's list: ``bare_ipv6``) has none."""
    if bare_ipv6 and item.count(":") > 1 and not item.startswith("["):
        return item, None
    match = _HOST_PORT.fullmatch(item)
    host = None if match is None else (match["v6"] or match["name"])
    if match is None or not host:
        raise ValueError(
            f"has an empty or malformed host in its list of hosts ({text!r}); write "
            "host1:port1,host2:port2 (an IPv6 address in brackets)"
        )
    return host, match["port"]


def host_list(
    host: str | tuple[str, ...] | None, port: str | tuple[str, ...] | None
) -> tuple[tuple[str, int], ...] | None:
    """The hosts and ports that a URL's ``host`` and ``port`` query parameters name, in order,
    when they name two hosts or more; ``None`` for one host or none (the dialect reads that:
    a socket directory, or a host with its port).

    ``host`` is ``h1,h2`` or given once per host (``host=h1:5432&host=h2:5433``, a port after
    a name or a bracketed IPv6 address); ``port`` is one port for every host or one per host
    (``5432,5433``), an empty one 5432 (``DEFAULT_PORT``).

    Raises:
        ValueError: a host is empty, a port is not a number from 1 to 65535, the ports are
            neither one nor one per host, or they are given both after the hosts and in
            ``port``.
    """
    items = _items(host)
    if len(items) < 2:
        return None
    pairs = [_host_and_port(item, text=",".join(items)) for item in items]
    ports = _items(port)
    if not ports:
        return tuple((h, _port(p)) for h, p in pairs)
    if any(p is not None for _, p in pairs):
        raise ValueError("gives the hosts' ports both after the hosts and in ?port=; give one")
    if len(ports) not in (1, len(items)):
        raise ValueError(
            f"names {len(items)} hosts but {len(ports)} ports; give one port for every host, "
            "or one per host"
        )
    numbers = [_port(p or None) for p in ports] * (len(items) if len(ports) == 1 else 1)
    return tuple((h, n) for (h, _), n in zip(pairs, numbers, strict=True))


def _items(value: str | tuple[str, ...] | None) -> list[str]:
    if value is None:
        return []
    return [
        part for one in ((value,) if isinstance(value, str) else value) for part in one.split(",")
    ]


def _port(text: str | None, *, empty_is_default: bool = True) -> int:
    if text is None or (text == "" and empty_is_default):
        return DEFAULT_PORT
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise ValueError(
            f"has an invalid port ({text!r}) in its list of hosts; a port is 1 to 65535"
        )
    return int(text)
