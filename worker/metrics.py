"""Every Prometheus object mana-ai exports, in one module, and the /metrics + /healthz server.

Names follow the Prometheus naming guide (``mana_ai_`` prefix, base units, ``_total`` for
counters, ``_seconds`` for durations). Label values are bounded: outcomes are fixed words,
``tool`` is a built-in tool's name or ``SERVER__*`` for any tool of an MCP server an operator
configured (``tool_label``: a server lists what names it likes), and ``model`` a model name
an operator configured (an agent's ``--model``, ``MANA_AI_LLM_MODEL``,
``MANA_AI_COMPACT_MODEL``), never one a reply named. ``deploy/grafana/mana-ai.json`` and
``deploy/prometheus/`` read these names: a renamed metric or label breaks them (their live
test says which).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

__all__ = [
    "APPROVALS",
    "APPROVAL_DECISIONS",
    "APPROVAL_REQUESTS",
    "APPROVAL_WEBHOOKS",
    "COMPACTED_TURNS",
    "COMPACTIONS_TRIGGERED",
    "COMPACTION_FAILURES",
    "DB_POOLS",
    "ITERATION_DURATION",
    "LAST_OK_TICK",
    "LEASES_LOST",
    "LLM_FALLBACKS",
    "LLM_REQUESTS",
    "LLM_REQUEST_DURATION",
    "LLM_RETRIES",
    "LLM_TOKENS",
    "MCP_SOURCE_FAILURES",
    "MCP_TOOL_CALLS",
    "MISSED_RUNS",
    "MISSIONS_CLAIMED",
    "MISSIONS_RUN",
    "MISSIONS_RUNNING",
    "PARALLEL_READ_BATCHES",
    "POLICY_DECISIONS",
    "POLICY_INJECTION_FLAGS",
    "REMINDERS_INJECTED",
    "REMINDER_PRODUCER_ERRORS",
    "TICKS",
    "TICK_DURATION",
    "TICK_STALE_AFTER",
    "TOOL_CALLS",
    "TOOL_DURATION",
    "UNNAMED_MODEL",
    "ApprovalStats",
    "DatabasePools",
    "HealthState",
    "MetricsServer",
]

MISSIONS_RUN = Counter(
    "mana_ai_missions_run_total",
    "Mission runs by outcome (succeeded, failed, interrupted, lease_lost, skipped, "
    "awaiting_approval: parked until a person decides on a call).",
    ["outcome"],
)
MISSIONS_CLAIMED = Counter("mana_ai_missions_claimed_total", "Missions claimed by this worker.")
MISSED_RUNS = Counter(
    "mana_ai_missed_runs_total",
    "Runs not run because they were missed (due more than a minute before a worker could "
    "start them) and their mission's catch-up policy is skip.",
    ["catch_up"],
)
MISSIONS_RUNNING = Gauge("mana_ai_missions_running", "Missions this worker is running now.")
ITERATION_DURATION = Histogram(
    "mana_ai_iteration_duration_seconds",
    "Wall time of one mission run, claim to stored iteration.",
    buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
TICKS = Counter("mana_ai_ticks_total", "Ticks by outcome (ok, error).", ["outcome"])
TICK_DURATION = Histogram(
    "mana_ai_tick_duration_seconds",
    "Wall time of one tick: claiming due missions and starting them.",
)
LAST_OK_TICK = Gauge(
    "mana_ai_last_ok_tick_timestamp_seconds",
    "Unix time of the last tick that succeeded (the worker's start before the first one).",
)
TICK_STALE_AFTER = Gauge(
    "mana_ai_tick_stale_after_seconds",
    "Seconds without a successful tick after which /healthz answers 503 (3 x "
    "MANA_AI_TICK_INTERVAL_S + 30).",
)
LEASES_LOST = Counter(
    "mana_ai_leases_lost_total", "Runs abandoned because another worker took the lease."
)

UNNAMED_MODEL = "(default)"
"""The ``model`` label of a request that names no model (the endpoint's default)."""

LLM_REQUESTS = Counter(
    "mana_ai_llm_requests_total",
    "Chat completion requests by model (as the request named it) and outcome (ok, error).",
    ["model", "outcome"],
)
LLM_REQUEST_DURATION = Histogram(
    "mana_ai_llm_request_duration_seconds",
    "Wall time of one chat completion, retries and fallback included, by model.",
    ["model"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
LLM_RETRIES = Counter(
    "mana_ai_llm_retries_total",
    "Chat completion attempts that were retried, by model and reason (http_<status>, timeout, "
    "connection).",
    ["model", "reason"],
)
LLM_FALLBACKS = Counter(
    "mana_ai_llm_fallbacks_total",
    "Chat completions sent to the fallback endpoint because the primary failed, by model (the "
    "request's, not MANA_AI_LLM_FALLBACK_MODEL).",
    ["model"],
)
LLM_TOKENS = Counter(
    "mana_ai_llm_tokens_total",
    "Tokens reported by the LLM (estimated when it reports none), by model and kind (prompt, "
    "completion).",
    ["model", "kind"],
)
TOOL_CALLS = Counter(
    "mana_ai_tool_calls_total",
    "Tool calls by tool and outcome (ok, error, denied).",
    ["tool", "outcome"],
)


def tool_label(name: str) -> str:
    """The ``tool`` label of tool ``name``: the name of a built-in tool, ``SERVER__*`` for a
    tool of MCP server ``SERVER`` (its tools are namespaced ``SERVER__TOOL``; the server picks
    the ``TOOL`` part, and each new one would be new series)."""
    server, separator, _ = name.partition("__")  # worker.mcp.config.NAMESPACE_SEPARATOR
    return f"{server}__*" if separator else name


TOOL_DURATION = Histogram(
    "mana_ai_tool_duration_seconds",
    "Wall time of one tool call that ran (policy gate included), by tool.",
    ["tool"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
PARALLEL_READ_BATCHES = Counter(
    "mana_ai_parallel_read_batches_total",
    "Groups of consecutive read-only tool calls of one round that ran concurrently "
    "(two or more calls each).",
)

POLICY_DECISIONS = Counter(
    "mana_ai_policy_decisions_total",
    "Policy gate decisions by consumer (mission, mcp), decision (the rules' verdict: allow, "
    "deny, ask), reason (allowed, scope_not_exposed, destructive_not_opted_in, rate_limited, "
    "policy_unavailable, approval_required, approved, approval_denied, ...) and mode "
    "(log-only, enforce). In log-only a deny is a would-be denial and an ask a call enforce "
    "would hold for approval: the call ran.",
    ["consumer", "decision", "reason", "mode"],
)
POLICY_INJECTION_FLAGS = Counter(
    "mana_ai_policy_injection_flags_total",
    "Tool calls whose arguments carried prompt-injection markers (flagged, never blocked).",
    ["tool"],
)

MCP_TOOL_CALLS = Counter(
    "mana_ai_mcp_tool_calls_total",
    "Tool calls of MCP clients of `mana-ai mcp serve`, by tool (a name the client invented "
    "counts as (unknown)) and outcome (ok, error, denied).",
    ["tool", "outcome"],
)
MCP_SOURCE_FAILURES = Counter(
    "mana_ai_mcp_source_failures_total",
    "Agents' MCP servers that could not be connected to or listed at the start of an "
    "iteration (left out of it, or the iteration failed when the server was required).",
)

REMINDERS_INJECTED = Counter(
    "mana_ai_reminders_injected_total",
    "Reminders sent with a request, by producer.",
    ["producer"],
)
REMINDER_PRODUCER_ERRORS = Counter(
    "mana_ai_reminder_producer_errors_total",
    "Reminder producers that raised (skipped; the round went on), by producer.",
    ["producer"],
)

COMPACTIONS_TRIGGERED = Counter(
    "mana_ai_compactions_triggered_total",
    "Compactions of a mission's context that happened (one per firing).",
)
COMPACTED_TURNS = Histogram(
    "mana_ai_compacted_turns",
    "Turns folded by one compaction (fewer than 3 usually means a misconfigured max context).",
    buckets=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 30, 50),
)
COMPACTION_FAILURES = Counter(
    "mana_ai_compaction_failures_total",
    "Compactions tried that did not happen, by reason (llm_error, unusable_summary, "
    "nothing_to_fold).",
    ["reason"],
)

APPROVAL_REQUESTS = Counter(
    "mana_ai_approval_requests_total",
    "Approval requests this process stored (a destructive call parked until a person decides), "
    "by consumer (mission, mcp).",
    ["consumer"],
)
APPROVAL_WEBHOOKS = Counter(
    "mana_ai_approval_webhooks_total",
    "Approval-request notifications POSTed to MANA_AI_APPROVAL_WEBHOOK_URL, by outcome "
    "(delivered; failed: given up after its retries).",
    ["outcome"],
)

APPROVAL_DECISIONS = ("approved", "denied", "expired")
"""The ``decision`` label values of ``mana_ai_approvals_total``."""


class ApprovalStats(Collector):
    """The approval figures of the whole database, as the worker last read them (every replica
    exports the same values; aggregate with ``max without (instance)``):

    * ``mana_ai_approvals_total{decision}``: approval requests decided so far, by decision
      (``approved``, ``denied``, ``expired``: a pending request past its time to live). A
      counter: requests are never deleted and a decision is final, so it only grows.
    * ``mana_ai_approvals_pending``: approval requests waiting for a decision now.
    * ``mana_ai_approval_oldest_pending_seconds``: age of the oldest of them (0 when none).

    Decisions are taken by other processes (``mana-ai approvals``, the HTTP API), so the worker
    reads these from the database (``update``) instead of counting events; nothing is exported
    before the first read.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: tuple[dict[str, int], int, float] | None = None

    def update(self, decided: Mapping[str, int], pending: int, oldest_pending_s: float) -> None:
        """Set the figures: ``decided`` by decision (missing ones count 0), ``pending``
        requests, the age in seconds of the oldest pending one."""
        counts = {decision: int(decided.get(decision, 0)) for decision in APPROVAL_DECISIONS}
        with self._lock:
            self._snapshot = (counts, int(pending), max(0.0, float(oldest_pending_s)))

    def clear(self) -> None:
        """Export nothing again (as before the first ``update``)."""
        with self._lock:
            self._snapshot = None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshot = self._snapshot
        if snapshot is None:
            return
        counts, pending, oldest = snapshot
        decided = CounterMetricFamily(
            "mana_ai_approvals",
            "Approval requests decided in the whole database, by decision (approved, denied, "
            "expired); read from the database by each worker.",
            labels=["decision"],
        )
        for decision, value in counts.items():
            decided.add_metric([decision], value)
        yield decided
        yield GaugeMetricFamily(
            "mana_ai_approvals_pending",
            "Approval requests waiting for a decision (whole database).",
            value=pending,
        )
        yield GaugeMetricFamily(
            "mana_ai_approval_oldest_pending_seconds",
            "Age of the oldest approval request waiting for a decision; 0 when none waits.",
            value=oldest,
        )


APPROVALS = ApprovalStats()
REGISTRY.register(APPROVALS)


class DatabasePools(Collector):
    """The worker's database connection pools, read at each scrape:

    * ``mana_ai_db_pool_connections{pool, state}``: connections of ``pool`` (``main``: the
      missions' statements and the wake-up listener; ``gate``: the policy gate's own lane)
      that are ``used`` (checked out) or ``idle`` (open, waiting in the pool).
    * ``mana_ai_db_pool_max_connections{pool}``: the most ``pool`` ever holds (its size plus
      ``MANA_AI_DB_MAX_OVERFLOW``); a statement that finds them all used waits for one.

    ``watch`` registers a pool with a function reading ``(used, idle)`` (SQLAlchemy's
    ``pool.checkedout()`` and ``pool.checkedin()``); nothing is exported for a pool no one
    watches. The readers run in the scrape's thread and must only read counters.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pools: dict[str, tuple[Callable[[], tuple[int, int]], int]] = {}

    def watch(self, pool: str, read: Callable[[], tuple[int, int]], max_connections: int) -> None:
        """Export ``pool``: ``read() -> (used, idle)``, at most ``max_connections``."""
        with self._lock:
            self._pools[pool] = (read, max_connections)

    def forget(self, pool: str) -> None:
        """Stop exporting ``pool`` (its engine was disposed)."""
        with self._lock:
            self._pools.pop(pool, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            pools = dict(self._pools)
        if not pools:
            return
        connections = GaugeMetricFamily(
            "mana_ai_db_pool_connections",
            "Connections of the worker's database pool, by pool (main, gate) and state (used: "
            "checked out; idle: open in the pool).",
            labels=["pool", "state"],
        )
        most = GaugeMetricFamily(
            "mana_ai_db_pool_max_connections",
            "Connections the worker's database pool holds at most (size + overflow), by pool.",
            labels=["pool"],
        )
        for name, (read, max_connections) in sorted(pools.items()):
            used, idle = read()
            connections.add_metric([name, "used"], used)
            connections.add_metric([name, "idle"], idle)
            most.add_metric([name], max_connections)
        yield connections
        yield most


DB_POOLS = DatabasePools()
REGISTRY.register(DB_POOLS)


class HealthState:
    """Liveness of the tick: healthy while a tick succeeded within ``stale_after_s`` seconds
    (or the worker started less than that ago). Thread-safe reads; written by the tick."""

    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self.started_at = time.monotonic()
        self.last_ok_tick: float | None = None
        self.last_error: str | None = None
        # the same rule for Prometheus (the "tick stalled" alert) as for /healthz
        LAST_OK_TICK.set_to_current_time()
        TICK_STALE_AFTER.set(stale_after_s)

    def tick_ok(self) -> None:
        self.last_ok_tick = time.monotonic()
        self.last_error = None
        LAST_OK_TICK.set_to_current_time()

    def tick_failed(self, error: str) -> None:
        self.last_error = error

    def snapshot(self) -> tuple[bool, dict[str, object]]:
        """``(healthy, body)``: the body of ``/healthz``, ``{"status": "ok" | "stale",
        "seconds_since_last_ok_tick": float | None (None before the first tick succeeded),
        "last_error": str | None (why the latest tick failed; None once one succeeds)}``, as
        the health reference (``docs/reference/health.md``) documents it."""
        now = time.monotonic()
        reference = self.last_ok_tick if self.last_ok_tick is not None else self.started_at
        age = now - reference
        healthy = age <= self.stale_after_s
        return healthy, {
            "status": "ok" if healthy else "stale",
            "seconds_since_last_ok_tick": None if self.last_ok_tick is None else round(age, 3),
            "last_error": self.last_error,
        }


class MetricsServer:
    """HTTP on ``host:port`` in a daemon thread: ``GET /metrics`` (Prometheus text format)
    and ``GET /healthz`` (200 when healthy, else 503, with ``HealthState.snapshot``'s body).

    ``port=0`` binds a free port; read it back from ``.port``.
    """

    def __init__(self, host: str, port: int, health: HealthState) -> None:
        handler = _make_handler(health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="mana-ai-metrics", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _make_handler(health: HealthState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                healthy, body = health.snapshot()
                self._send(200 if healthy else 503, json.dumps(body).encode(), "application/json")
            else:
                self._send(404, b"not found: try /metrics or /healthz\n", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # quiet access log
            return

    return Handler
