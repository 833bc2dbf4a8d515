"""The policy gate's settings and those of approvals: ``PolicySettings`` (``Settings.policy``),
what every consumer of the tools (a mission, an MCP client) may run, and how a person is asked
about a destructive call."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from worker.settings.values import (
    DAY_S,
    CaseInsensitive,
    CommaList,
    EndpointUrl,
    Section,
    ToolRateLimits,
)

__all__ = ["PolicySettings"]


class PolicySettings(Section):
    """``MANA_AI_POLICY_*`` and ``MANA_AI_APPROVAL_*``."""

    mode: Annotated[Literal["off", "log-only", "enforce"], CaseInsensitive] = Field(
        default="log-only",
        description=(
            "The policy gate's mode for every tool call: 'off' (no rules, nothing recorded), "
            "'log-only' (decide and record every call, never block: roll out with this and read "
            "`mana-ai policy report`) or 'enforce' (a denied call does not run; the model is "
            "told why). An agent's --policy-mode overrides it. Default log-only."
        ),
    )
    rate_limit: int = Field(
        default=30,
        ge=1,
        le=100_000,
        description=(
            "Tool calls per user and tool allowed in a rolling MANA_AI_POLICY_RATE_WINDOW_S "
            "window (exact across replicas). Overridable per tool "
            "(MANA_AI_POLICY_TOOL_RATE_LIMITS) and per user (`mana-ai policy set-rate-limit`). "
            "Default 30."
        ),
    )
    rate_window_s: float = Field(
        default=60.0,
        gt=0,
        le=86_400,
        description="Seconds of the rate limit's rolling window. Default 60.",
    )
    tool_rate_limits: ToolRateLimits = Field(
        default_factory=dict,
        description=(
            "Per-tool rate limits for every user, as tool=calls pairs separated by commas, "
            "e.g. 'notes_create=10,notes_delete=5'. Unset: MANA_AI_POLICY_RATE_LIMIT for "
            "every tool."
        ),
    )
    injection_markers: CommaList = Field(
        default=(),
        description=(
            "Extra prompt-injection markers to flag in tool-call arguments, separated by "
            "commas (or a JSON array when a marker contains a comma), added to the built-in "
            "'{{', '<system', 'ignore previous' and 'ignore all previous'. Flagged calls are "
            "counted and recorded, never blocked. Matching ignores case, whitespace runs, "
            "accents, zero-width characters and Unicode compatibility forms."
        ),
    )
    mission_scopes: CommaList = Field(
        default=(),
        description=(
            "Tool scopes that missions may use, separated by commas (e.g. 'notes,clock'); a "
            "call of a tool in another scope is denied (scope_not_exposed). Unset: every scope."
        ),
    )
    destructive: Annotated[Literal["deny", "ask"], CaseInsensitive] = Field(
        default="deny",
        description=(
            "What the gate does in enforce mode with a destructive call the user has not opted "
            "in to: 'deny' (refused, the model is told why) or 'ask' (the call waits for a "
            "person: an approval request is stored, the iteration parks as awaiting_approval "
            "without holding a lease, and `mana-ai approvals approve|deny` decides; the run "
            "then goes on from its checkpoint). An agent's --destructive overrides it. In "
            "log-only the call runs and the request is only recorded as a would-be ask. "
            "Default deny."
        ),
    )
    approval_ttl_s: float = Field(
        default=float(DAY_S),
        ge=1,
        le=365 * DAY_S,
        description=(
            "Seconds an approval request waits for a decision (1 to 31536000); after that it "
            "is expired, which counts as denied: the parked run goes on and the model is told "
            "nobody approved the call. Default 86400 (one day)."
        ),
    )
    approval_webhook_url: EndpointUrl = Field(
        default=None,
        repr=False,  # incoming-webhook URLs carry their secret
        description=(
            "An http(s) URL that gets a JSON POST for every new approval request (its id, "
            "user, agent, mission, tool, arguments, why, when it expires, the commands that "
            "decide it, and a one-line 'text' that chat incoming webhooks such as Slack's "
            "show). Delivery is retried with exponential backoff for about two minutes and "
            "never holds up a mission; failures are logged and counted "
            "(mana_ai_approval_webhooks_total). The URL is never logged. Unset: nobody is "
            "notified (watch `mana-ai approvals list` or mana_ai_approvals_pending)."
        ),
    )
