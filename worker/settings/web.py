"""The built-in ``web_fetch`` tool's settings: ``WebSettings`` (``Settings.web``,
``MANA_AI_WEB_*``)."""

from __future__ import annotations

from pydantic import Field

from worker.settings.values import HOUR_S, Domains, Section

__all__ = ["WebSettings"]


class WebSettings(Section):
    """``MANA_AI_WEB_*``: what ``web_fetch`` may reach and how much it reads."""

    allow_private: bool = Field(
        default=False,
        description=(
            "Let web_fetch reach loopback, private (RFC 1918, fc00::/7), link-local, shared "
            "(100.64.0.0/10) and other non-public addresses. Default false: they are refused "
            "after DNS resolution and on every redirect, so an agent cannot reach services "
            "inside your network. Cloud metadata (169.254.169.254, ...), unspecified, "
            "multicast and reserved addresses stay refused even when true."
        ),
    )
    allow_domains: Domains = Field(
        default=(),
        description=(
            "Comma-separated domains web_fetch may read, each with its subdomains, e.g. "
            "'python.org,wikipedia.org'. Empty (default): any domain with a public address."
        ),
    )
    deny_domains: Domains = Field(
        default=(),
        description=(
            "Comma-separated domains web_fetch must not read, each with its subdomains; "
            "wins over MANA_AI_WEB_ALLOW_DOMAINS. Default: none."
        ),
    )
    timeout_s: float = Field(
        default=20.0,
        gt=0,
        le=HOUR_S,
        description=(
            "Seconds (at most 3600) one web_fetch may take in all: DNS, connecting, every "
            "redirect and the body (one overall deadline, not a per-read timeout)."
        ),
    )
    max_bytes: int = Field(
        default=2_000_000,
        ge=1,
        le=1_000_000_000,
        description=(
            "Response body bytes web_fetch reads at most (after gzip decoding; 1 to "
            "1000000000); it stops reading there and marks the result truncated."
        ),
    )
    max_chars: int = Field(
        default=20_000,
        ge=1,
        le=10_000_000,
        description=(
            "Characters of text web_fetch returns at most (about 5,000 tokens at the default; "
            "1 to 10000000), after HTML is reduced to text; longer text is cut and marked "
            "truncated."
        ),
    )
    max_redirects: int = Field(
        default=5,
        ge=0,
        le=20,
        description=(
            "Redirects web_fetch follows at most (0-20); each hop is checked like the first URL."
        ),
    )
