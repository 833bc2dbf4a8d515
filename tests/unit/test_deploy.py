"""deploy/ holds together: the Grafana dashboard is its generator's output and provisionable
(every panel has a data source and queries, ids and places are unique, every variable is
defined), every metric a panel or a rule reads is one the worker exports, and the compose
file wires what exists (mounted files, settings, ports, job names). Whether the queries
return data is the e2e tier's (tests/e2e/test_monitoring.py); promtool's checks are the
integration tier's (tests/integration/test_prometheus_rules.py)."""

from __future__ import annotations

import re
import runpy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.monitoring import DEPLOY, dashboard, panel_queries, substituted
from worker import metrics
from worker.settings import variables
from worker.settings.daemon import DaemonSettings

PROMETHEUS_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def exported_names() -> set[str]:
    """Every sample name the worker's metrics module can export (histogram and counter
    suffixes included), the collectors' too."""
    names: set[str] = set()
    for value in vars(metrics).values():
        name = getattr(value, "_name", None)
        kind = getattr(value, "_type", None)
        if not isinstance(name, str) or not name.startswith("mana_ai_"):
            continue
        if kind == "counter":
            names.add(f"{name}_total")
        elif kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        else:
            names.add(name)
    approvals = metrics.ApprovalStats()
    approvals.update({"approved": 1}, 1, 1.0)
    pools = metrics.DatabasePools()
    pools.watch("main", lambda: (1, 1), 2)
    for collector in (approvals, pools):
        for family in collector.collect():
            names |= {sample.name for sample in family.samples}
    return names


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bmana_ai_[a-z0-9_]+", expr))


def rules() -> list[dict[str, Any]]:
    text = (DEPLOY / "prometheus" / "rules" / "mana-ai.rules.yml").read_text()
    return [rule for group in yaml.safe_load(text)["groups"] for rule in group["rules"]]


def panels() -> Iterator[dict[str, Any]]:
    for panel in dashboard()["panels"]:
        yield panel
        yield from panel.get("panels", [])


def test_the_dashboard_is_its_generators_output() -> None:
    generator = runpy.run_path(str(DEPLOY / "grafana" / "dashboard.py"))
    on_disk = (DEPLOY / "grafana" / "mana-ai.json").read_text(encoding="utf-8")
    assert on_disk == generator["render"](), (
        "run: python deploy/grafana/dashboard.py > deploy/grafana/mana-ai.json"
    )


def test_every_panel_has_a_prometheus_datasource_and_queries() -> None:
    board = dashboard()
    assert board["uid"] == "mana-ai" and board["schemaVersion"] >= 36
    seen_ids: set[int] = set()
    for panel in panels():
        assert panel["id"] not in seen_ids, panel["title"]
        seen_ids.add(panel["id"])
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == PROMETHEUS_DATASOURCE, panel["title"]
        assert panel["title"] and panel["description"], panel
        targets = panel["targets"]
        assert targets, f"{panel['title']} has no query"
        assert len({t["refId"] for t in targets}) == len(targets), panel["title"]
        for target in targets:
            assert target["datasource"] == PROMETHEUS_DATASOURCE, panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_panels_do_not_overlap_and_fit_the_width() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_the_variables_are_defined_and_substituted_for_a_plain_prometheus() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["model"]["datasource"] == PROMETHEUS_DATASOURCE
    assert metric_names(variables["model"]["definition"]) <= exported_names()
    for title, _, expr in panel_queries():
        used = set(re.findall(r"\$\{?(\w+)", expr)) - {"__rate_interval", "__range", "__interval"}
        assert used <= set(variables), f"{title}: {used - set(variables)}"
        substituted(expr)  # raises on a variable it does not know


def test_every_metric_a_panel_or_a_rule_reads_is_exported_by_the_worker() -> None:
    exported = exported_names()
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    for title, ref, expr in panel_queries():
        unknown = metric_names(expr) - exported
        assert not unknown, f"panel {title!r} {ref} reads {unknown}"
    for rule in rules():
        unknown = metric_names(rule["expr"]) - exported - recorded
        assert not unknown, f"rule {rule.get('record') or rule['alert']} reads {unknown}"


def compose() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_the_compose_file_starts_the_database_the_migration_two_workers_and_monitoring() -> None:
    services = compose()["services"]
    assert set(services) == {
        "postgres",
        "migrate",
        "worker-1",
        "worker-2",
        "prometheus",
        "grafana",
        "jaeger",
    }
    assert services["migrate"]["command"] == ["db", "upgrade"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("worker-1", "worker-2"):
        worker = services[name]
        assert worker.get("command") is None  # the image's: mana-ai worker
        assert worker["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert worker["environment"]["MANA_AI_WORKER_ID"] == name
        assert worker["build"]["context"] == ".."
    assert services["jaeger"]["profiles"] == ["tracing"]


@pytest.mark.parametrize("service", ["migrate", "worker-1", "worker-2"])
def test_the_workers_environment_names_only_real_settings(service: str) -> None:
    environment = compose()["services"][service]["environment"]
    known = {variable.name for variable in variables()}
    for variable in environment:
        if variable.startswith("MANA_AI_"):
            assert variable in known, variable
        else:
            assert variable.startswith("OTEL_"), variable
    endpoint = environment["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert endpoint == "http://jaeger:4318"
    jaeger = compose()["services"]["jaeger"]["command"]
    assert "receivers.otlp.protocols.http.endpoint=0.0.0.0:4318" in jaeger


def test_every_file_the_compose_file_mounts_exists() -> None:
    for name, service in compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts {source}"


def test_prometheus_scrapes_both_workers_on_their_metrics_port() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["job_name"] == "mana-ai"  # the alerts' and the dashboard's job
    port = DaemonSettings.model_fields["metrics_port"].default
    assert job["static_configs"][0]["targets"] == [f"worker-1:{port}", f"worker-2:{port}"]
    assert any('job="mana-ai"' in rule["expr"] for rule in rules() if "alert" in rule)


def test_grafana_provisions_the_mounted_dashboard_from_the_provisioned_prometheus() -> None:
    grafana = compose()["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if v.startswith("."))
    provisioning = DEPLOY / "grafana" / "provisioning"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "mana-ai.yml").read_text())[
        "providers"
    ]
    assert str(Path(mounts["./grafana/mana-ai.json"]).parent) == provider["options"]["path"]
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert source["isDefault"] is True  # what ${datasource} picks at first


def test_the_image_can_trace() -> None:
    dockerfile = (DEPLOY.parent / "Dockerfile").read_text()
    assert "extra='[local,otel]'" in dockerfile and "extra='[otel]'" in dockerfile
