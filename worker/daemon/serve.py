"""The daemon: an APScheduler tick, the wake-up listener, signal handling and graceful
shutdown.

An ``AsyncIOScheduler`` runs two interval jobs on the daemon's event loop: the tick
(``Worker.schedule``: at start, then every ``tick_interval_s``; a slow tick never overlaps the
next one, missed ticks collapse into one) and the approval figures the worker exports (every
``APPROVAL_STATS_INTERVAL_S``, with a metrics endpoint). A wake-up brings the tick forward: a
free slot while due missions wait, and the wake-up listener (``worker.daemon.wakeup``: LISTEN
mana_ai_due, so a mission added due now starts within milliseconds, not at the next tick).

On SIGTERM or SIGINT the worker stops claiming, lets running missions finish within
``shutdown_grace_s`` (a second signal cuts that short), interrupts the rest (their iterations
are marked ``interrupted`` and their leases released, so another worker reruns them) and
returns exit status 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ChatModel
from worker import metrics
from worker.daemon.app import App, open_app
from worker.daemon.wakeup import WakeUpListener, off_reason
from worker.db.transient import describe_error
from worker.errors import SettingsError
from worker.metrics import MetricsServer
from worker.queries.approval_requests import ApprovalStore
from worker.settings import Settings

__all__ = ["serve"]

logger = logging.getLogger(__name__)


async def serve(
    settings: Settings,
    *,
    llm: ChatModel | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run the worker until SIGTERM / SIGINT (or ``stop`` is set); return the exit status.

    Args:
        settings: the configuration (read once by the caller).
        llm: overrides the configured chat model (tests, benchmarks).
        stop: an event that ends the daemon like a signal does.

    Raises:
        ManaAIError: the database could not be opened or migrated (before anything ran).
    """
    stop = stop or asyncio.Event()
    hurry = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, sig, stop, hurry)
    try:
        async with open_app(settings, llm=llm, migrate=True) as app:
            metrics_server = _metrics_server(settings, app)
            listening = _start_listening(settings, app.engine, app.worker.wake)
            scheduler = _scheduler(settings, app, figures=metrics_server is not None)
            scheduler.start()
            logger.info(
                "worker %s ticking every %g s, up to %d mission(s) at once",
                settings.daemon.worker_id,
                settings.daemon.tick_interval_s,
                settings.daemon.max_concurrent_missions,
                extra={"worker_id": settings.daemon.worker_id},
            )
            try:
                await stop.wait()
            finally:
                logger.info("shutting down: no new claims")
                app.worker.stop()  # a tick from now on claims nothing
                if listening is not None:  # UNLISTEN; its connection back to the pool
                    listening.cancel()
                    await asyncio.gather(listening, return_exceptions=True)
                # waits for a tick in flight, then for the runs (the scheduler's shutdown
                # would cancel a tick in flight: its claimed missions unseen)
                await app.worker.drain(settings.daemon.shutdown_grace_s, hurry)
                scheduler.shutdown(wait=False)
                if metrics_server is not None:
                    metrics_server.stop()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    logger.info("worker %s stopped", settings.daemon.worker_id)
    return 0


def _metrics_server(settings: Settings, app: App) -> MetricsServer | None:
    """The /metrics and /healthz endpoint, started; ``None`` when the port is 0.

    Raises:
        SettingsError: it cannot listen there (the address is not this host's, the port is
            taken).
    """
    if not settings.daemon.metrics_port:
        return None
    host, port = settings.daemon.metrics_host, settings.daemon.metrics_port
    try:
        server = MetricsServer(host, port, app.health)
    except OSError as exc:
        raise SettingsError(
            f"MANA_AI_METRICS_HOST / MANA_AI_METRICS_PORT: cannot listen on {host}:{port}: "
            f"{exc.strerror or exc} (set another port, or 0 to disable the endpoint)"
        ) from exc
    server.start()
    logger.info("metrics on http://%s:%d/metrics and /healthz", host, server.port)
    return server


def _scheduler(settings: Settings, app: App, *, figures: bool) -> AsyncIOScheduler:
    """The daemon's scheduler, not started: the tick job, and with ``figures`` the job that
    reads the approval figures for /metrics."""
    scheduler = AsyncIOScheduler(timezone=UTC)
    app.worker.schedule(scheduler, settings.daemon.tick_interval_s)
    if figures:
        scheduler.add_job(
            _ApprovalFigures(ApprovalStore(app.engine)).read,
            "interval",
            seconds=APPROVAL_STATS_INTERVAL_S,
            id="approval stats",
            next_run_time=datetime.now(UTC),
            max_instances=1,
            coalesce=True,
            misfire_grace_time=None,
        )
    return scheduler


def _start_listening(
    settings: Settings, engine: AsyncEngine, wake: Callable[[], None]
) -> asyncio.Task[None] | None:
    """Start the wake-up listener (``worker.daemon.wakeup``) on one of ``engine``'s connections, or
    say at start why wake-ups are off and due missions wait for the tick."""
    reason = off_reason(
        wake_up=settings.daemon.wake_up,
        pgbouncer=settings.database.pgbouncer,
        pool_capacity=settings.database.pool_size + settings.database.max_overflow,
        pgbouncer_detected=settings.database.pgbouncer_mode == "auto",
    )
    if reason is not None:
        logger.info(
            "wake-ups off (%s): due missions wait for the next tick (every %g s)",
            reason,
            settings.daemon.tick_interval_s,
        )
        return None
    listener = WakeUpListener(engine, wake)
    return asyncio.create_task(listener.run(), name="wake-up listener")


APPROVAL_STATS_INTERVAL_S = 15.0
"""Seconds between two reads of the approval figures the worker exports (one statement)."""


class _ApprovalFigures:
    """The approval figures the worker exports, read from the database (the scheduler's job
    every ``APPROVAL_STATS_INTERVAL_S``)."""

    def __init__(self, store: ApprovalStore) -> None:
        self.store = store
        self.failing = False

    async def read(self) -> None:
        """Read ``ApprovalStore.stats`` into ``mana_ai_approvals_*``; while the database does
        not answer the figures are not exported (rather than stale), and one line says so."""
        try:
            decided, pending, oldest_s = await self.store.stats()
        except Exception as exc:
            metrics.APPROVALS.clear()
            if not self.failing:
                logger.warning("could not read the approval figures: %s", describe_error(exc))
            self.failing = True
        else:
            metrics.APPROVALS.update(decided, pending, oldest_s)
            self.failing = False


def _on_signal(sig: signal.Signals, stop: asyncio.Event, hurry: asyncio.Event) -> None:
    """First signal: stop claiming and drain. Second: interrupt running missions now."""
    if stop.is_set():
        logger.info("received %s again", sig.name)
        hurry.set()
    else:
        logger.info("received %s", sig.name)
        stop.set()
