"""The container image's health check (``python -m worker.healthcheck``) against real HTTP
listeners: whichever command the container runs, its ``/healthz`` decides."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from worker.healthcheck import main


@contextmanager
def healthz(status: int) -> Iterator[int]:
    """A listener answering ``status`` on /healthz; its port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ports(monkeypatch: pytest.MonkeyPatch, metrics: int, api: int, mcp: int) -> None:
    monkeypatch.setenv("MANA_AI_METRICS_PORT", str(metrics))
    monkeypatch.setenv("MANA_AI_API_PORT", str(api))
    monkeypatch.setenv("MANA_AI_MCP_PORT", str(mcp))


def test_a_worker_is_judged_by_its_own_healthz(monkeypatch: pytest.MonkeyPatch) -> None:
    with healthz(503) as worker, healthz(200) as other:
        ports(monkeypatch, worker, other, other)
        assert main() == 1  # a stalled worker is unhealthy, whatever else answers
    with healthz(200) as worker:
        ports(monkeypatch, worker, free_port(), free_port())
        assert main() == 0


def test_serve_and_mcp_serve_are_found_on_their_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    with healthz(200) as serve:
        ports(monkeypatch, free_port(), serve, free_port())
        assert main() == 0
    with healthz(503) as mcp:
        ports(monkeypatch, free_port(), free_port(), mcp)
        assert main() == 1
    ports(monkeypatch, free_port(), free_port(), free_port())
    assert main() == 1  # nothing answers: unhealthy
