"""OpenTelemetry tracing: ``TracingSettings`` (``Settings.tracing``): ``MANA_AI_OTEL`` and
``MANA_AI_OTEL_CAPTURE_CONTENT``; the exporter itself reads the standard ``OTEL_*`` variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from worker.settings.values import OnOff, Section

__all__ = ["OTLP_ENDPOINT_VARIABLES", "TracingSettings", "default_otel", "otel_variables"]


OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
"""The OpenTelemetry SDK's variables naming where traces go: setting one turns tracing on."""


def default_otel() -> Literal["on", "off"]:
    """``on`` when an OTLP endpoint is configured (and ``OTEL_SDK_DISABLED`` is not true),
    else ``off``: the OpenTelemetry SDK's own variables decide, as for any instrumented
    program."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return "off"
    return "on" if any(os.environ.get(v, "").strip() for v in OTLP_ENDPOINT_VARIABLES) else "off"


def otel_variables(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``OTEL_*`` variables of ``environ`` (default: the process environment), for the
    tracing setup: the OpenTelemetry SDK reads the ones it knows itself (endpoints, headers,
    sampler, resource); mana-ai reads ``OTEL_SEMCONV_STABILITY_OPT_IN`` from this and
    ``MANA_AI_OTEL``'s default from ``OTLP_ENDPOINT_VARIABLES``."""
    env = os.environ if environ is None else environ
    return {key: value for key, value in env.items() if key.startswith("OTEL_")}


class TracingSettings(Section):
    """Whether traces are sent, and whether they carry content."""

    otel: OnOff = Field(
        default_factory=default_otel,
        description=(
            "Send OpenTelemetry traces of missions (invoke_agent, chat, execute_tool and "
            "compaction spans in the GenAI semantic conventions) and the gen_ai.client.* "
            "metrics over OTLP/HTTP, configured by the standard OTEL_* variables "
            "(OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER, ...). Needs "
            "the optional dependencies: pip install 'mana-ai[otel]'. 'on' or 'off'. Default: "
            "on when OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set "
            "(and OTEL_SDK_DISABLED is not true), else off; off costs nothing."
        ),
    )
    capture_content: bool = Field(
        default=False,
        description=(
            "Record prompts, replies and tool arguments and results on the trace spans "
            "(gen_ai.input.messages, gen_ai.output.messages, gen_ai.tool.call.arguments, "
            "gen_ai.tool.call.result, as JSON) and the text of the reminders sent. They can "
            "hold personal data and secrets a tool returned: turn this on only where the "
            "trace store may keep them. Default false: spans carry names, ids, counts, "
            "durations and decisions only."
        ),
    )
