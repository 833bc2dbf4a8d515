"""README.md keeps its two commands quiet (the run command and the test command, which CI
runs). What it documented beyond them moved to the docs site: the settings, commands, API and
metrics are held to the code by ``tests/unit/test_docs_reference.py``."""

from __future__ import annotations

import pytest

from tests.readme import README


def _block(marker: str) -> str:
    return README.split(f"<!-- {marker} -->", 1)[1].split("```sh", 1)[1].split("```", 1)[0]


@pytest.mark.parametrize("marker", ["run-command", "test-command"])
def test_the_two_commands_install_quietly(marker: str) -> None:
    # the run command printed hundreds of lines of pip output before anything of ours;
    # -q keeps warnings and errors
    installs = [part for part in _block(marker).split("&&") if " install " in part]
    assert installs and all(" install -q " in part for part in installs), installs


def test_readme_is_one_screen_or_two() -> None:
    # issue 33: the README was 1,593 lines; everything beyond what it is, the two commands and
    # where to read on lives in docs/
    assert README.count("\n") <= 200
