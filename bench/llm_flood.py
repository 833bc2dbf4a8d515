"""LLM flood: missions against an endpoint that answers 200 MB, and what that costs the worker.

Not a test: it prints figures. Usage::

    python bench/llm_flood.py [--mb 200] [--cap BYTES] [--direct]

A ``FakeLLMServer`` in a child process (its memory is not the worker's) answers with a
``--mb`` MB chat completion (``enqueue_flood``: valid JSON if read whole), once of each kind:
announced by ``Content-Length``, chunked (no size announced), gzip-compressed (about 300 KB
on the wire for 200 MB), gzip and chunked. Then, as a control, an answer just under the cap
(1 KiB less), which succeeds: its growth shows that the measure sees what a request holds.

One worker wired from settings as ``mana-ai worker`` is (``worker.daemon.app.open_app``: the
OpenAI-compatible client, 3 retries, ``MANA_AI_LLM_MAX_RESPONSE_BYTES`` = ``--cap`` or its
default) runs one mission per answer, one at a time. ``--direct`` sends one request per answer
through the worker's chat model alone (no database).

Prints, for each answer: the iteration's status, stop reason and error (``--direct``: the
error or the answer's size), the seconds it took, the requests the endpoint received and the
worker process's peak RSS growth: ``ru_maxrss`` now, less before the first answer (a peak only
rises: each figure covers the answers before it too), with its ratio to the 64 MiB budget.

Database: ``MANA_AI_TEST_DATABASE_URL`` when set (a throw-away database in that server), else
an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import resource
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import at_least, database_server, throwaway_database
from bench.tick_throughput import add_missions
from planner import ChatMessage, CompletionRequest, LLMError
from tests.fakes import FakeLLMServer
from worker.daemon.app import open_app
from worker.llm.chat_models import build_chat_model
from worker.settings import Settings, load_settings

BUDGET_MIB = 64
KINDS: list[tuple[str, dict[str, bool]]] = [
    ("content-length", {}),
    ("chunked", {"content_length": False}),
    ("gzip", {"gzip": True}),
    ("gzip, chunked", {"gzip": True, "content_length": False}),
]


def serve(answers: list[tuple[int, dict[str, bool]]], connection: Any) -> None:
    """In the child: queue ``answers`` (size, kind), send the port, serve until told to stop,
    then send the requests received."""
    with FakeLLMServer() as server:
        for size, kind in answers:
            server.enqueue_flood(size, **kind)
        connection.send(server.port)
        connection.recv()
        connection.send(len(server.requests))


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def row(label: str, seconds: float, outcome: str, growth_mib: float) -> None:
    print(
        f"{label:<26} {seconds:6.2f} s  rss +{growth_mib:5.1f} MiB "
        f"({growth_mib / BUDGET_MIB:.2f} of {BUDGET_MIB})  {outcome}"
    )


async def direct(settings: Settings, labels: list[str]) -> None:
    llm = build_chat_model(settings)
    request = CompletionRequest(messages=[ChatMessage(role="user", content="What time is it?")])
    before = peak_rss_mib()
    try:
        for label in labels:
            started = time.perf_counter()
            try:
                response = await llm.complete(request)
                outcome = f"answered: {len(response.message.content or '')} characters"
            except LLMError as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            row(label, time.perf_counter() - started, outcome, peak_rss_mib() - before)
    finally:
        await llm.aclose()


async def missions(server_url: str, settings: Settings, labels: list[str]) -> None:
    async with throwaway_database(server_url, "mana_ai_bench_flood") as url:
        await add_missions(url, len(labels))
        database = settings.database.model_copy(update={"url": url})
        settings = settings.model_copy(update={"database": database})
        async with open_app(settings, migrate=True) as app:
            before = peak_rss_mib()
            for label in labels:
                started = time.perf_counter()
                outcomes = await app.worker.run_once()
                elapsed = time.perf_counter() - started
                it = await last_iteration(url)
                outcome = f"{outcomes} {it['status']}/{it['stop_reason']}"
                if it["error"]:
                    outcome += f": {it['error']}"
                row(label, elapsed, outcome, peak_rss_mib() - before)


async def last_iteration(url: str) -> asyncpg.Record:
    connection = await asyncpg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(False)
    )
    try:
        record: asyncpg.Record = await connection.fetchrow(
            "SELECT status, stop_reason, error FROM mission_iterations ORDER BY id DESC LIMIT 1"
        )
        return record
    finally:
        await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--mb", type=at_least(1), default=200, help="size of a flood, in MB")
    parser.add_argument(
        "--cap", type=at_least(1024), default=None, help="MANA_AI_LLM_MAX_RESPONSE_BYTES"
    )
    parser.add_argument("--direct", action="store_true", help="the chat model alone, no DB")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # each failed iteration's warning is its row
    overrides: dict[str, Any] = {
        "llm_max_retries": 3,
        "max_concurrent_missions": 1,
        "worker_id": "bench",
        "metrics_port": 0,
    }
    if args.cap is not None:
        overrides["llm_max_response_bytes"] = args.cap
    cap = load_settings(**overrides).llm.max_response_bytes
    answers = [(args.mb * 1_000_000, kind) for _, kind in KINDS] + [(cap - 1024, {})]
    labels = [f"{args.mb} MB, {name}" for name, _ in KINDS] + [f"{cap - 1024} B (control)"]

    context = multiprocessing.get_context("spawn")
    connection, child_end = context.Pipe()
    server = context.Process(target=serve, args=(answers, child_end), daemon=True)
    server.start()
    try:
        port = connection.recv()
        settings = load_settings(llm_base_url=f"http://127.0.0.1:{port}/v1", **overrides)
        print(f"cap                        {cap} bytes (MANA_AI_LLM_MAX_RESPONSE_BYTES)")
        print(f"rss_before_mib             {peak_rss_mib():.0f}  (the worker's process)")
        if args.direct:
            asyncio.run(direct(settings, labels))
        else:
            with database_server() as (server_url, where):
                print(f"database                   {where}")
                asyncio.run(missions(server_url, settings, labels))
        connection.send("stop")
        print(f"requests                   {connection.recv()} for {len(labels)} answers")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
