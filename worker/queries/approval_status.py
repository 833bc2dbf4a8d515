"""An approval request's status as it stands now, in SQL: a pending request past its
``expires_at`` is expired, whether or not a write has stored it so yet (every read of
``approval_requests`` uses it, so no reader shows a lapsed request as pending)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, case, func, literal, or_

from worker.db.tables import approval_requests

__all__ = ["current_status", "lapsed_or_expired"]

_r = approval_requests.c


def current_status() -> Any:
    """The ``status`` column as it stands now (labelled ``status``)."""
    return case(
        (and_(_r.status == "pending", _r.expires_at <= func.now()), literal("expired")),
        else_=_r.status,
    ).label("status")


def lapsed_or_expired() -> Any:
    """Expired, stored so or not yet (pending past its time to live)."""
    return or_(_r.status == "expired", and_(_r.status == "pending", _r.expires_at <= func.now()))
