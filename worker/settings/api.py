"""The settings of `mana-ai serve`, the HTTP API and console: ``ApiSettings``
(``Settings.api``)."""

from __future__ import annotations

from pydantic import Field

from worker.settings.values import DAY_S, MIB, EndpointUrl, Section

__all__ = ["ApiSettings"]


class ApiSettings(Section):
    """``MANA_AI_API_*`` and ``MANA_AI_CONSOLE_URL``."""

    host: str = Field(
        default="127.0.0.1",
        min_length=1,
        description=(
            "Address `mana-ai serve` (the HTTP API under /api/v1 and the web console under /) "
            "listens on. Default 127.0.0.1 (this host only); set 0.0.0.0 to serve other "
            "machines, behind a TLS-terminating proxy: every request needs an admin token "
            "(`mana-ai admin token create`)."
        ),
    )
    port: int = Field(
        default=8080,
        ge=0,
        le=65535,
        description=(
            "TCP port of `mana-ai serve`; 0 picks a free port (printed at start). Default 8080."
        ),
    )
    session_ttl_s: float = Field(
        default=12 * 3600.0,
        ge=60,
        le=30 * DAY_S,
        description=(
            "Seconds a console sign-in lasts (60 to 2592000); after that the browser is sent "
            "to the sign-in page again. Signing out, or revoking the token, ends it at once. "
            "Default 43200 (12 hours)."
        ),
    )
    max_body_bytes: int = Field(
        default=MIB,
        ge=1024,
        le=64 * MIB,
        description=(
            "Bytes of a request body `mana-ai serve` reads at most (1024 to 67108864); a "
            "larger one is answered 413 without being read. Default 1048576 (1 MiB)."
        ),
    )
    console_url: EndpointUrl = Field(
        default=None,
        description=(
            "The console's address as people reach it (e.g. https://mana.example.com, behind "
            "a proxy): approval webhooks then carry a link to the request "
            "(<console_url>/approvals#approval-ID). Unset: the notices carry the CLI lines "
            "only."
        ),
    )
