"""``worker.database_url`` reads a URL as SQLAlchemy does (``make_url``, ``render_as_string``,
the asyncpg dialect's ``create_connect_args``) without loading SQLAlchemy: checked here against
SQLAlchemy itself, on hand-picked URLs and on generated ones."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from worker.database_url import DatabaseUrl, asyncpg_keywords, parse_url, redact_url, to_async_url

URLS = [
    "postgresql://u:p@h:5432/db",
    "postgres://u@h/db",
    "postgresql+asyncpg://h/db?ssl=require",
    "postgresql://u:p%40ss%2Fw%3Ard@h/db",
    "postgresql://u:pa ss+x@h/d b+c/e",
    "postgresql://us%20er:@h:1/",
    "postgresql://@h/db",
    "postgresql://h",
    "postgresql://",
    "postgresql:///db?host=/tmp/sock",
    "postgresql://u:p@h:5433/db?host=/var/run/postgresql",
    "postgresql://u@/db?host=",
    "postgresql://[::1]:5433/db",
    "postgresql://[fe80::1%25eth0]/db",
    "postgresql://u:p@h:/db",
    "postgresql://u:p@h:abc/db",
    "postgresql://u:p@h:0/db",
    "postgresql://u:p@h:-1/db",
    "postgresql://u:p@h:99999/db",
    "postgresql://h/db?sslmode=require&target_session_attrs=read-write",
    "postgresql://h/db?ssl=a&ssl=b&sslmode=",
    "postgresql://h/db?host=a:1&host=b:2",
    "postgresql://h/db?host=a,b&port=1,2",
    "postgresql://h/db?password=se%26cret&user=x",
    "postgresql://u:p@h/db?application_name=x",
    "mysql://u:p@h/db",
    "not a url",
    "postgresql:/h/db",
    "postgresql://u:p@[::1/db",
    "postgresql://ü:ß@höst/dæ",
    "postgresql://u:p@h:\uff15/db",  # a full-width digit: int() takes it
]


def sqlalchemy_parts(text: str) -> DatabaseUrl | None:
    """SQLAlchemy's reading of ``text`` in ``DatabaseUrl``'s shape; None where it refuses."""
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        return None
    return DatabaseUrl(
        drivername=url.drivername,
        username=url.username,
        password=url.password,
        host=url.host,
        port=url.port,
        database=url.database,
        query=dict(url.query),
    )


def ours(text: str) -> DatabaseUrl | None:
    try:
        return parse_url(text)
    except ValueError:
        return None


def dialect_keywords(text: str) -> dict[str, Any] | None:
    try:
        return PGDialect_asyncpg().create_connect_args(make_url(text))[1]
    except (ArgumentError, ValueError):
        return None


def check_same(text: str) -> None:
    expected = sqlalchemy_parts(text)
    assert ours(text) == expected
    if expected is None:
        return
    for hide in (True, False):
        assert parse_url(text).render(hide_password=hide) == make_url(text).render_as_string(
            hide_password=hide
        )
    keywords = asyncpg_keywords(text)
    if keywords is not None:  # None: hosts or ports in the query, or a parameter given twice
        assert keywords == dialect_keywords(text)
    else:
        host = expected.query.get("host")
        assert (
            "port" in expected.query
            or (isinstance(host, str) and ("," in host or ":" in host))
            or any(not isinstance(v, str) for v in expected.query.values())
        )


@pytest.mark.parametrize("text", URLS)
def test_read_as_sqlalchemy_reads_it(text: str) -> None:
    check_same(text)


URL_CHARS = st.sampled_from([*"uph0159:/@?&=%[]+- .,_ü", "%40", "%2F", "%3A", "%20"])


@settings(max_examples=300, deadline=None)
@given(
    scheme=st.sampled_from(["postgresql", "postgres", "postgresql+asyncpg", "pg_x"]),
    rest=st.lists(URL_CHARS, max_size=30).map("".join),
)
def test_generated_urls_are_read_as_sqlalchemy_reads_them(scheme: str, rest: str) -> None:
    check_same(f"{scheme}://{rest}")


@pytest.mark.parametrize(
    ("given", "normalised"),
    [
        (
            "postgres://u:p%40ss@h/db?sslmode=require",
            "postgresql+asyncpg://u:p%40ss@h/db?ssl=require",
        ),
        ("postgresql://h/db?sslmode=disable&ssl=require", "postgresql+asyncpg://h/db?ssl=require"),
    ],
)
def test_normalised_urls_render_as_before(given: str, normalised: str) -> None:
    assert to_async_url(given) == normalised
    assert redact_url(given) == make_url(given).render_as_string(hide_password=True)


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("postgresql://u:hunter2@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u@h/db?password=hunter2", "postgresql://u@h/db?password=***"),
        (
            "postgresql://u:a@h/db?ssl=require&password=hunter2&password=x",
            "postgresql://u:***@h/db?password=***&ssl=require",
        ),
    ],
)
def test_no_password_is_shown_wherever_the_url_gives_it(given: str, shown: str) -> None:
    assert redact_url(given) == shown
    assert "hunter2" not in redact_url(to_async_url(given))
