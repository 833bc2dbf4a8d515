"""The daemon: the tick loop, the wake-up listener, signal handling and graceful shutdown.

One loop ticks, ``Worker.run``: right at start, then every ``tick_interval_s`` or at once when
woken, whichever comes first (a slow tick never overlaps the next one, missed ticks collapse
into one, wake-ups coalesce). It is woken by a free slot while due missions wait, and by the
wake-up listener (``worker.daemon.wakeup``: LISTEN mana_ai_due, so a mission added due now starts
within milliseconds, not at the next tick).

The interval is the standard library's (a timeout on the wake-up event), not an APScheduler
job as before: an interval and a wake-up feeding one loop need nothing more, and two
triggers needed a lock between them.

On SIGTERM or SIGINT the worker stops claiming, lets running missions finish within
``shutdown_grace_s`` (a second signal cuts that short), interrupts the rest (their iterations
are marked ``interrupted`` and their leases released, so another worker reruns them) and
returns exit status 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncEngine

from planner import ChatModel
from worker import metrics
from worker.daemon.app import open_app
from worker.daemon.heap import settled_heap
from worker.daemon.wakeup import WakeUpListener, off_reason
from worker.errors import SettingsError
from worker.metrics import MetricsServer
from worker.settings import Settings
from worker.store.approvals import ApprovalStore
from worker.store.transient import describe_error

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
            metrics_server = None
            if settings.metrics_port:
                try:
                    metrics_server = MetricsServer(
                        settings.metrics_host, settings.metrics_port, app.health
                    )
                except OSError as exc:
                    raise SettingsError(
                        f"MANA_AI_METRICS_HOST / MANA_AI_METRICS_PORT: cannot listen on "
                        f"{settings.metrics_host}:{settings.metrics_port}: {exc.strerror or exc} "
                        "(set another port, or 0 to disable the endpoint)"
                    ) from exc
                metrics_server.start()
                logger.info(
                    "metrics on http://%s:%d/metrics and /healthz",
                    settings.metrics_host,
                    metrics_server.port,
                )
            listening = _start_listening(settings, app.engine, app.worker.wake)
            stats = None
            if metrics_server is not None:
                stats = asyncio.create_task(
                    _approval_stats(ApprovalStore(app.engine)), name="approval stats"
                )
            ticking = asyncio.create_task(app.worker.run(settings.tick_interval_s), name="tick")
            with settled_heap():  # start-up done: see worker.daemon.heap
                logger.info(
                    "worker %s ticking every %g s, up to %d mission(s) at once",
                    settings.worker_id,
                    settings.tick_interval_s,
                    settings.max_concurrent_missions,
                    extra={"worker_id": settings.worker_id},
                )
                try:
                    await stop.wait()
                finally:
                    logger.info("shutting down: no new claims")
                    app.worker.stop()  # the tick loop ends after the tick in flight, if any
                    for task in (listening, stats):  # UNLISTEN; connections back to the pool
                        if task is not None:
                            task.cancel()
                            await asyncio.gather(task, return_exceptions=True)
                    await app.worker.drain(settings.shutdown_grace_s, hurry)
                    if metrics_server is not None:
                        metrics_server.stop()
                    if not ticking.done():  # its claim got no answer (``drain`` waited)
                        ticking.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await ticking  # raises what a bug in the loop raised
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    logger.info("worker %s stopped", settings.worker_id)
    return 0


def _start_listening(
    settings: Settings, engine: AsyncEngine, wake: Callable[[], None]
) -> asyncio.Task[None] | None:
    """Start the wake-up listener (``worker.daemon.wakeup``) on one of ``engine``'s connections, or
    say at start why wake-ups are off and due missions wait for the tick."""
    reason = off_reason(
        wake_up=settings.wake_up,
        pgbouncer=settings.pgbouncer,
        pool_capacity=settings.db_pool_size + settings.db_max_overflow,
        pgbouncer_detected=settings.db_pgbouncer == "auto",
    )
    if reason is not None:
        logger.info(
            "wake-ups off (%s): due missions wait for the next tick (every %g s)",
            reason,
            settings.tick_interval_s,
        )
        return None
    listener = WakeUpListener(engine, wake)
    return asyncio.create_task(listener.run(), name="wake-up listener")


APPROVAL_STATS_INTERVAL_S = 15.0
"""Seconds between two reads of the approval figures the worker exports (one statement)."""


async def _approval_stats(
    store: ApprovalStore, interval_s: float = APPROVAL_STATS_INTERVAL_S
) -> None:
    """Read the approval figures (``ApprovalStore.stats``) into ``mana_ai_approvals_*`` every
    ``interval_s`` seconds until cancelled; while the database does not answer the figures
    are not exported (rather than stale), and one line says so."""
    failing = False
    while True:
        try:
            decided, pending, oldest_s = await store.stats()
        except Exception as exc:
            metrics.APPROVALS.clear()
            if not failing:
                logger.warning("could not read the approval figures: %s", describe_error(exc))
            failing = True
        else:
            metrics.APPROVALS.update(decided, pending, oldest_s)
            failing = False
        await asyncio.sleep(interval_s)


def _on_signal(sig: signal.Signals, stop: asyncio.Event, hurry: asyncio.Event) -> None:
    """First signal: stop claiming and drain. Second: interrupt running missions now."""
    if stop.is_set():
        logger.info("received %s again", sig.name)
        hurry.set()
    else:
        logger.info("received %s", sig.name)
        stop.set()
