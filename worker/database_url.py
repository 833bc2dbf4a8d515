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


def to_async_url(url: str) -> str:
    """Normalise a PostgreSQL URL to ``postgresql+asyncpg://…``.

    Accepts ``postgresql://``, ``postgres://`` and ``postgresql+asyncpg://``. A libpq
    ``sslmode=…`` query parameter (which asyncpg does not know) becomes asyncpg's ``ssl=…``
    (same values: disable, allow, prefer, require, verify-ca, verify-full). Everything else
    (credentials, host, port, database, other parameters) is kept as is.

    Raises:
        ValueError: the text is not a URL (a port that is no number from 1 to 65535, a
            bracket left open, a control character), or its scheme is not one of the three
            above. The message never contains the password.
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
    parsed = parsed.set(drivername="postgresql+asyncpg")
    if "sslmode" in parsed.query:
        sslmode = parsed.query["sslmode"]
        parsed = parsed.difference_update_query(["sslmode"])
        if "ssl" not in parsed.query:
            parsed = parsed.update_query_dict({"ssl": sslmode})
    return parsed.render_as_string(hide_password=False)


def redact_url(url: str) -> str:
    """``url`` with the password replaced by ``***``, for logs and error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(unparseable URL)"
