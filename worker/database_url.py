"""PostgreSQL URLs as an operator gives them: normalised for the asyncpg driver, shown
without their password, and turned into asyncpg's ``connect`` keywords. Plain functions of
the text, below everything: the settings check ``MANA_AI_DATABASE_URL`` with them before any
engine exists.

The URL is read as SQLAlchemy reads it (``sqlalchemy.engine.make_url``: its grammar, its
percent-decoding, its rendering), so that the engine opened on the normalised text sees the
same URL, without loading SQLAlchemy (a tenth of a second) for a command that only needs the
settings or one asyncpg connection; ``tests/unit/test_database_url.py`` holds the two readings
equal.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, quote, quote_plus, unquote

from worker.database_hosts import host_list, lift_authority_hosts
from worker.terminal_text import describe_char

__all__ = ["DatabaseUrl", "asyncpg_keywords", "parse_url", "redact_url", "to_async_url"]


class DatabaseUrl(NamedTuple):
    """A database URL's parts, as ``sqlalchemy.engine.URL`` holds them: ``username``,
    ``password`` and ``database`` percent-decoded; ``query`` each parameter's value, or the
    tuple of its values when it is given more than once (parameters with an empty value
    left out)."""

    drivername: str
    username: str | None
    password: str | None
    host: str | None
    port: int | None
    database: str | None
    query: dict[str, str | tuple[str, ...]]

    def render(self, *, hide_password: bool) -> str:
        """The URL as text (``URL.render_as_string``): parts percent-encoded, query
        parameters sorted by name; the password as ``***`` when ``hide_password``."""
        text = self.drivername + "://"
        if self.username is not None:
            text += quote(self.username, safe=" +")
            if self.password is not None:
                text += ":" + ("***" if hide_password else quote(self.password, safe=" +"))
            text += "@"
        if self.host is not None:
            text += f"[{self.host}]" if ":" in self.host else self.host
        if self.port is not None:
            text += ":" + str(self.port)
        if self.database is not None:
            text += "/" + quote(self.database, safe=" +/")
        if self.query:
            text += "?" + "&".join(
                f"{quote_plus(key)}={quote_plus(value)}"
                for key in sorted(self.query)
                for value in _values(self.query[key])
            )
        return text


_URL = re.compile(
    r"""
        (?P<name>[\w\+]+)://
        (?:
            (?P<username>[^:/]*)
            (?::(?P<password>[^@]*))?
        @)?
        (?:
            (?:
                \[(?P<ipv6host>[^/\?]+)\] |
                (?P<ipv4host>[^/:\?]+)
            )?
            (?::(?P<port>[^/\?]*))?
        )?
        (?:/(?P<database>[^\?]*))?
        (?:\?(?P<query>.*))?
    """,
    re.X,
)
"""SQLAlchemy's URL grammar (as its own URL parser reads a URL)."""


def parse_url(text: str) -> DatabaseUrl:
    """``text``'s parts, as ``sqlalchemy.engine.make_url`` reads them.

    Raises:
        ValueError: ``text`` is not a URL by that grammar, or its port is not an integer.
    """
    match = _URL.match(text)
    if match is None:
        raise ValueError("Could not parse SQLAlchemy URL from given URL string")
    parts = match.groupdict()
    query: dict[str, str | tuple[str, ...]] = {}
    for key, value in parse_qsl(parts["query"] or ""):
        query[key] = (*_values(query[key]), value) if key in query else value
    username, password, database = (
        None if parts[name] is None else unquote(parts[name])
        for name in ("username", "password", "database")
    )
    return DatabaseUrl(
        drivername=parts["name"],
        username=username,
        password=password,
        host=parts["ipv4host"] or parts["ipv6host"],
        port=None if parts["port"] is None else int(parts["port"]),  # "" fails, as there
        database=database,
        query=query,
    )


def _values(value: str | tuple[str, ...]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else value


_SCHEMES = {"postgresql", "postgres", "postgresql+asyncpg"}
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_QUERY_VALUES: dict[str, tuple[str, ...] | None] = {
    "ssl": _SSL_MODES,
    "sslmode": _SSL_MODES,
    "target_session_attrs": (
        "any",
        "primary",
        "standby",
        "prefer-standby",
        "read-write",
        "read-only",
    ),
    "host": None,  # a socket directory, or hosts of a multi-host URL
    "port": None,
    "user": None,
    "password": None,
    "passfile": None,
    "database": None,
}
"""The query parameters the driver takes from a URL (asyncpg's ``connect`` keywords that are
strings; SQLAlchemy passes every parameter to it as a keyword), with their allowed values
(``None``: any). Any other parameter would reach the driver as an unknown keyword and fail
every connection, so it is refused when the settings are read."""


def to_async_url(url: str) -> str:
    """Normalise a PostgreSQL URL to ``postgresql+asyncpg://…``.

    Accepts ``postgresql://``, ``postgres://`` and ``postgresql+asyncpg://``. A libpq
    ``sslmode=…`` query parameter (which asyncpg does not know) becomes asyncpg's ``ssl=…``
    (same values: disable, allow, prefer, require, verify-ca, verify-full). Everything else
    (credentials, host, port, database, other parameters) is kept as is.

    Several hosts, in any form libpq reads (``u@h1:5432,h2:5433/db``, ``?host=h1,h2&port=5432``,
    also ``?host=h1:5432&host=h2:5433``), become ``u@/db?host=h1,h2&port=5432,5433``, every
    port spelled out (``worker.database_hosts``), the form SQLAlchemy's asyncpg dialect opens;
    with ``target_session_attrs=read-write`` (or ``primary``) asyncpg connects to the first
    host that accepts writes.

    Query parameters other than ``_QUERY_VALUES``' (libpq's ``application_name`` and
    ``connect_timeout`` among them: mana-ai sets the first itself, and
    ``MANA_AI_DB_STATEMENT_TIMEOUT_S`` bounds waits) are refused, as are values those
    parameters do not take.

    Raises:
        ValueError: the text is not a URL (a port that is no number from 1 to 65535, a
            bracket left open, a control character), its scheme is not one of the three
            above, or a query parameter or its value is not one the driver takes. The
            message never contains the password.
    """
    url = url.strip()
    hidden = next((c for c in url if not c.isprintable()), None)
    if hidden is not None:
        raise ValueError(
            f"must not contain control or invisible characters ({describe_char(hidden)} at "
            f"position {url.index(hidden) + 1}); percent-encode it"
        )
    url = lift_authority_hosts(url)
    try:
        parsed = parse_url(url)
    except ValueError:  # not a URL, or int() of a bad port
        raise ValueError(
            "not a database URL; expected postgresql://user:password@host:port/database"
        ) from None
    if parsed.drivername not in _SCHEMES:
        raise ValueError(
            f"unsupported scheme {parsed.drivername + '://'!r}; "
            "use postgresql://, postgres:// or postgresql+asyncpg://"
        )
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise ValueError(f"has an invalid port ({parsed.port}); a port is 1 to 65535")
    for name, value in parsed.query.items():
        _check_query_parameter(name, value)
    query = dict(parsed.query)
    if "sslmode" in query:
        sslmode = query.pop("sslmode")
        query.setdefault("ssl", sslmode)
    query |= _host_list_query(parsed)
    return parsed._replace(drivername="postgresql+asyncpg", query=query).render(hide_password=False)


def _host_list_query(parsed: DatabaseUrl) -> dict[str, str]:
    """``host`` and ``port`` query parameters with every host and its port, for a URL whose
    query names several hosts (``worker.database_hosts.host_list``); none for another."""
    hosts = host_list(parsed.query.get("host"), parsed.query.get("port"))
    if hosts is None:
        return {}
    if parsed.host is not None or parsed.port is not None:
        raise ValueError(
            "names a host both before the database and in its query (?host=); give the "
            "hosts one way"
        )
    return {
        "host": ",".join(host for host, _ in hosts),
        "port": ",".join(str(port) for _, port in hosts),
    }


def _check_query_parameter(name: str, value: str | tuple[str, ...]) -> None:
    if name not in _QUERY_VALUES:
        raise ValueError(
            f"has a query parameter the driver does not take ({name!r}); supported: "
            f"{', '.join(sorted(_QUERY_VALUES))} (mana-ai sets application_name itself, and "
            "MANA_AI_DB_STATEMENT_TIMEOUT_S bounds how long a statement waits)"
        )
    allowed = _QUERY_VALUES[name]
    values = (value,) if isinstance(value, str) else value
    if name == "password":
        return  # never echoed
    for one in values:
        if allowed is not None and one not in allowed:
            raise ValueError(f"has {name}={one!r}, which is not one of {', '.join(allowed)}")


def redact_url(url: str) -> str:
    """``url`` with the password replaced by ``***``, for logs and error messages: the one
    before the host and a ``password`` query parameter (the driver takes either). A list of
    hosts before the database is shown in the query, as ``to_async_url`` moves it."""
    try:
        parsed = parse_url(lift_authority_hosts(url))
    except ValueError:
        return _masked(url)
    if "password" not in parsed.query:
        return parsed.render(hide_password=True)
    shown = parsed._replace(query={**parsed.query, "password": "***"}).render(hide_password=True)
    return shown.replace("password=%2A%2A%2A", "password=***", 1)


_USER_INFO_PASSWORD = re.compile(r"^([\w+]+://[^:/@]*:).*@")  # to the last @: more, not less
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*")


def _masked(url: str) -> str:
    """A URL that does not parse, with what may be its password (after ``user:``, in a
    ``password=`` parameter) as ``***``; ``(unparseable URL)`` when it has control
    characters."""
    if not url.isprintable():
        return "(unparseable URL)"
    return _QUERY_PASSWORD.sub(r"\1***", _USER_INFO_PASSWORD.sub(r"\1***@", url))


def asyncpg_keywords(url: str) -> dict[str, Any] | None:
    """The keywords of ``asyncpg.connect`` for ``url`` (a URL ``to_async_url`` returned),
    as SQLAlchemy's asyncpg dialect makes them (``create_connect_args``): ``host``,
    ``port``, ``user``, ``password`` and ``database`` where the URL gives them (an empty one
    left out), then every query parameter (``ssl=require``) as a keyword.

    One host in the query (``?host=/var/run/postgresql``: a socket directory) replaces the
    URL's, as the dialect does. ``None`` for a URL whose query names several hosts, a host with
    its port, or ports (``?host=a,b&port=1,2``, ``?host=a:1``), which only the engine's
    dialect splits; such a URL is opened by the engine.

    Raises:
        ValueError: ``url`` is not a URL (see ``parse_url``).
    """
    parsed = parse_url(url)
    host = parsed.query.get("host")
    if "port" in parsed.query or (
        host is not None and (not isinstance(host, str) or "," in host or ":" in host)
    ):
        return None
    parts = {
        "host": parsed.host,
        "database": parsed.database,
        "user": parsed.username,
        "password": parsed.password,
        "port": parsed.port,
    }
    keywords: dict[str, Any] = {key: value for key, value in parts.items() if value}
    for key, value in parsed.query.items():
        if not isinstance(value, str):
            return None  # a parameter given twice: the engine's to refuse
        keywords[key] = value
    return keywords
