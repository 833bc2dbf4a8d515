"""README.md documents every setting and every command (operators read it, not the code)."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.cli import build_parser
from worker.settings import Variable, variables

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("variable", variables(), ids=lambda v: v.name)
def test_every_setting_is_in_the_settings_table(variable: Variable) -> None:
    start = f"| `{variable.name}` |"
    row = next((line for line in README.splitlines() if line.startswith(start)), "")
    assert row, f"{variable.name} has no row in README's settings table"
    assert variable.description and variable.description in row, (
        f"README's row of {variable.name} differs from its description"
    )


def _commands() -> list[str]:
    parser = build_parser()
    found = []
    [sub] = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    for name, group in sub.choices.items():  # type: ignore[attr-defined]
        nested = [a for a in group._actions if a.__class__.__name__ == "_SubParsersAction"]
        if nested:
            found += [f"{name} {cmd}" for cmd in nested[0].choices]
        else:
            found.append(name)
    return found


@pytest.mark.parametrize("command", _commands())
def test_every_command_is_documented(command: str) -> None:
    group, _, cmd = command.partition(" ")
    assert f"mana-ai {command}" in README or (cmd and f"{group} {cmd}" in README), command


def _block(marker: str) -> str:
    return README.split(f"<!-- {marker} -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("marker", ["run-command", "test-command"])
def test_the_two_commands_install_quietly(marker: str) -> None:
    # the run command printed hundreds of lines of pip output before anything of ours;
    # -q keeps warnings and errors
    installs = [part for part in _block(marker).split("&&") if " install " in part]
    assert installs and all(" install -q " in part for part in installs), installs
