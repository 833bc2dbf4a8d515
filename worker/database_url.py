"""PostgreSQL URLs as an operator gives them: normalised for the asyncpg driver, and shown
without their password. Plain functions of the text (SQLAlchemy's URL parser), below
everything: the settings check ``MANA_AI_DATABASE_URL`` with them before any engine exists.
"""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from worker.terminal_text import describe_char

__all__ = ["redact_url", "to_async_url"]

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
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: SQLAlchemy's int() of a bad port
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
    parsed = parsed.set(drivername="postgresql+asyncpg")
    if "sslmode" in parsed.query:
        sslmode = parsed.query["sslmode"]
        parsed = parsed.difference_update_query(["sslmode"])
        if "ssl" not in parsed.query:
            parsed = parsed.update_query_dict({"ssl": sslmode})
    return parsed.render_as_string(hide_password=False)


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
    """``url`` with the password replaced by ``***``, for logs and error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(unparseable URL)"
