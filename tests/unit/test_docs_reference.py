"""The reference pages under ``docs/reference/`` are generated from the code
(``docs/gen_reference.py``) and committed: they must be what the generator writes today, and
every setting, command, API path and metric the code has must be in them."""

from __future__ import annotations

import argparse
import importlib.util
from types import ModuleType

import pytest

from tests.readme import DOCS, page

GENERATOR = DOCS / "gen_reference.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", GENERATOR)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_reference = _generator()


@pytest.mark.parametrize("name", sorted(gen_reference.PAGES))
def test_the_committed_page_is_what_the_generator_writes(name: str) -> None:
    committed = DOCS / "reference" / name
    expected = gen_reference.pages()[name]
    assert committed.exists(), f"docs/reference/{name} is missing: run {gen_reference.COMMAND}"
    assert committed.read_text(encoding="utf-8") == expected, (
        f"docs/reference/{name} is stale: run {gen_reference.COMMAND} to update it"
    )


def _settings() -> list[object]:
    from worker.settings import variables

    return [pytest.param(v.name, v.description, id=v.name) for v in variables()]


@pytest.mark.parametrize(("name", "description"), _settings())
def test_every_setting_has_its_row(name: str, description: str) -> None:
    row = next(
        (r for r in page("reference/settings.md").splitlines() if r.startswith(f"| `{name}` |")), ""
    )
    assert row, f"{name} has no row in docs/reference/settings.md"
    assert description and " ".join(description.split()).replace("|", "\\|") in row, (
        f"{name}'s description differs"
    )


def _commands() -> list[str]:
    from worker.cli import build_parser

    found = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            found.append(prefix)
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, f"{prefix} {name}".strip())

    walk(build_parser(), "")
    return found


@pytest.mark.parametrize("command", _commands())
def test_every_command_and_flag_is_documented(command: str) -> None:
    from worker.cli import build_parser

    text = page("reference/cli.md")
    heading = f"\n## mana-ai {command}\n"
    assert heading in text, f"mana-ai {command} is not in docs/reference/cli.md"
    body = text.split(heading, 1)[1].split("\n## ", 1)[0]
    parser = build_parser()
    for word in command.split():
        [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[word]
    for action in parser._actions:
        for flag in action.option_strings:
            if flag not in ("-h", "--help"):
                assert f"`{flag}" in body, f"mana-ai {command} {flag} is not documented"


def _api_operations() -> list[str]:
    from worker.api.openapi import openapi_document

    return [
        f"{method.upper()} {path}"
        for path, operations in openapi_document()["paths"].items()
        for method in operations
    ]


@pytest.mark.parametrize("operation", _api_operations())
def test_every_api_path_is_documented(operation: str) -> None:
    assert f"\n## {operation}\n" in page("reference/api.md"), operation


def _metric_names() -> list[str]:
    from prometheus_client import REGISTRY
    from prometheus_client.metrics import MetricWrapperBase

    import worker.metrics
    from worker.api.app import SERVE_REGISTRY

    names = set()
    for registry in (REGISTRY, SERVE_REGISTRY):
        for collector in list(registry._collector_to_names):
            if isinstance(collector, MetricWrapperBase) and collector._name.startswith("mana_ai_"):
                suffix = "_total" if collector._type == "counter" else ""
                names.add(collector._name + suffix)
    # the collectors that export what they read: a fresh one with figures says its names
    stats = worker.metrics.ApprovalStats()
    stats.update({}, 0, 0.0)
    pools = worker.metrics.DatabasePools()
    pools.watch("main", lambda: (0, 0), 1)
    for collector in (stats, pools):
        for family in collector.collect():
            names.add(family.name + ("_total" if family.type == "counter" else ""))
    return sorted(names)


@pytest.mark.parametrize("metric", _metric_names())
def test_every_metric_is_documented(metric: str) -> None:
    assert f"| `{metric}` |" in page("reference/metrics.md"), metric


def test_every_table_has_a_line_saying_what_it_holds() -> None:
    from worker.db.tables import metadata

    assert set(metadata.tables) <= set(gen_reference.TABLES), "describe it in TABLES"
