"""OpenTelemetry traces of missions, in the GenAI semantic conventions (optional: ``[otel]``).

Off unless ``MANA_AI_OTEL`` is on (its default follows ``OTEL_EXPORTER_OTLP_ENDPOINT``).
Importing this package, or ``worker.tracing.hooks``, loads no OpenTelemetry module: the
runner and the chat models reach tracing only through ``hooks``, whose functions do nothing
(one comparison, or one ``ContextVar.get``) while tracing is off. The rest is imported by
the composition root (``worker.daemon.app``) when tracing is on:

* ``conventions``: the pinned semantic-convention versions and attribute names;
* ``setup``: the tracer and meter providers with the SDK's OTLP/HTTP exporters;
* ``run_spans``: a run's events (``planner.events``) as ``invoke_agent`` / ``execute_tool`` /
  ``compaction`` spans;
* ``chat_spans``: ``TracedChatModel``, a ``chat`` span (and the ``gen_ai.client.*`` metrics)
  per LLM request;
* ``content``: the opt-in message and payload attributes (``MANA_AI_OTEL_CAPTURE_CONTENT``).
"""
