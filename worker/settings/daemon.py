"""The worker daemon's settings: ``DaemonSettings`` (``Settings.daemon``): its name, tick,
concurrency, leases, wake-ups, shutdown and metrics endpoint."""

from __future__ import annotations

import os
import socket

from pydantic import Field

from worker.settings.values import DAY_S, MIN_TICK_INTERVAL_S, Name, Section

__all__ = ["DaemonSettings", "default_worker_id"]


def default_worker_id() -> str:
    """``<host name>:<process id>``: ``MANA_AI_WORKER_ID``'s default, unique per process."""
    return f"{socket.gethostname()}:{os.getpid()}"


class DaemonSettings(Section):
    """``MANA_AI_WORKER_ID``, ``_TICK_INTERVAL_S``, ``_MAX_CONCURRENT_MISSIONS``, ``_LEASE_S``,
    ``_WAKE_UP``, ``_SHUTDOWN_GRACE_S``, ``_METRICS_PORT`` and ``_METRICS_HOST``."""

    worker_id: Name = Field(
        default_factory=default_worker_id,
        description=(
            "This replica's name, stored as the lease owner and on every iteration. "
            "Default <hostname>:<pid>; must be unique among the replicas sharing a database."
        ),
    )
    tick_interval_s: float = Field(
        default=30.0,
        ge=MIN_TICK_INTERVAL_S,
        le=DAY_S,
        description=(
            "Seconds between two ticks (each tick claims and runs the due missions), "
            "0.1 to 86400. Below 0.1 s the scheduler's own resolution (and a busy database) "
            "would decide the real interval, not this setting."
        ),
    )
    max_concurrent_missions: int = Field(
        default=4,
        ge=1,
        le=1000,
        description=(
            "How many missions this worker runs at once (1-1000); also its claim size per tick."
        ),
    )
    lease_s: float = Field(
        default=60.0,
        ge=1,
        le=DAY_S,
        description=(
            "Seconds a claimed mission stays leased to this worker (1 to 86400). The owner "
            "renews the lease while the mission runs, so this must be longer than the renewal "
            "period (plus a database round trip); otherwise another replica may claim a mission "
            "that is still running. When the owner dies, others can claim the mission after "
            "this long."
        ),
    )
    wake_up: bool = Field(
        default=True,
        description=(
            "Wake the worker at once when a mission becomes due now (missions add --due-now, "
            "missions resume, or any INSERT/UPDATE of the missions table) through PostgreSQL "
            "LISTEN/NOTIFY, and when a slot frees while due missions wait; the tick stays the "
            "safety net. Off under PgBouncer (LISTEN needs a session). Default true."
        ),
    )
    shutdown_grace_s: float = Field(
        default=30.0,
        ge=0,
        le=DAY_S,
        description=(
            "On SIGTERM/SIGINT, seconds (0 to 86400) to let running missions finish before "
            "they are interrupted (their iterations are marked interrupted and their leases "
            "released, so another replica resumes them at once when it listens for wake-ups, "
            "else at its next tick)."
        ),
    )
    metrics_port: int = Field(
        default=9464,
        ge=0,
        le=65535,
        description=(
            "TCP port of the Prometheus /metrics endpoint. 0 disables the endpoint. "
            "Default 9464 (the OpenTelemetry Prometheus exporter's port)."
        ),
    )
    metrics_host: str = Field(
        default="0.0.0.0",  # deliberate, see the description
        description=(
            "Address the metrics endpoint listens on. Default 0.0.0.0 (all interfaces), so a "
            "Prometheus server outside the container can scrape it; metrics carry counts and "
            "durations, never prompts or secrets. Set 127.0.0.1 to keep it local to the host."
        ),
    )
