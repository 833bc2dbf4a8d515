"""Settings: defaults, environment parsing, error messages that name the variable, URL forms."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from worker.data_dir import default_data_dir
from worker.database_url import to_async_url
from worker.errors import ManaAIError, SettingsError
from worker.settings import Settings, load_settings, unknown_variables, variables


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No MANA_AI_* variable from the caller's shell (or CI) leaks into these tests."""
    for name in list(os.environ):
        if name.upper().startswith("MANA_AI_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    settings = load_settings()

    assert settings.database.url is None
    assert settings.database.data_dir == default_data_dir()
    assert settings.llm.primary.base_url is None
    assert settings.llm.primary.api_key is None
    assert settings.llm.primary.model is None
    assert settings.daemon.tick_interval_s == 30
    assert settings.daemon.max_concurrent_missions == 4
    assert settings.daemon.lease_s == 60
    assert settings.daemon.metrics_port == 9464
    assert settings.daemon.metrics_host == "0.0.0.0"
    assert settings.daemon.worker_id == f"{socket.gethostname()}:{os.getpid()}"
    assert settings.daemon.shutdown_grace_s == 30
    assert settings.llm.timeout_s == 60
    assert settings.llm.max_retries == 3
    assert settings.llm.max_response_bytes == 8 * 1024 * 1024
    assert settings.logs.level == "INFO"
    assert settings.logs.format == "text"
    assert settings.run.max_parallel_reads == 10
    assert settings.run.tool_timeout_s == 60
    assert settings.web.allow_private is False
    assert settings.web.allow_domains == () and settings.web.deny_domains == ()
    assert settings.web.timeout_s == 20
    assert settings.web.max_bytes == 2_000_000
    assert settings.web.max_chars == 20_000
    assert settings.web.max_redirects == 5
    assert settings.llm.fallback.base_url is None
    assert settings.llm.fallback.model is None
    assert settings.llm.fallback.api_key is None
    assert settings.llm.schema_dialect == "json-schema"
    assert settings.llm.schema_strip == ()


def test_llm_endpoint_settings_are_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_LLM_FALLBACK_BASE_URL", "http://backup.example/v1/")
    monkeypatch.setenv("MANA_AI_LLM_FALLBACK_MODEL", "small")
    monkeypatch.setenv("MANA_AI_LLM_FALLBACK_API_KEY", "sk-backup")
    monkeypatch.setenv("MANA_AI_LLM_SCHEMA_DIALECT", "gemini")
    monkeypatch.setenv("MANA_AI_LLM_SCHEMA_STRIP", " additionalProperties, default ,")
    settings = load_settings()
    assert settings.llm.fallback.base_url == "http://backup.example/v1"
    assert settings.llm.fallback.model == "small"
    assert settings.llm.fallback.api_key is not None
    assert settings.llm.fallback.api_key.get_secret_value() == "sk-backup"
    assert settings.llm.schema_dialect == "gemini"
    assert settings.llm.schema_strip == ("additionalProperties", "default")


def test_every_field_is_documented() -> None:
    for variable in variables():
        assert len(variable.description) > 20, variable.name


def test_every_field_has_one_variable() -> None:
    def leaves(model: type[BaseModel], path: tuple[str, ...]) -> list[tuple[str, ...]]:
        found = []
        for name, field in model.model_fields.items():
            inner = field.annotation
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                found += leaves(inner, (*path, name))
            else:
                found.append((*path, name))
        return found

    paths = [variable.path for variable in variables()]
    assert sorted(paths) == sorted(leaves(Settings, ()))
    assert len(set(paths)) == len(paths) == 70
    assert all(v.name.startswith("MANA_AI_") for v in variables())


def test_given_values_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_POLICY_MODE", "enforce")
    monkeypatch.setenv("MANA_AI_LEASE_S", "120")
    settings = load_settings(policy_mode="off")
    assert (settings.policy.mode, settings.daemon.lease_s) == ("off", 120)
    assert settings.policy.model_fields_set == {"mode"}
    assert "data_dir" not in settings.database.model_fields_set
    nested = load_settings(policy={"mode": "off", "rate_limit": 5}, policy_rate_limit=7)
    assert (nested.policy.mode, nested.policy.rate_limit) == ("off", 7)


def test_variables_are_read_in_any_case_and_the_text_is_not_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("mana_ai_mcp_scopes", '["notes", "clock"]')
    monkeypatch.setenv("Mana_Ai_Policy_Tool_Rate_Limits", "notes_list=3")
    monkeypatch.setenv("MANA_AI_LLM_MODEL", "null")
    settings = load_settings()
    assert settings.mcp.scopes == ("notes", "clock")  # the field's own parser, not JSON
    assert settings.policy.tool_rate_limits == {"notes_list": 3}
    assert settings.llm.primary.model == "null"


def test_values_are_parsed_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {
        "MANA_AI_DATABASE_URL": "postgres://mana:pw@db.internal:6432/mana",
        "MANA_AI_DATA_DIR": str(tmp_path),
        "MANA_AI_LLM_BASE_URL": "https://llm.example/v1/",
        "MANA_AI_LLM_API_KEY": "sk-secret",
        "MANA_AI_LLM_MODEL": "gpt-4o-mini",
        "MANA_AI_TICK_INTERVAL_S": "2.5",
        "MANA_AI_MAX_CONCURRENT_MISSIONS": "8",
        "MANA_AI_LEASE_S": "90",
        "MANA_AI_METRICS_PORT": "0",
        "MANA_AI_METRICS_HOST": "127.0.0.1",
        "MANA_AI_WORKER_ID": "worker-a",
        "MANA_AI_SHUTDOWN_GRACE_S": "5",
        "MANA_AI_LLM_TIMEOUT_S": "12",
        "MANA_AI_LLM_MAX_RETRIES": "0",
        "MANA_AI_LLM_MAX_RESPONSE_BYTES": "65536",
        "MANA_AI_LOG_LEVEL": "debug",
        "MANA_AI_LOG_FORMAT": "json",
        "MANA_AI_MAX_PARALLEL_READS": "4",
        "MANA_AI_TOOL_TIMEOUT_S": "7.5",
        "MANA_AI_WEB_ALLOW_PRIVATE": "true",
        "MANA_AI_WEB_ALLOW_DOMAINS": " Python.org, *.wikipedia.org ,",
        "MANA_AI_WEB_DENY_DOMAINS": "ads.example.com",
        "MANA_AI_WEB_TIMEOUT_S": "3",
        "MANA_AI_WEB_MAX_BYTES": "1000",
        "MANA_AI_WEB_MAX_CHARS": "500",
        "MANA_AI_WEB_MAX_REDIRECTS": "0",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    settings = load_settings()

    assert settings.database.url == "postgresql+asyncpg://mana:pw@db.internal:6432/mana"
    assert settings.database.data_dir == tmp_path
    assert settings.llm.primary.base_url == "https://llm.example/v1"
    assert settings.llm.primary.api_key is not None
    assert settings.llm.primary.api_key.get_secret_value() == "sk-secret"
    assert settings.llm.primary.model == "gpt-4o-mini"
    assert settings.daemon.tick_interval_s == 2.5
    assert settings.daemon.max_concurrent_missions == 8
    assert settings.daemon.lease_s == 90
    assert settings.daemon.metrics_port == 0
    assert settings.daemon.metrics_host == "127.0.0.1"
    assert settings.daemon.worker_id == "worker-a"
    assert settings.run.max_parallel_reads == 4
    assert settings.run.tool_timeout_s == 7.5
    assert settings.web.allow_private is True
    assert settings.web.allow_domains == ("python.org", "wikipedia.org")
    assert settings.web.deny_domains == ("ads.example.com",)
    assert (settings.web.timeout_s, settings.web.max_bytes) == (3, 1000)
    assert (settings.web.max_chars, settings.web.max_redirects) == (500, 0)
    assert settings.daemon.shutdown_grace_s == 5
    assert settings.llm.timeout_s == 12
    assert settings.llm.max_retries == 0
    assert settings.llm.max_response_bytes == 65536
    assert settings.logs.level == "DEBUG"
    assert settings.logs.format == "json"


def test_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_TICK_INTERVAL_S", "5")
    assert load_settings(tick_interval_s=1).daemon.tick_interval_s == 1


def test_empty_variables_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in variables():
        monkeypatch.setenv(variable.name, "")
    settings = load_settings()
    assert settings.database.url is None
    assert settings.llm.primary.base_url is None
    assert settings.llm.primary.api_key is None
    assert settings.llm.primary.model is None
    # every setting falls back to its default, as if it were not set at all
    assert settings.policy.mode == "log-only" and settings.policy.rate_limit == 30
    assert settings.daemon.tick_interval_s == 30 and settings.logs.level == "INFO"
    assert settings.daemon.worker_id


def test_data_dir_expands_the_home_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_DATA_DIR", "~/mana-data")
    assert load_settings().database.data_dir == Path.home() / "mana-data"


def test_an_invalid_value_names_the_variable_and_the_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MANA_AI_TICK_INTERVAL_S", "-1")

    with pytest.raises(SettingsError) as caught:
        load_settings()

    assert str(caught.value) == (
        "MANA_AI_TICK_INTERVAL_S: Input should be greater than or equal to 0.1 (got '-1')"
    )
    assert isinstance(caught.value, ManaAIError)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("MANA_AI_MAX_CONCURRENT_MISSIONS", "0", "greater than or equal to 1"),
        ("MANA_AI_MAX_CONCURRENT_MISSIONS", "four", "valid integer"),
        ("MANA_AI_LEASE_S", "0.5", "greater than or equal to 1"),
        ("MANA_AI_METRICS_PORT", "70000", "less than or equal to 65535"),
        ("MANA_AI_METRICS_PORT", "-1", "greater than or equal to 0"),
        ("MANA_AI_LOG_LEVEL", "loud", "must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("MANA_AI_LOG_FORMAT", "xml", "'json' or 'text'"),
        ("MANA_AI_LLM_BASE_URL", "llm.example/v1", "must be an http:// or https:// URL"),
        ("MANA_AI_LLM_FALLBACK_BASE_URL", "ftp://x/v1", "must be an http:// or https:// URL"),
        ("MANA_AI_LLM_SCHEMA_DIALECT", "openapi", "'json-schema' or 'gemini'"),
        ("MANA_AI_LLM_TIMEOUT_S", "0", "greater than 0"),
        ("MANA_AI_LLM_MAX_RETRIES", "-1", "greater than or equal to 0"),
        ("MANA_AI_LLM_MAX_RESPONSE_BYTES", "1023", "greater than or equal to 1024"),
        ("MANA_AI_LLM_MAX_RESPONSE_BYTES", "1073741825", "less than or equal to 1073741824"),
        ("MANA_AI_LLM_MAX_RESPONSE_BYTES", "8MiB", "valid integer"),
        ("MANA_AI_SHUTDOWN_GRACE_S", "-1", "greater than or equal to 0"),
        ("MANA_AI_WORKER_ID", "x" * 201, "is 201 characters long; at most 200"),
        ("MANA_AI_WORKER_ID", "w\n2", "must not contain control"),
        ("MANA_AI_LLM_MODEL", "gpt\u200b4", "must not contain control or invisible"),
        ("MANA_AI_DATABASE_URL", "mysql://u@h/db", "unsupported scheme 'mysql://'"),
        ("MANA_AI_DATABASE_URL", "not a url", "not a database URL"),
        ("MANA_AI_DATABASE_URL", "postgresql://u@h1:x,h2/db", "invalid port ('x') in its list"),
        ("MANA_AI_DATABASE_URL", "postgresql://u@/db?host=a,b,c&port=1,2", "3 hosts but 2 ports"),
        ("MANA_AI_MAX_PARALLEL_READS", "0", "greater than or equal to 1"),
        ("MANA_AI_TOOL_TIMEOUT_S", "0", "greater than 0"),
        ("MANA_AI_WEB_ALLOW_PRIVATE", "maybe", "valid boolean"),
        ("MANA_AI_WEB_ALLOW_DOMAINS", "https://example.com", "not a domain name"),
        ("MANA_AI_WEB_DENY_DOMAINS", "a.com,b.com/x", "not a domain name"),
        ("MANA_AI_WEB_TIMEOUT_S", "-2", "greater than 0"),
        ("MANA_AI_WEB_MAX_BYTES", "0", "greater than or equal to 1"),
        ("MANA_AI_WEB_MAX_REDIRECTS", "21", "less than or equal to 20"),
    ],
)
def test_each_invalid_value_is_reported_by_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"{variable}: ")
    assert expected in message


def test_several_invalid_values_are_all_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_TICK_INTERVAL_S", "0")
    monkeypatch.setenv("MANA_AI_LOG_FORMAT", "xml")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    lines = str(caught.value).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "MANA_AI_TICK_INTERVAL_S",
        "MANA_AI_LOG_FORMAT",
    ]


def test_secrets_are_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_DATABASE_URL", "mysql://user:hunter2@db/x")
    monkeypatch.setenv("MANA_AI_LLM_API_KEY", "sk-hunter2")
    with pytest.raises(SettingsError) as caught:
        load_settings(llm_api_key=["not", "a", "string"])
    assert "hunter2" not in str(caught.value)
    assert "MANA_AI_LLM_API_KEY" in str(caught.value)
    with pytest.raises(SettingsError) as caught:
        load_settings(llm_fallback_api_key=["hunter2"])
    assert "hunter2" not in str(caught.value)

    monkeypatch.setenv("MANA_AI_DATABASE_URL", "postgresql://user:hunter2@db/x")
    settings = load_settings()
    assert "hunter2" not in repr(settings)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u:p@h:5432/db", "postgresql+asyncpg://u:p@h:5432/db"),
        ("postgres://u:p@h/db", "postgresql+asyncpg://u:p@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("  postgresql://u@h/db  ", "postgresql+asyncpg://u@h/db"),
        ("postgresql://u:p%40ss@h/db", "postgresql+asyncpg://u:p%40ss@h/db"),
        ("postgresql://u@h/db?sslmode=require", "postgresql+asyncpg://u@h/db?ssl=require"),
        (
            "postgresql://postgres@/mana_ai?host=/run/pg",
            "postgresql+asyncpg://postgres@/mana_ai?host=%2Frun%2Fpg",
        ),
    ],
)
def test_database_urls_are_normalised_to_asyncpg(given: str, expected: str) -> None:
    assert to_async_url(given) == expected


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("application_name=x", "'application_name'"),
        ("connect_timeout=5", "'connect_timeout'"),
        ("foo=bar", "'foo'"),
        ("sslmode=bogus", "sslmode='bogus'"),
        ("ssl=on", "ssl='on'"),
        ("target_session_attrs=bogus", "target_session_attrs='bogus'"),
    ],
)
def test_a_url_parameter_the_driver_would_choke_on_is_a_settings_error(
    monkeypatch: pytest.MonkeyPatch, query: str, named: str
) -> None:
    # before, it reached asyncpg's connect() as an unknown keyword: a traceback per command
    monkeypatch.setenv("MANA_AI_DATABASE_URL", f"postgresql://u:secret@h/db?{query}")
    with pytest.raises(SettingsError, match="MANA_AI_DATABASE_URL") as raised:
        load_settings()
    assert named in str(raised.value)
    assert "secret" not in str(raised.value)


def test_the_url_parameters_the_driver_takes_are_kept() -> None:
    url = "postgresql://u@h/db?target_session_attrs=read-write&passfile=/p&host=/run/pg"
    assert "target_session_attrs=read-write" in to_async_url(url)


@pytest.mark.parametrize("given", ["mysql://u@h/db", "postgresql+psycopg://u@h/db", "sqlite://"])
def test_other_database_schemes_are_refused(given: str) -> None:
    with pytest.raises(ValueError, match="unsupported scheme"):
        to_async_url(given)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_non_finite_intervals_are_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MANA_AI_TICK_INTERVAL_S", value)
    with pytest.raises(SettingsError, match="MANA_AI_TICK_INTERVAL_S"):
        load_settings()


def test_an_empty_data_dir_means_the_default_not_the_current_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MANA_AI_DATA_DIR", "")
    assert load_settings().database.data_dir == default_data_dir()


def test_unknown_variables_are_reported_with_the_closest_setting() -> None:
    found = unknown_variables(
        {
            "MANA_AI_DATABSE_URL": "x",
            "MANA_AI_BOGUS": "1",
            "MANA_AI_TEST_DATABASE_URL": "belongs to the test suite",
            "MANA_AI_LEASE_S": "5",
            "PATH": "/bin",
        }
    )
    assert found == [
        "MANA_AI_BOGUS",
        "MANA_AI_DATABSE_URL (did you mean MANA_AI_DATABASE_URL?)",
    ]


NUMERIC = {v.name: v.field.annotation for v in variables() if v.field.annotation in (int, float)}


@pytest.mark.parametrize("variable", sorted(NUMERIC))
def test_every_numeric_setting_has_a_range(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # a value too large for a timedelta, a timer or the database is refused where it is parsed
    monkeypatch.setenv(variable, "1e300" if NUMERIC[variable] is float else "9" * 30)
    with pytest.raises(SettingsError, match=f"^{variable}: Input should be less than or equal to"):
        load_settings()


@pytest.mark.parametrize("value", ["1e-9", "0.05"])
def test_the_tick_interval_has_a_minimum(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    # 1e-9 was logged as "every 0.0 s" and ran every second (APScheduler's rounding)
    monkeypatch.setenv("MANA_AI_TICK_INTERVAL_S", value)
    with pytest.raises(SettingsError, match=r"greater than or equal to 0\.1"):
        load_settings()
    monkeypatch.setenv("MANA_AI_TICK_INTERVAL_S", "0.1")
    assert load_settings().daemon.tick_interval_s == 0.1


def test_root_defaults_to_a_data_directory_outside_any_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "/srv/xdg")  # a home of root's is no place for it
    assert default_data_dir(root=True) == Path("/var/lib/mana-ai")
    assert default_data_dir() == default_data_dir(root=os.geteuid() == 0)


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG default is Linux's")
@pytest.mark.parametrize(
    ("xdg_data_home", "expected"),
    [
        (None, "{home}/.local/share/mana-ai"),
        ("/srv/xdg", "/srv/xdg/mana-ai"),
        ("", "{home}/.local/share/mana-ai"),
        ("relative/dir", "{home}/.local/share/mana-ai"),  # the XDG spec: ignored
    ],
)
def test_the_user_data_directory_follows_xdg_data_home(
    xdg_data_home: str | None,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    if xdg_data_home is None:
        monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    else:
        monkeypatch.setenv("XDG_DATA_HOME", xdg_data_home)
    assert default_data_dir(root=False) == Path(expected.format(home=tmp_path))


def test_names_in_settings_follow_the_rule_for_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_WORKER_ID", "  replica-1 ")
    monkeypatch.setenv("MANA_AI_LLM_MODEL", " gpt-4o\t")
    settings = load_settings()
    assert (settings.daemon.worker_id, settings.llm.primary.model) == ("replica-1", "gpt-4o")


@pytest.mark.parametrize(
    ("value", "expected"),
    [("auto", "auto"), ("TRUE", True), ("on", True), ("1", True), ("false", False), ("no", False)],
)
def test_pgbouncer_switch_spellings(value: str, expected: object) -> None:
    assert load_settings(db_pgbouncer=value).database.pgbouncer_mode == expected


def test_a_multi_host_url_is_accepted_and_a_bad_one_not_echoed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 36: the operator's HA URL was refused as '(unparseable URL)'."""
    monkeypatch.setenv(
        "MANA_AI_DATABASE_URL",
        "postgresql://postgres:pw@10.0.0.1:5432,10.0.0.2:5432/mana?target_session_attrs=read-write",
    )
    assert load_settings().database.url == (
        "postgresql+asyncpg://postgres:pw@/mana?host=10.0.0.1%2C10.0.0.2&port=5432%2C5432"
        "&target_session_attrs=read-write"
    )
    monkeypatch.setenv("MANA_AI_DATABASE_URL", "postgresql://u:hunter2@h1:5432,h2:x/db")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value) == (
        "MANA_AI_DATABASE_URL: has an invalid port ('x') in its list of hosts; a port is 1 to "
        "65535 (got 'postgresql://u:***@h1:5432,h2:x/db')"
    )


def test_pgbouncer_auto_means_port_6432_on_every_host() -> None:
    assert load_settings(database_url="postgresql://u@a:6432,b:6432/x").database.pgbouncer
    assert not load_settings(database_url="postgresql://u@a:6432,b:5432/x").database.pgbouncer


def test_pgbouncer_auto_means_port_6432() -> None:
    assert load_settings(database_url="postgresql://u@db:6432/x").database.pgbouncer is True
    assert load_settings(database_url="postgresql://u@db:5432/x").database.pgbouncer is False
    assert (
        load_settings(
            database_url="postgresql://u@db:6432/x", db_pgbouncer="false"
        ).database.pgbouncer
        is False
    )
    assert load_settings().database.pgbouncer is False  # embedded: never


def test_a_pgbouncer_value_that_is_no_switch_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"MANA_AI_DB_PGBOUNCER: .*auto, true or false"):
        load_settings(db_pgbouncer="maybe")


LLM_URL_VARIABLES = (
    "MANA_AI_LLM_BASE_URL",
    "MANA_AI_LLM_FALLBACK_BASE_URL",
    "MANA_AI_COMPACT_BASE_URL",
)

BAD_HTTP_URLS = [
    # the tester's: each got past the settings and crashed `tick` and `worker` with a traceback
    ("http://[::1/v1", "is not a URL (Invalid IPv6 URL)"),
    ("http://h/\x1b", "must not contain a hidden character (U+001B ESC at position 10)"),
    ("http://", "has no host"),
    ("https://:99999/v1", "has no host"),
    # and more of the same kind
    ("https://h:99999/v1", "has an invalid port (Port out of range 0-65535)"),
    ("http://h:0/v1", "has an invalid port (0)"),
    ("http://h:abc/v1", "has an invalid port"),
    ("http:///v1", "has no host"),
    ("http://[zz]/v1", "'zz' does not appear to be an IPv4 or IPv6 address"),
    ("http://[::1/v1?key=sk-1", "(got 'http://[::1/v1?***')"),
    ("http://256.1.1.1/v1", "has an invalid host"),
    ("http://xn--/v1", "is not valid IDNA"),
    ("http://h\u200b/v1", "hidden character (U+200B ZERO WIDTH SPACE at position 9)"),
    ("http://h/a b", "must not contain whitespace (U+0020 SPACE at position 11)"),
    ("http://h/v1\u202e", "hidden character (U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("http://h\\x/v1", "'\\\\' is not a character of a host name"),
    ("ftp://h/v1", "must be an http:// or https:// URL"),
    ("llm.example/v1", "must be an http:// or https:// URL"),
]


@pytest.mark.parametrize("variable", LLM_URL_VARIABLES)
@pytest.mark.parametrize(("value", "expected"), BAD_HTTP_URLS)
def test_an_llm_url_the_http_client_cannot_use_stops_the_command_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"{variable}: "), message
    assert expected in message, message
    assert message.isprintable()  # the value is shown escaped (repr), never raw


GOOD_HTTP_URLS = [
    ("https://api.openai.com/v1/", "https://api.openai.com/v1"),
    ("HTTP://LOCALHOST:8000/v1", "HTTP://LOCALHOST:8000/v1"),
    ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
    ("http://[fe80::1%25eth0]:8000/v1", "http://[fe80::1%25eth0]:8000/v1"),
    ("http://10.0.0.7:65535/v1", "http://10.0.0.7:65535/v1"),
    ("http://user:p%40ss@llm.internal/v1?key=k", "http://user:p%40ss@llm.internal/v1?key=k"),
    ("http://llm_gateway.local/v1", "http://llm_gateway.local/v1"),
    ("http://bücher.example/v1", "http://bücher.example/v1"),
    ("http://h:/v1", "http://h:/v1"),  # an empty port is the scheme's
]


@pytest.mark.parametrize(("value", "expected"), GOOD_HTTP_URLS)
async def test_an_llm_url_the_settings_accept_is_one_the_http_client_takes(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    from worker.llm import OpenAICompatibleChatModel

    monkeypatch.setenv("MANA_AI_LLM_BASE_URL", value)
    settings = load_settings()
    assert settings.llm.primary.base_url == expected
    model = OpenAICompatibleChatModel(base_url=expected)  # no socket: the pool opens lazily
    await model.aclose()


@pytest.mark.parametrize(
    "value",
    [
        "http://[::1/v1",
        "http://h/\x1b",
        "http://",
        "https://:99999/v1",
        "https://h:99999/v1",
        "http://h:abc/v1",
        "http://[zz]/v1",
        "http://256.1.1.1/v1",
        "http://h\u200b/v1",
        "ftp://h/v1",
    ],
)
def test_the_http_client_refuses_a_url_it_cannot_use_with_a_value_error(value: str) -> None:
    from worker.llm import OpenAICompatibleChatModel

    # not httpx.InvalidURL (a traceback where the worker builds its chat model) nor a client
    # that fails at its first request: the planner's own callers get a ValueError
    try:
        OpenAICompatibleChatModel(base_url=value)
    except ValueError:
        return
    pytest.fail(f"OpenAICompatibleChatModel took {value!r}")


def test_an_llm_url_is_shown_without_its_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MANA_AI_LLM_BASE_URL", "http://u:hunter2@h:99999/v1?key=sk-hunter2")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "hunter2" not in str(caught.value)
    assert "(got 'http://u:***@h:99999/v1?key=***')" in str(caught.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("postgresql://u@h:99999/db", "has an invalid port (99999)"),
        ("postgresql://[::1/db", "not a database URL"),  # was a ValueError traceback
        ("postgresql://u@h:abc/db", "not a database URL"),
        ("postgresql://u@h/d\x1b", "control or invisible characters (U+001B ESC at position"),
    ],
)
def test_a_database_url_with_a_bad_port_or_a_control_character_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv("MANA_AI_DATABASE_URL", value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert str(caught.value).startswith("MANA_AI_DATABASE_URL: ")
    assert expected in str(caught.value)


def test_a_bad_llm_url_exits_2_before_anything_connects(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.cli import main

    monkeypatch.setenv("MANA_AI_LLM_BASE_URL", "http://[::1/v1")
    assert main(["tick", "--once"]) == 2
    err = capsys.readouterr().err
    assert "MANA_AI_LLM_BASE_URL: is not a URL (Invalid IPv6 URL)" in err
    assert "Traceback" not in err
