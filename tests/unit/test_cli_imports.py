"""What each ``mana-ai`` command loads before it does its work: ``--version`` and ``--help``
no database layer, settings or planner; a command that reads agents no tools, HTTP client,
JSON Schema or daemon. Checked in a fresh interpreter (``sys.modules`` after the command);
how long that takes is ``bench/cli_start.py``'s to say, not a test's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY_FOR_ANY_COMMAND = ("sqlalchemy", "pydantic", "pydantic_settings", "planner.policy", "asyncpg")
NOT_FOR_AGENTS = ("jsonschema", "httpx", "aiohttp", "worker.tools", "worker.daemon", "worker.mcp")


def loaded_after(code: str) -> set[str]:
    """The top-level and dotted module names in ``sys.modules`` after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_load_no_database_settings_or_planner(flag: str) -> None:
    loaded = loaded_after(
        f"from worker.cli import main\ntry:\n    main([{flag!r}])\nexcept SystemExit:\n    pass"
    )
    assert {m for m in loaded if m.split(".")[0] in HEAVY_FOR_ANY_COMMAND} == set()
    assert "planner.policy" not in loaded


def test_the_agents_commands_load_neither_tools_nor_http_nor_json_schema() -> None:
    # what `agents list` imports to run: the parser, the settings and the admin store
    loaded = loaded_after(
        "from worker.cli import build_parser\n"
        "build_parser()\n"
        "import worker.settings, worker.store.admin, worker.store.database, worker.cli.stores"
    )
    assert "sqlalchemy" in loaded  # the probe does import what the command uses
    assert {
        m for m in loaded if any(m == n or m.startswith(n + ".") for n in NOT_FOR_AGENTS)
    } == set()
    assert "planner.policy" not in loaded
