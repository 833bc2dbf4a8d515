"""What the HTTP API and the console work with: the stores on the server's database, the
settings, and the names of the built-in tools (``Services``, made once at start)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from worker.queries.admin_tokens import AdminTokenStore
from worker.queries.approval_requests import ApprovalStore
from worker.queries.mcp_tokens import McpStore
from worker.queries.missions import AdminStore
from worker.queries.user_policy import PolicyStore
from worker.settings import Settings

__all__ = ["Services"]


@dataclass
class Services:
    """The stores of one server (every method is a short transaction of its own) and what it
    was configured with.

    Attributes:
        known_tools: the built-in tools' names (agents' ``tools`` are checked against them).
        session_ttl: how long a console sign-in lasts (``MANA_AI_API_SESSION_TTL_S``).
    """

    settings: Settings
    engine: AsyncEngine
    known_tools: list[str]
    admin: AdminStore = field(init=False)
    approvals: ApprovalStore = field(init=False)
    policy: PolicyStore = field(init=False)
    mcp: McpStore = field(init=False)
    tokens: AdminTokenStore = field(init=False)

    def __post_init__(self) -> None:
        self.admin = AdminStore(self.engine)
        self.approvals = ApprovalStore(self.engine)
        self.policy = PolicyStore(self.engine)
        self.mcp = McpStore(self.engine)
        self.tokens = AdminTokenStore(self.engine)

    @property
    def session_ttl(self) -> timedelta:
        return timedelta(seconds=self.settings.api.session_ttl_s)
