"""Deciding an approval request: one set of rules for every way a person does it
(``mana-ai approvals approve|deny``, the HTTP API, the console): who decides (the names rule)
and why (the text rule, ``MAX_NOTE_CHARS`` at most: a denial's reason is what the model
reads), then ``ApprovalStore.decide`` (the first decision wins)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from worker.names import checked_name, checked_text

if TYPE_CHECKING:
    from worker.queries.approval_requests import ApprovalStore

__all__ = ["MAX_NOTE_CHARS", "decide"]

MAX_NOTE_CHARS = 2_000
"""Longest note of an approval or reason of a denial (the model reads a denial's)."""


async def decide(
    store: ApprovalStore,
    request_id: int,
    *,
    approve: bool,
    by: str,
    note: str | None,
    labels: Callable[[str], str],
) -> dict[str, Any]:
    """Check who decides (``by``) and why (``note``: the approval's note or the denial's
    reason), then decide request ``request_id``; the request as decided. ``labels`` names the
    fields in messages (``by`` -> ``--by``; ``note`` -> ``--note`` / ``--reason``).

    Raises:
        UsageError: ``by`` or ``note`` is refused (nothing is decided).
        NotFoundError, ConflictError: as ``ApprovalStore.decide``.
    """
    who = checked_name(by, labels("by"))
    why = None if note is None else checked_text(note, labels("note"), MAX_NOTE_CHARS)
    return await store.decide(request_id, approve=approve, by=who, note=why)
