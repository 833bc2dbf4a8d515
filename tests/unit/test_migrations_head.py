"""The revision a command checks the database against is the newest script's."""

from __future__ import annotations

from worker.db.migrate import head_revision
from worker.db.revision import HEAD_REVISION


def test_the_head_revision_constant_is_the_newest_script() -> None:
    assert HEAD_REVISION == head_revision()
