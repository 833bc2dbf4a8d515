"""Writes deploy/grafana/mana-ai.json, the mana-ai Grafana dashboard, from the panels below.

    python deploy/grafana/dashboard.py > deploy/grafana/mana-ai.json

The JSON is what Grafana provisions (deploy/grafana/provisioning/) or imports (Dashboards >
New > Import > Upload JSON file; pick the Prometheus data source when asked). Edit the panels
here, not in the JSON: tests/unit/test_dashboard.py checks the file is this script's output
and its structure, and tests/e2e/test_monitoring.py evaluates every panel's query against a
Prometheus that scrapes a live worker. Queries use the worker's own metrics (docs/reference/
metrics.md), not the recording rules, so the dashboard works without them.

Variables: ``datasource`` (a Prometheus data source) and ``model`` (the LLM panels, from the
``model`` label). Grafana fills ``$__rate_interval`` (at least four scrape intervals) and
``$__range`` (the time picked).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

UID = "mana-ai"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = "__auto"


@dataclass(frozen=True)
class Panel:
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 8
    height: int = 8
    thresholds: tuple[tuple[str, float | None], ...] = ()
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


RATE = "[$__rate_interval]"
MODEL = '{model=~"$model"}'
MODEL_ERR = '{model=~"$model", outcome="error"}'


def quantiles(
    metric: str, by: str = "", selector: str = "", qs: tuple[float, ...] = ()
) -> tuple[Query, ...]:
    by_clause = f"le, {by}" if by else "le"
    legend = f"p{{q}} {{{{{by}}}}}" if by else "p{q}"
    return tuple(
        Query(
            f"histogram_quantile({q}, sum by ({by_clause}) "
            f"(rate({metric}_bucket{selector}{RATE})))",
            legend.format(q=round(q * 100)),
        )
        for q in qs
    )


ROWS = (
    Row(
        "Missions",
        (
            Panel(
                "Missions run by outcome",
                "Runs per second by outcome: succeeded, failed (LLM errors, cut or filtered "
                "answers, budgets), interrupted (shutdown, database), lease_lost, skipped.",
                (
                    Query(
                        f"sum by (outcome) (rate(mana_ai_missions_run_total{RATE}))", "{{outcome}}"
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Failed share",
                "Share of the runs in the time range that failed.",
                (
                    Query(
                        '(sum(increase(mana_ai_missions_run_total{outcome="failed"}[$__range])) '
                        "or vector(0)) / sum(increase(mana_ai_missions_run_total[$__range]))",
                        "failed",
                    ),
                ),
                unit="percentunit",
                kind="stat",
                width=4,
                thresholds=(("green", None), ("orange", 0.05), ("red", 0.1)),
            ),
            Panel(
                "Workers up",
                'Workers Prometheus scrapes (job "mana-ai") that answer.',
                (Query('sum(up{job="mana-ai"})', "up"),),
                kind="stat",
                width=4,
                thresholds=(("red", None), ("green", 1)),
            ),
            Panel(
                "Missions running and claimed",
                "Missions running now, and missions claimed per second, over all workers.",
                (
                    Query("sum(mana_ai_missions_running)", "running"),
                    Query(f"sum(rate(mana_ai_missions_claimed_total{RATE}))", "claimed/s"),
                ),
            ),
            Panel(
                "Iteration duration",
                "One run, claim to stored iteration: percentiles over all workers.",
                quantiles("mana_ai_iteration_duration_seconds", qs=(0.5, 0.95, 0.99)),
                unit="s",
            ),
            Panel(
                "Ticks",
                "Ticks per second by outcome, and the 95th percentile of their duration "
                "(claiming and starting missions).",
                (
                    Query(f"sum by (outcome) (rate(mana_ai_ticks_total{RATE}))", "{{outcome}}"),
                    *quantiles("mana_ai_tick_duration_seconds", qs=(0.95,)),
                ),
            ),
            Panel(
                "Seconds since the last good tick",
                "Per worker; past the dashed limit (3 x MANA_AI_TICK_INTERVAL_S + 30) /healthz "
                "answers 503 and ManaAiTickStalled fires.",
                (
                    Query(  # a stale-after of 0 is a process that does not tick (mcp serve)
                        "max by (instance) (time() - mana_ai_last_ok_tick_timestamp_seconds "
                        "and mana_ai_tick_stale_after_seconds > 0)",
                        "{{instance}}",
                    ),
                    Query("max(mana_ai_tick_stale_after_seconds > 0)", "limit"),
                ),
                unit="s",
            ),
            Panel(
                "Leases lost",
                "Runs a worker abandoned because another took its lease (it stalled past "
                "MANA_AI_LEASE_S).",
                (
                    Query(
                        f"sum by (instance) (increase(mana_ai_leases_lost_total{RATE}))",
                        "{{instance}}",
                    ),
                ),
            ),
        ),
    ),
    Row(
        "LLM",
        (
            Panel(
                "LLM request latency by model",
                "One chat completion, retries and the fallback included: median and 95th "
                "percentile per model.",
                quantiles("mana_ai_llm_request_duration_seconds", "model", MODEL, (0.5, 0.95)),
                unit="s",
            ),
            Panel(
                "LLM requests and errors by model",
                "Chat completions per second by model; errors are requests that failed after "
                "their retries and the fallback.",
                (
                    Query(
                        f"sum by (model, outcome) (rate(mana_ai_llm_requests_total{MODEL}{RATE}))",
                        "{{model}} {{outcome}}",
                    ),
                ),
                unit="reqps",
            ),
            Panel(
                "LLM retries and fallbacks by model",
                "Attempts retried per second by reason (http_<status>, timeout, connection), "
                "and requests sent to the fallback endpoint.",
                (
                    Query(
                        f"sum by (model, reason) (rate(mana_ai_llm_retries_total{MODEL}{RATE}))",
                        "retry {{model}} {{reason}}",
                    ),
                    Query(
                        f"sum by (model) (rate(mana_ai_llm_fallbacks_total{MODEL}{RATE}))",
                        "fallback {{model}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Tokens by model",
                "Prompt and completion tokens per second (estimated where the endpoint reports "
                "none).",
                (
                    Query(
                        f"sum by (model, kind) (rate(mana_ai_llm_tokens_total{MODEL}{RATE}))",
                        "{{model}} {{kind}}",
                    ),
                ),
            ),
        ),
    ),
    Row(
        "Tools",
        (
            Panel(
                "Tool calls by tool and outcome",
                "Calls per second: ok, error, denied (enforce), unknown (a write whose worker "
                "stopped under it).",
                (
                    Query(
                        f"sum by (tool, outcome) (rate(mana_ai_tool_calls_total{RATE}))",
                        "{{tool}} {{outcome}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Tool duration by tool (p95)",
                "One call that ran, policy gate included.",
                quantiles("mana_ai_tool_duration_seconds", "tool", qs=(0.95,)),
                unit="s",
            ),
            Panel(
                "Parallel read batches and MCP servers lost",
                "Groups of reads of one round that ran side by side, per second; agents' MCP "
                "servers that could not be used at the start of an iteration.",
                (
                    Query(
                        f"sum(rate(mana_ai_parallel_read_batches_total{RATE}))", "read batches/s"
                    ),
                    Query(
                        f"sum(increase(mana_ai_mcp_source_failures_total{RATE}))",
                        "MCP servers unavailable",
                    ),
                ),
            ),
        ),
    ),
    Row(
        "Policy gate",
        (
            Panel(
                "Decisions by reason and mode",
                "The gate's verdicts per second; in log-only a deny is a would-be denial (the "
                "call ran).",
                (
                    Query(
                        "sum by (mode, decision, reason) "
                        f"(rate(mana_ai_policy_decisions_total{RATE}))",
                        "{{mode}} {{decision}} {{reason}}",
                    ),
                ),
                unit="ops",
                width=10,
            ),
            Panel(
                "Would-be deny share, 7 days",
                "Log-only decisions over the last week that enforce would have denied: switch "
                "MANA_AI_POLICY_MODE to enforce when it stays under 1 %. Beside it, the share "
                "enforce would hold for a person's approval (MANA_AI_POLICY_DESTRUCTIVE=ask).",
                (
                    Query(
                        "(sum(increase(mana_ai_policy_decisions_total"
                        '{mode="log-only", decision="deny"}[7d])) or vector(0)) / '
                        'sum(increase(mana_ai_policy_decisions_total{mode="log-only"}[7d]))',
                        "would-be deny share",
                    ),
                    Query(
                        "(sum(increase(mana_ai_policy_decisions_total"
                        '{mode="log-only", decision="ask"}[7d])) or vector(0)) / '
                        'sum(increase(mana_ai_policy_decisions_total{mode="log-only"}[7d]))',
                        "would-be approval share",
                    ),
                ),
                unit="percentunit",
                kind="stat",
                width=4,
                thresholds=(("green", None), ("red", 0.01)),
            ),
            Panel(
                "Would-be deny share by reason, 1 day",
                "Share of the last day's log-only decisions that were deny verdicts, by reason.",
                (
                    Query(
                        "sum by (reason) (rate(mana_ai_policy_decisions_total"
                        '{mode="log-only", decision="deny"}[1d])) / scalar('
                        'sum(rate(mana_ai_policy_decisions_total{mode="log-only"}[1d])))',
                        "{{reason}}",
                    ),
                ),
                unit="percentunit",
                width=5,
            ),
            Panel(
                "Injection flags by tool",
                "Calls whose arguments carried prompt-injection markers (flagged, never blocked).",
                (
                    Query(
                        f"sum by (tool) (increase(mana_ai_policy_injection_flags_total{RATE}))",
                        "{{tool}}",
                    ),
                ),
                width=5,
            ),
        ),
    ),
    Row(
        "Reminders and compaction",
        (
            Panel(
                "Reminders by producer",
                "Reminders sent with requests per second.",
                (
                    Query(
                        f"sum by (producer) (rate(mana_ai_reminders_injected_total{RATE}))",
                        "{{producer}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Compactions and failures",
                "Compactions per second, and compactions tried that changed nothing, by reason.",
                (
                    Query(f"sum(rate(mana_ai_compactions_triggered_total{RATE}))", "compacted"),
                    Query(
                        f"sum by (reason) (rate(mana_ai_compaction_failures_total{RATE}))",
                        "failed {{reason}}",
                    ),
                ),
                unit="ops",
            ),
            Panel(
                "Turns folded per compaction",
                "Average turns one compaction folded (fewer than 3 usually means a context "
                "set too small).",
                (
                    Query(
                        f"sum(rate(mana_ai_compacted_turns_sum{RATE})) / "
                        f"sum(rate(mana_ai_compacted_turns_count{RATE}))",
                        "turns folded",
                    ),
                ),
            ),
        ),
    ),
    Row(
        "Approvals and database",
        (
            Panel(
                "Approvals pending",
                "Destructive calls parked until a person decides (the whole database: every "
                "worker reports the same, hence max).",
                (
                    Query("max(mana_ai_approvals_pending)", "pending"),
                    Query("max(mana_ai_approval_oldest_pending_seconds)", "oldest (s)"),
                ),
                width=6,
            ),
            Panel(
                "Approval decisions and requests",
                "Decisions per second by decision (the database's: max over workers); "
                "requests stored by consumer and webhooks by outcome (per worker: sum).",
                (
                    Query(
                        f"max by (decision) (rate(mana_ai_approvals_total{RATE}))",
                        "{{decision}}",
                    ),
                    Query(
                        f"sum by (consumer) (rate(mana_ai_approval_requests_total{RATE}))",
                        "requested by {{consumer}}",
                    ),
                    Query(
                        f"sum by (outcome) (rate(mana_ai_approval_webhooks_total{RATE}))",
                        "webhook {{outcome}}",
                    ),
                ),
                unit="ops",
                width=6,
            ),
            Panel(
                "Database pool use",
                "Connections used of the most each worker's pool holds (main: missions and "
                "wake-ups; gate: the policy gate's own); a statement finding none free waits.",
                (
                    Query(
                        'sum by (instance, pool) (mana_ai_db_pool_connections{state="used"}) / '
                        "sum by (instance, pool) (mana_ai_db_pool_max_connections)",
                        "{{instance}} {{pool}}",
                    ),
                ),
                unit="percentunit",
                width=12,
            ),
        ),
    ),
)


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    steps = [{"color": color, "value": value} for color, value in panel.thresholds] or [
        {"color": "green", "value": None}
    ]
    options: dict[str, Any]
    if panel.kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "auto",
        }
    else:
        options = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    return {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {
            "defaults": {
                "unit": panel.unit,
                "thresholds": {"mode": "absolute", "steps": steps},
                **({"min": 0} if panel.kind == "timeseries" else {}),
            },
            "overrides": [],
        },
        "options": {**options, **panel.options},
        "targets": [
            {
                "refId": chr(ord("A") + n),
                "datasource": DATASOURCE,
                "expr": query.expr,
                "legendFormat": query.legend,
                "range": panel.kind != "stat",
                "instant": panel.kind == "stat",
            }
            for n, query in enumerate(panel.queries)
        ],
    }


def dashboard() -> dict[str, Any]:
    """The dashboard's JSON model (Grafana's schema version 39)."""
    panels: list[dict[str, Any]] = []
    panel_id, y = 1, 0
    for row in ROWS:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id, y, x, tallest = panel_id + 1, y + 1, 0, 0
        for panel in row.panels:
            if x + panel.width > WIDTH:
                x, y, tallest = 0, y + tallest, 0
            panels.append(_panel(panel, panel_id, x, y))
            panel_id, x, tallest = panel_id + 1, x + panel.width, max(tallest, panel.height)
        y += tallest
    return {
        "uid": UID,
        "title": "mana-ai",
        "description": "Missions, LLM, tools, the policy gate's rollout, reminders, compaction, "
        "approvals and the database of mana-ai workers (deploy/grafana/dashboard.py).",
        "tags": ["mana-ai"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                    "refresh": 1,
                    "regex": "",
                    "options": [],
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "definition": "label_values(mana_ai_llm_requests_total, model)",
                    "query": {
                        "query": "label_values(mana_ai_llm_requests_total, model)",
                        "refId": "PrometheusVariableQueryEditor-VariableQuery",
                    },
                    "includeAll": True,
                    "allValue": ".*",
                    "multi": True,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
                    "hide": 0,
                    "refresh": 2,
                    "sort": 1,
                    "regex": "",
                    "options": [],
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    """The file's text: the dashboard as indented JSON, ending with a newline."""
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
