"""The revision a command checks the database against is the newest script's."""

from __future__ import annotations

import migrations
from worker.store.migrate import head_revision


def test_the_head_revision_constant_is_the_newest_script() -> None:
    assert migrations.HEAD_REVISION == head_revision()
