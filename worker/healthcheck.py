"""``python -m worker.healthcheck``: the container image's health check, for whichever mana-ai
command the container runs, using the standard library only.

It asks ``/healthz`` on 127.0.0.1 at the port of each command that serves one, in turn:
``MANA_AI_METRICS_PORT`` (``worker``, default 9464), ``MANA_AI_API_PORT`` (``serve``, 8080),
``MANA_AI_MCP_PORT`` (``mcp serve``, 8765). The first that answers decides: 200 is healthy
(exit 0), anything else unhealthy (exit 1: a worker whose ticks fail answers 503); a port
nobody listens on is skipped (that command is not the one running). Nothing answering at
all is unhealthy.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

__all__ = ["main"]

_PORTS = (
    ("MANA_AI_METRICS_PORT", "9464"),
    ("MANA_AI_API_PORT", "8080"),
    ("MANA_AI_MCP_PORT", "8765"),
)
TIMEOUT_S = 4.0
"""Seconds each probe waits (the image's check allows 5)."""


def main() -> int:
    """Probe as the module docstring says; the exit status."""
    for variable, default in _PORTS:
        port = os.environ.get(variable, default).strip() or default
        if port == "0":
            continue  # that endpoint is off (or on a port only its log names)
        url = f"http://127.0.0.1:{port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
                return 0 if answer.status == 200 else 1
        except urllib.error.HTTPError as exc:
            print(f"{url}: {exc.code}", file=sys.stderr)
            return 1
        except (urllib.error.URLError, OSError):
            continue  # nobody listens there
    print("no mana-ai /healthz answered on 127.0.0.1", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
