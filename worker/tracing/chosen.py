"""What a model or an LLM endpoint chose, as the spans carry it by default.

A span's name and attributes, its events and the metrics' attributes are indexed by trace
stores and kept for weeks, and what they carry by default (``MANA_AI_OTEL_CAPTURE_CONTENT``
off) is meant to be names, ids, counts and decisions, never content. Some of those values
are chosen by the model or by the endpoint, not by mana-ai or its operator, and may be
anything: a tool name the model invented (3,016 characters were seen), a response id, a
response model, a finish reason. So:

* a **tool name** is exported as the model wrote it only when it is one of the tools the run
  offered (``tool_name``); any other is content: ``OTHER`` (``_OTHER``, the conventions' value
  for what lies outside a known set, as ``gen_ai.provider.name`` uses it) unless content is
  captured, and then ``bounded``;
* the **other chosen values** (``gen_ai.tool.call.id``, ``gen_ai.response.id``,
  ``gen_ai.response.model``, ``gen_ai.response.finish_reasons``) are recommended attributes of
  the conventions, not opt-in ones: they are exported ``bounded``.

Metrics never carry a chosen value (``worker.tracing.chat_spans``; the Prometheus
``tool`` labels count an invented name as ``(unknown)``, ``worker.run.run_metrics``).
"""

from __future__ import annotations

from collections.abc import Collection

from worker.terminal_text import visible_line

__all__ = ["MAX_CHOSEN_CHARS", "OTHER", "bounded", "tool_name"]

OTHER = "_OTHER"
"""What a tool name the run did not offer is exported as, content capture off."""

MAX_CHOSEN_CHARS = 128
"""Characters of a chosen value a span keeps (an ``…`` follows a cut): real ids and model
names are under 64."""


def bounded(text: str, limit: int = MAX_CHOSEN_CHARS) -> str:
    """``text`` on one line, its hidden characters as escapes (``visible_line``: ``\\u202e``,
    ``\\n``), cut to ``limit`` characters with an ``…`` after a cut: ``limit + 1`` at most."""
    shown = visible_line(text[: limit + 1])
    return shown if len(shown) <= limit else shown[:limit] + "…"


def tool_name(name: str, offered: Collection[str], *, capture_content: bool) -> str:
    """``gen_ai.tool.name`` of a call to tool ``name`` in a run that offered the tools named
    ``offered``: ``name`` (``bounded``) when offered; else ``OTHER``, or ``bounded`` with
    ``capture_content``."""
    if name in offered or capture_content:
        return bounded(name)
    return OTHER
