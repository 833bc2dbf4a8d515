"""``mana-ai agents list``, ``missions list``, ``missions show`` and ``iterations list`` read
on one asyncpg connection of their own (``worker.store.direct.read_directly``) and say the
same, byte for byte, as through the engine (``worker.cli.stores.read_only``'s other way): the
same rows, the same messages for a database that cannot be used or a mission that does not
exist, the same exit status; and they load neither SQLAlchemy nor pydantic-settings."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from typing import Any

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import worker.store.direct
from tests.integration.test_cli_approvals import parked
from tests.pgbouncer import PgBouncer
from worker.database_url import asyncpg_keywords
from worker.settings import load_settings
from worker.store.direct import read_directly
from worker.store.reads import list_agents

AGENTS = [
    ["agents", "add", "--name", "plain", "--owner", "u"],
    [
        "agents",
        "add",
        "--name",
        "zeta tools",
        "--owner",
        "ow",
        "--system-prompt",
        "first line\n\tsecond, with a joiner \u200d and an accent \u00e9",
        "--tools",
        "notes_create,clock_now",
        "--policy-mode",
        "enforce",
        "--destructive",
        "ask",
        "--max-tokens-per-day",
        "1000",
        "--compact-max-ctx",
        "0",
    ],
    [
        "agents",
        "add",
        "--name",
        "mcp",
        "--owner",
        "u",
        "--model",
        "m",
        "--mcp",
        "search=https://me:pw@search.example/mcp?key=k",
        "--mcp",
        "fs=stdio:npx -y server",
        "--mcp-header",
        "search=Authorization: Bearer secret",
        "--mcp-env",
        "fs=TOKEN=secret",
        "--mcp-required",
        "fs",
    ],
]


def through_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``read_directly`` leave every read to the engine."""

    async def declines(*_args: Any) -> None:
        return None

    monkeypatch.setattr(worker.store.direct, "read_directly", declines)


def both_ways(run: Any, monkeypatch: pytest.MonkeyPatch, *argv: str) -> list[Any]:
    """``[run(*argv), run(*argv) through the engine]``."""
    direct = run(*argv)
    with monkeypatch.context() as patched:
        through_the_engine(patched)
        engine = run(*argv)
    return [direct, engine]


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_agents_list_says_the_same_directly_and_through_the_engine(
    run: Any, monkeypatch: pytest.MonkeyPatch, json_flag: list[str]
) -> None:
    answered: list[Any] = []

    async def spy(*args: Any) -> Any:
        answered.append(await read_directly(*args))
        return answered[-1]

    monkeypatch.setattr(worker.store.direct, "read_directly", spy)
    none_yet = both_ways(run, monkeypatch, "agents", "list", *json_flag)
    assert none_yet[0] == none_yet[1] == (0, "[]\n" if json_flag else "(none)\n", "")
    for argv in AGENTS:
        assert run(*argv)[0] == 0
    direct, engine = both_ways(run, monkeypatch, "agents", "list", *json_flag)
    assert direct == engine
    assert direct[0] == 0
    assert "secret" not in direct[1]
    assert len(answered) == 2  # (the engine's runs did not ask)
    assert None not in answered  # both read directly


def test_the_direct_read_gives_the_rows_of_the_admin_store(
    run: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for argv in AGENTS:
        assert run(*argv)[0] == 0
    monkeypatch.setenv("MANA_AI_DATABASE_URL", database_url)
    from worker.store.admin import AdminStore
    from worker.store.database import open_database

    async def both() -> tuple[Any, Any]:
        settings = load_settings()
        direct = await read_directly(settings, list_agents)
        async with open_database(settings) as engine:
            return direct, await AdminStore(engine).list_agents()

    direct, stored = asyncio.run(both())
    assert direct == (stored,)
    assert [agent["name"] for agent in stored] == ["mcp", "plain", "zeta tools"]


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://mana:pw@127.0.0.1:9/mana",  # refused
        "postgresql://mana:pw@nonexistent.invalid:5432/mana",  # no such host
    ],
)
def test_an_unreachable_database_is_said_the_same_way(
    run: Any, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    monkeypatch.setenv("MANA_AI_DATABASE_URL", url)
    direct, engine = both_ways(run, monkeypatch, "agents", "list")
    assert direct == engine
    assert direct[0] == 1
    assert "could not connect to PostgreSQL at postgresql+asyncpg://mana:***@" in direct[2]


def test_databases_that_cannot_be_used_are_said_the_same_way(
    run: Any, monkeypatch: pytest.MonkeyPatch, empty_database_url: str
) -> None:
    keywords = asyncpg_keywords(empty_database_url)
    assert keywords is not None

    def execute(statement: str) -> None:
        async def once() -> None:
            conn = await asyncpg.connect(**keywords)
            try:
                await conn.execute(statement)
            finally:
                await conn.close()

        asyncio.run(once())

    monkeypatch.setenv("MANA_AI_DATABASE_URL", empty_database_url)
    never_migrated = both_ways(run, monkeypatch, "agents", "list")
    execute("CREATE TABLE alembic_version (version_num text)")
    empty_version_table = both_ways(run, monkeypatch, "agents", "list")
    execute("INSERT INTO alembic_version VALUES ('9999')")
    newer = both_ways(run, monkeypatch, "agents", "list")
    missing = empty_database_url.rsplit("/", 1)[0] + "/no_such_database_here"
    monkeypatch.setenv("MANA_AI_DATABASE_URL", missing)
    no_such_database = both_ways(run, monkeypatch, "agents", "list")
    for (direct, engine), says in [
        (never_migrated, "at revision (none), this mana-ai needs"),
        (empty_version_table, "at revision (none), this mana-ai needs"),
        (newer, "at revision 9999, newer than this mana-ai knows"),
        (no_such_database, 'database "no_such_database_here" does not exist'),
    ]:
        assert direct == engine
        assert direct[0] == 1
        assert says in direct[2]


def test_the_reads_load_neither_sqlalchemy_nor_pydantic_settings(
    run: Any, database_url: str
) -> None:
    assert run("agents", "add", "--name", "scout", "--owner", "u")[0] == 0
    assert run("missions", "add", "--agent", "scout", "--objective", "x", "--due-now")[0] == 0
    probe = (
        "import json, sys\n"
        "from worker.cli import main\n"
        "statuses = [main(['agents', 'list', '--json'])]\n"
        "for argv in (['missions', 'list'], ['missions', 'show', '1'], ['iterations', 'list'],\n"
        "             ['iterations', 'list', '--mission', '1']):\n"
        "    statuses.append(main(argv))\n"
        "print(json.dumps([statuses, sorted(sys.modules)]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MANA_AI_")}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, "MANA_AI_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    lines = done.stdout.splitlines()
    statuses, loaded = json.loads(lines[-1])
    assert statuses == [0] * 5
    listing = lines[: lines.index("]") + 1]
    assert [agent["name"] for agent in json.loads("\n".join(listing))] == ["scout"]
    heavy = {m for m in loaded if m.split(".")[0] in ("sqlalchemy", "pydantic_settings")}
    assert heavy == set()


def test_agents_list_reads_directly_through_pgbouncer_in_transaction_mode(
    run: Any, monkeypatch: pytest.MonkeyPatch, pgbouncer: PgBouncer, database_url: str
) -> None:
    for argv in AGENTS:
        assert run(*argv)[0] == 0
    expected = run("agents", "list", "--json")
    monkeypatch.setenv("MANA_AI_DATABASE_URL", pgbouncer.url_for(database_url))
    monkeypatch.setenv("MANA_AI_DB_PGBOUNCER", "true")
    direct, engine = both_ways(run, monkeypatch, "agents", "list", "--json")
    assert direct == engine == expected

    async def together() -> list[Any]:  # more reads at once than PgBouncer has connections
        settings = load_settings()
        return await asyncio.gather(*(read_directly(settings, list_agents) for _ in range(12)))

    results = asyncio.run(together())
    assert None not in results
    assert all(result == results[0] for result in results)


def test_reads_go_through_the_engine_when_the_worker_logs_at_info(
    run: Any, monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    # the engine's way logs what it opens (and SQLAlchemy its statements) at INFO and DEBUG
    monkeypatch.setenv("MANA_AI_DATABASE_URL", database_url)
    settings = load_settings()
    logger = logging.getLogger("worker")
    was = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        assert asyncio.run(read_directly(settings, list_agents)) is None
        logger.setLevel(logging.WARNING)
        assert asyncio.run(read_directly(settings, list_agents)) == ([],)
    finally:
        logger.setLevel(was)
    code, _, err = run("agents", "list")  # the command's own logging: quiet unless DEBUG
    assert (code, err) == (0, "")
    monkeypatch.setenv("MANA_AI_LOG_LEVEL", "DEBUG")
    code, _, err = run("agents", "list")
    assert code == 0
    assert "using PostgreSQL at" in err


async def test_missions_and_iterations_say_the_same_directly_and_through_the_engine(
    db: AsyncEngine, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, parked_id = await parked(db)  # its run waits for a person: "awaiting approval ID"
    added = ("missions", "add", "--agent", "a1", "--objective", "x\ny", "--due-now")
    assert (await asyncio.to_thread(run, *added))[0] == 0
    assert (await asyncio.to_thread(run, "missions", "pause", str(parked_id + 1)))[0] == 0
    said = []
    for argv in (
        ["missions", "list"],
        ["missions", "list", "--json"],
        ["missions", "list", "--status", "paused"],
        ["missions", "list", "--status", "active", "--limit", "1", "--json"],
        ["missions", "show", str(parked_id)],
        ["missions", "show", str(parked_id), "--json"],
        ["iterations", "list"],
        ["iterations", "list", "--json"],
        ["iterations", "list", "--mission", str(parked_id), "--limit", "1", "--json"],
        ["iterations", "list", "--mission", str(parked_id + 1)],
    ):
        direct, engine = await asyncio.to_thread(both_ways, run, monkeypatch, *argv)
        assert direct == engine
        assert direct[0] == 0
        said.append(direct[1])
    for argv in (["missions", "show", "999"], ["iterations", "list", "--mission", "999"]):
        direct, engine = await asyncio.to_thread(both_ways, run, monkeypatch, *argv)
        assert direct == engine == (1, "", "mana-ai: error: no mission with id 999\n")
    assert "active, awaiting approval" in said[0]
    assert "x\\ny" in said[0] and "paused" in said[2]


async def test_a_read_cancelled_midway_fails_once_in_the_engines_words(database_url: str) -> None:
    # The read waits behind a lock; an operator cancels it (pg_cancel_backend). It must fail
    # as through the engine, not be run again (a second read would wait on the lock for ever)
    keywords = asyncpg_keywords(database_url)
    assert keywords is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("MANA_AI_")}
    env |= {"MANA_AI_DATABASE_URL": database_url, "MANA_AI_WORKER_ID": "cancelled-read"}
    locker = await asyncpg.connect(**keywords)
    watcher = await asyncpg.connect(**keywords)  # (the locker's transaction sees one snapshot)
    child = None
    try:
        await locker.execute("BEGIN; LOCK TABLE agents IN ACCESS EXCLUSIVE MODE")
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "worker.cli",
            "agents",
            "list",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        waiting = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        waiting += "AND application_name = 'mana-ai/cancelled-read'"
        pid = None
        for _ in range(600):
            pid = await watcher.fetchval(waiting)
            if pid is not None:
                break
            await asyncio.sleep(0.05)
        if pid is None:
            child.kill()
            raise AssertionError(f"the read never waited on the lock: {await child.communicate()}")
        assert await watcher.fetchval("SELECT pg_cancel_backend($1)", pid)
        out, err = await asyncio.wait_for(child.communicate(), timeout=60)
    finally:
        if child is not None and child.returncode is None:
            child.kill()
            await child.wait()
        await locker.close()
        await watcher.close()
    assert (child.returncode, out) == (1, b"")
    assert (
        err.decode() == "mana-ai: database error: Error: canceling statement due to user request\n"
    )
