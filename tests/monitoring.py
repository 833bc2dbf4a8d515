"""The monitoring files of deploy/ and the real Prometheus that checks them.

``DEPLOY`` is the directory; ``dashboard()`` the dashboard's JSON and ``panel_queries()`` every
query of it with the panel it belongs to; ``substituted(expr)`` a query with Grafana's
variables replaced by values a plain Prometheus takes. ``promtool(*args)`` runs Debian's
``/usr/bin/promtool`` and ``start_prometheus(targets)`` a ``/usr/bin/prometheus`` on a free port
of 127.0.0.1 that scrapes ``targets`` every second with mana-ai's rules loaded; both raise
``PrometheusUnavailable`` (a test skips with its message) when the package is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "DEPLOY",
    "PROMETHEUS_BIN",
    "PROMTOOL_BIN",
    "Prometheus",
    "PrometheusUnavailable",
    "dashboard",
    "panel_queries",
    "promtool",
    "start_prometheus",
    "substituted",
]

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
PROMTOOL_BIN = Path("/usr/bin/promtool")
PROMETHEUS_BIN = Path("/usr/bin/prometheus")
RULES = DEPLOY / "prometheus" / "rules" / "mana-ai.rules.yml"

GRAFANA_VARIABLES = {
    # Grafana's own: at least four scrape intervals; the time range picked; the step
    "$__rate_interval": "1m",
    "$__range": "1h",
    "$__interval": "15s",
    # the dashboard's: every model
    "${model:regex}": ".*",
    "${model}": ".*",
    "$model": ".*",
}


class PrometheusUnavailable(Exception):
    """Prometheus or promtool is not installed here; the message says how to get them."""


def dashboard() -> dict[str, Any]:
    """deploy/grafana/mana-ai.json."""
    return json.loads((DEPLOY / "grafana" / "mana-ai.json").read_text(encoding="utf-8"))


def panel_queries() -> Iterator[tuple[str, str, str]]:
    """``(panel title, refId, expr)`` of every target of every panel (rows included)."""
    for panel in dashboard()["panels"]:
        for nested in [panel, *panel.get("panels", [])]:
            for target in nested.get("targets", []):
                yield nested["title"], target["refId"], target["expr"]


def substituted(expr: str) -> str:
    """``expr`` with the Grafana variables it uses replaced (``GRAFANA_VARIABLES``).

    Raises:
        ValueError: a ``$variable`` is left that this does not know.
    """
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    left = re.findall(r"\$\{?\w+", expr)
    if left:
        raise ValueError(f"unknown Grafana variable(s) {left} in {expr}")
    return expr


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``promtool ARGS`` (output as text); raises ``PrometheusUnavailable`` without it."""
    if not PROMTOOL_BIN.exists():
        raise PrometheusUnavailable(
            "promtool not installed: apt-get install prometheus (.ci/run does)"
        )
    return subprocess.run(
        [str(PROMTOOL_BIN), *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


@dataclass
class Prometheus:
    """A running Prometheus: its API at ``url``; ``stop()`` ends it and deletes its data."""

    process: subprocess.Popen[bytes]
    url: str
    workdir: Path

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) ``expr`` gives now.

        Raises:
            AssertionError: Prometheus refused the query (its error is the message).
        """
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = answer.json()
        assert answer.status_code == 200 and body["status"] == "success", (
            f"{expr}: {body.get('errorType')}: {body.get('error')}"
        )
        data = body["data"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def wait_for(self, expr: str, *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll ``expr`` until it returns something; the result.

        Raises:
            AssertionError: still nothing after ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.query(expr)
            if found:
                return found
            assert time.monotonic() < deadline, f"{expr} returned nothing in {timeout_s} s"
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_prometheus(targets: list[str], *, job: str = "mana-ai") -> Prometheus:
    """A Prometheus on a free port of 127.0.0.1 scraping ``targets`` (``host:port``) as
    ``job`` every second, evaluating mana-ai's rules every second; ready when it returns.

    Raises:
        PrometheusUnavailable: not installed.
        RuntimeError: it did not start (its log is in the message).
    """
    if not PROMETHEUS_BIN.exists():
        raise PrometheusUnavailable(
            "prometheus not installed: apt-get install prometheus (.ci/run does)"
        )
    workdir = Path(tempfile.mkdtemp(prefix="mana-ai-prometheus-"))
    (workdir / "rules").mkdir()
    shutil.copy(RULES, workdir / "rules" / RULES.name)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules/*.yml"],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = _free_port()
    with (workdir / "prometheus.log").open("wb") as log:  # the child keeps its own copy
        process = subprocess.Popen(
            [
                str(PROMETHEUS_BIN),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    prometheus = Prometheus(process, f"http://127.0.0.1:{port}", workdir)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{prometheus.url}/-/ready", timeout=1).status_code == 200:
                return prometheus
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            text = (workdir / "prometheus.log").read_text(errors="replace")
            prometheus.stop()
            raise RuntimeError(f"prometheus did not start:\n{text[-3000:]}")
        time.sleep(0.1)
