"""``mana-ai --version`` as scripts use it: ``$(mana-ai --version)``."""

from __future__ import annotations

import pytest

from worker.cli import main
from worker.version import package_version


def test_the_version_goes_to_stdout_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out, err = capsys.readouterr()
    assert out == f"mana-ai {package_version()}\n"
    assert err == ""
