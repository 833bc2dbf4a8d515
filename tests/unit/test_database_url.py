"""``worker.database_url`` reads a URL as SQLAlchemy does (``make_url``, ``render_as_string``,
the asyncpg dialect's ``create_connect_args``) without loading SQLAlchemy: checked here against
SQLAlchemy itself, on hand-picked URLs and on generated ones."""

from __future__ import annotations

import re
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


HA = "target_session_attrs=read-write"


@pytest.mark.parametrize(
    ("given", "hosts", "ports"),
    [
        (f"postgresql://u:pw@h1:5432,h2:5433/db?{HA}", ["h1", "h2"], [5432, 5433]),
        ("postgresql://u@h1,h2,h3/db", ["h1", "h2", "h3"], [5432, 5432, 5432]),
        ("postgresql://u@h1:6000,h2/db", ["h1", "h2"], [6000, 5432]),
        ("postgresql://u@[::1]:5433,[fe80::2]/db", ["::1", "fe80::2"], [5433, 5432]),
        (f"postgres://u@h1:1,h2:2?{HA}", ["h1", "h2"], [1, 2]),
        (f"postgresql://u@/db?host=h1,h2&port=5432,5433&{HA}", ["h1", "h2"], [5432, 5433]),
        ("postgresql://u@/db?host=h1,h2&port=5433", ["h1", "h2"], [5433, 5433]),
        ("postgresql://u@/db?host=h1,h2&port=,5433", ["h1", "h2"], [5432, 5433]),
        ("postgresql://u@/db?host=h1,h2", ["h1", "h2"], [5432, 5432]),
        ("postgresql://u@/db?host=h1:1&host=h2:2", ["h1", "h2"], [1, 2]),
        ("postgresql://u@/db?host=h1:1,h2", ["h1", "h2"], [1, 5432]),
        ("postgresql://u@/db?host=::1,::2&port=1,2", ["::1", "::2"], [1, 2]),
        ("postgresql://u@/db?host=/run/pg,h2&port=5432,5433", ["/run/pg", "h2"], [5432, 5433]),
    ],
)
def test_every_multi_host_form_reaches_asyncpg_as_a_list(
    given: str, hosts: list[str], ports: list[int]
) -> None:
    """libpq's forms of several hosts (and SQLAlchemy's ``host=h:p&host=…``) become the one
    the asyncpg dialect opens: a host list and a port per host, other parameters kept."""
    normalised = to_async_url(given)
    keywords = dialect_keywords(normalised)
    assert keywords is not None
    assert (keywords["host"], keywords["port"]) == (hosts, ports)
    assert keywords.get("target_session_attrs") == ("read-write" if HA in given else None)
    assert keywords["user"] == "u"
    assert to_async_url(normalised) == normalised  # settled: normalising again changes nothing


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("postgresql://u@h1:x,h2/db", "invalid port ('x') in its list of hosts"),
        ("postgresql://u@h1,h2:99999/db", "invalid port ('99999')"),
        ("postgresql://u@h1,h2:0/db", "invalid port ('0')"),
        ("postgresql://u@h1,,h2/db", "empty or malformed host in its list of hosts"),
        ("postgresql://u@h1,h2:/db", "invalid port ('')"),
        ("postgresql://u@[::1,h2/db", "empty or malformed host"),
        ("postgresql://u@::1,h2/db", "empty or malformed host"),
        ("postgresql://u@h1:1:2,h2/db", "empty or malformed host"),
        ("postgresql://u@h1,h2/db?host=h3", "both before the database and in its query"),
        ("postgresql://u@h1,h2/db?port=1", "both before the database and in its query"),
        ("postgresql://u@h/db?host=a,b", "both before the database and in its query"),
        ("postgresql://u@/db?host=a,b,c&port=1,2", "names 3 hosts but 2 ports"),
        ("postgresql://u@/db?host=a:1,b&port=3", "ports both after the hosts and in ?port="),
        ("postgresql://u@/db?host=a,b&port=x", "invalid port ('x')"),
        ("postgresql://u@/db?host=a,&port=1", "empty or malformed host"),
        ("postgresql://u@h1,h2/db?target_session_attrs=master", "not one of any, primary"),
    ],
)
def test_a_bad_multi_host_url_is_refused_with_what_is_wrong(given: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        to_async_url(given)


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (
            f"postgresql://u:hunter2@h1:5432,h2:5433/db?{HA}",
            f"postgresql://u:***@/db?host=h1%2Ch2&port=5432%2C5433&{HA}",
        ),
        ("postgresql://u:hunter2@h1:x,h2/db", "postgresql://u:***@h1:x,h2/db"),
        ("postgresql://u:p@ss@h1:x,h2/db?password=hunter2", "postgresql://u:***@h1:x,h2/db"),
    ],
)
def test_a_multi_host_url_is_shown_without_its_password(given: str, shown: str) -> None:
    """Redacted like any URL, also where it does not parse (a settings error echoes it)."""
    assert redact_url(given).startswith(shown)
    assert "hunter2" not in redact_url(given)


def test_one_host_urls_are_not_rewritten() -> None:
    """A socket directory or one host with its port in the query stays the dialect's."""
    for one in ("postgresql:///db?host=/tmp/sock", "postgresql://u@/db?host=h:5433"):
        assert to_async_url(one) == make_url(one).set(
            drivername="postgresql+asyncpg"
        ).render_as_string(hide_password=False)
