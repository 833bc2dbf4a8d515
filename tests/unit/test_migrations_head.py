"""The revision a command checks the database against is the newest script's."""

from __future__ import annotations

from worker.store.migrate import HEAD_REVISION, head_revision


def test_the_head_revision_constant_is_the_newest_script() -> None:
    assert HEAD_REVISION == head_revision()
