"""The OpenTelemetry semantic conventions mana-ai's traces follow, pinned, and their names.

GenAI conventions are in development, and v1.37.0 renamed ``gen_ai.system`` to
``gen_ai.provider.name``. As their transition plan asks of instrumentations
(https://github.com/open-telemetry/semantic-conventions/blob/v1.37.0/docs/gen-ai/gen-ai-spans.md,
the warning at the top), mana-ai emits **v1.36.0** by default and the latest version it
supports, **v1.40.0**, when ``OTEL_SEMCONV_STABILITY_OPT_IN`` (a comma-separated list) holds
``gen_ai_latest_experimental``, and never both. What differs between the two here:

============================  ==========================  ============================
                              v1.36.0 (default)           v1.40.0 (opt-in)
============================  ==========================  ============================
the provider attribute        ``gen_ai.system``           ``gen_ai.provider.name``
``invoke_agent`` span kind    ``CLIENT``                  ``INTERNAL`` (an agent in
                                                          this process, since v1.38.0)
tracer's schema URL           .../schemas/1.36.0          .../schemas/1.40.0
============================  ==========================  ============================

Everything else is the same in both: span names ``invoke_agent {gen_ai.agent.name}``,
``chat {gen_ai.request.model}``, ``execute_tool {gen_ai.tool.name}`` (docs/gen-ai/
gen-ai-agent-spans.md, gen-ai-spans.md), the attributes below, and the metrics
``gen_ai.client.operation.duration`` (s) and ``gen_ai.client.token.usage`` ({token}) with
the bucket boundaries gen-ai-metrics.md advises. The opt-in content attributes
(``gen_ai.input.messages``, ``gen_ai.output.messages``, ``gen_ai.tool.call.arguments``,
``gen_ai.tool.call.result``, recorded as JSON strings) exist from v1.37.0 / v1.38.0 on;
with ``MANA_AI_OTEL_CAPTURE_CONTENT=true`` they are recorded under v1.36.0 too, which had
only per-message log events for content (not emitted).

``gen_ai.provider.name`` / ``gen_ai.system`` is ``openai`` for an OpenAI-compatible endpoint
(the conventions name the API's flavour, not who serves the model; ``server.address`` says
that) and ``_OTHER`` for the embedded model. Attributes of mana-ai's own are under
``mana_ai.``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "CHAT_DURATION_BUCKETS_S",
    "LATEST_OPT_IN",
    "TOKEN_USAGE_BUCKETS",
    "Conventions",
    "conventions_for",
    "wants_latest",
]

LATEST_OPT_IN = "gen_ai_latest_experimental"
"""The ``OTEL_SEMCONV_STABILITY_OPT_IN`` value that selects the latest GenAI conventions."""

CHAT_DURATION_BUCKETS_S = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92
)  # fmt: skip
"""``gen_ai.client.operation.duration``'s advised bucket boundaries, in seconds."""

TOKEN_USAGE_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864
)  # fmt: skip
"""``gen_ai.client.token.usage``'s advised bucket boundaries, in tokens."""


@dataclass(frozen=True)
class Conventions:
    """One pinned version of the GenAI conventions (see the module docstring).

    Attributes:
        version: the semantic-conventions release, e.g. ``1.36.0``.
        provider_attribute: ``gen_ai.system`` or ``gen_ai.provider.name``.
        invoke_agent_internal: the ``invoke_agent`` span is ``INTERNAL`` (else ``CLIENT``).
    """

    version: str
    provider_attribute: str
    invoke_agent_internal: bool

    @property
    def schema_url(self) -> str:
        """The release's schema URL, e.g. ``https://opentelemetry.io/schemas/1.36.0``."""
        return f"https://opentelemetry.io/schemas/{self.version}"


DEFAULT = Conventions("1.36.0", "gen_ai.system", invoke_agent_internal=False)
LATEST = Conventions("1.40.0", "gen_ai.provider.name", invoke_agent_internal=True)


def wants_latest(opt_in: str | None) -> bool:
    """Whether an ``OTEL_SEMCONV_STABILITY_OPT_IN`` value (comma-separated, spaces and case
    ignored) asks for the latest GenAI conventions."""
    if not opt_in:
        return False
    return LATEST_OPT_IN in {part.strip().lower() for part in opt_in.split(",")}


def conventions_for(environ: Mapping[str, str]) -> Conventions:
    """The conventions the OpenTelemetry variables in ``environ`` select."""
    return LATEST if wants_latest(environ.get("OTEL_SEMCONV_STABILITY_OPT_IN")) else DEFAULT
