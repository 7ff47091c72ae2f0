"""deploy/monitoring: the alerting rules pass ``promtool check rules`` and their unit tests (``promtool test
rules``), every metric the rules and the Grafana dashboard read is one the sidecar exports, and the chart's
copies equal deploy/monitoring's (issue 26 item 5).

The sidecar's metric names come from its registry (``SidecarMetrics().registry``), not from a list written
here. promtool is built by .ci/setup (``build-components.sh promtool``); missing, it fails the test under
``CI=true`` and skips it elsewhere, saying how to build it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from raygpu.model.gc import GcReason
from raygpu.reclaim.metrics import RELEASE_REASONS, SidecarMetrics
from raygpu.reclaim.report import CycleOutcome
from raygpu.testing import components

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "deploy" / "monitoring"
RULES = MONITORING / "raygpu-rules.yaml"
RULES_TEST = MONITORING / "raygpu-rules.test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
CHART_FILES = REPO / "deploy" / "helm" / "raygpu" / "files"


# ------------------------------------------------------------------ what the sidecar exports
def exported_names() -> set[str]:
    """Every series name the sidecar's registry exports, suffixes included (``_total``, ``_bucket``, ...)."""
    names = set()
    for family in SidecarMetrics().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                    "summary": ("_sum", "_count", ""), "gauge": ("",)}[family.type]
        names.update(family.name + s for s in suffixes)
    return names


def exported_labels() -> set[str]:
    """Every label name of the sidecar's metrics, and the target labels the chart's monitors add."""
    from prometheus_client.metrics import MetricWrapperBase
    labels = {"namespace", "pod", "ray_cluster", "le"}
    for m in vars(SidecarMetrics()).values():
        if isinstance(m, MetricWrapperBase):
            labels.update(m._labelnames)
    return labels


def test_the_registry_parse_sees_every_kind_of_metric():
    names = exported_names()
    assert {"raygpu_reclaim_cycles_total", "raygpu_reclaim_cycle_duration_seconds_bucket",
            "raygpu_guard_longest_wait_seconds", "raygpu_gc_reservations_released_total"} <= names
    assert "raygpu_reclaim_cycles" not in names  # a counter's family name is not a series
    assert {"outcome", "reason", "scope", "ray_cluster"} <= exported_labels()


def test_every_exported_counter_starts_at_zero_for_each_label_value_it_can_take():
    reg = SidecarMetrics().registry
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in reg.collect() for s in f.samples}
    for outcome in CycleOutcome:
        assert samples[("raygpu_reclaim_cycles_total", (("outcome", outcome.value),))] == 0
    for reason in RELEASE_REASONS:
        assert samples[("raygpu_gc_reservations_released_total", (("reason", reason),))] == 0
    assert GcReason.TIMED_OUT.value in RELEASE_REASONS and GcReason.LIVE.value not in RELEASE_REASONS
    for result in ("reserved", "refused", "failed", "exists"):
        assert samples[("raygpu_scale_up_reservations_total", (("result", result),))] == 0
    for result in ("accepted", "rejected"):
        assert samples[("raygpu_reclaim_drains_total", (("result", result),))] == 0
    for name in ("raygpu_reclaim_gpus_reclaimed_total", "raygpu_reclaim_patch_conflicts_total",
                 "raygpu_reclaim_invalid_annotations_total", "raygpu_reclaim_search_budget_spent_total"):
        assert samples[(name, ())] == 0


# ------------------------------------------------------------------ PromQL: the names a query reads
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
            "inf", "nan"}
GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")


def _label_values(query: str) -> tuple[str, str | None] | None:
    """Grafana's ``label_values(metric{...}, label)`` -> (the selector, the label); None for PromQL."""
    m = re.fullmatch(r"\s*label_values\((.*?)(?:,\s*([A-Za-z_][A-Za-z0-9_]*))?\)\s*", query, re.S)
    return (m.group(1), m.group(2)) if m else None


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values`` query) reads: identifiers outside
    strings, label matchers, ranges and grouping lists that are not functions or keywords."""
    if (lv := _label_values(expr)) is not None:
        expr = lv[0]
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = GROUPING.sub(" ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        if m.group() in KEYWORDS or e[m.end():].lstrip().startswith("("):
            continue
        if m.start() and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # the exponent of 1e3
        names.add(m.group())
    return names


def label_names(expr: str) -> set[str]:
    """Label names an expression matches on or groups by (and a ``label_values`` query's label)."""
    out = set()
    if (lv := _label_values(expr)) is not None:
        expr, label = lv
        out.update([label] if label else [])
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    for block in re.findall(r"\{([^}]*)\}", e):
        out.update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", block))
    for group in GROUPING.findall(e):
        out.update(x.strip() for x in group.split(",") if x.strip())
    return out


def test_the_name_parse_finds_metrics_and_not_functions_labels_or_durations():
    expr = ('sum by (ns, reason) (increase(a_total{reason=~"x|y", ns="$n"}[1h])) > 0.5 * on (ns) group_left '
            'max(b_seconds offset 5m) and histogram_quantile(0.99, c_bucket) > 1e3')
    assert metric_names(expr) == {"a_total", "b_seconds", "c_bucket"}
    assert label_names(expr) == {"ns", "reason"}
    assert metric_names('label_values(d_total{namespace=~"$namespace"}, ray_cluster)') == {"d_total"}
    assert label_names('label_values(d_total{namespace=~"$namespace"}, ray_cluster)') == {"namespace", "ray_cluster"}


def rule_exprs() -> dict[str, str]:
    return {r.get("alert") or r["record"]: r["expr"]
            for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, query) for every PromQL query of the dashboard: panel targets (rows' nested panels included)
    and template variables."""
    dash = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            out.extend((f"panel {p['title']!r}", t["expr"]) for t in p.get("targets", []))
            walk(p.get("panels", []))
    walk(dash["panels"])
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']}", q))
    return out


def test_every_metric_the_rules_and_the_dashboard_read_is_one_the_sidecar_exports():
    names, labels = exported_names(), exported_labels()
    queries = [(f"rule {a}", e) for a, e in rule_exprs().items()] + dashboard_queries()
    assert len(queries) > 25
    read: set[str] = set()
    for where, q in queries:
        found = metric_names(q)
        assert found, f"{where}: reads no metric: {q}"
        assert found <= names, f"{where} reads {sorted(found - names)}, which the sidecar does not export"
        assert label_names(q) <= labels, f"{where} uses labels {sorted(label_names(q) - labels)} no series has"
        read |= found
    # the dashboard shows every family the sidecar exports (a new metric gets a panel)
    dash_read = set().union(*(metric_names(q) for _, q in dashboard_queries()))
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in names}
    assert families <= {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in dash_read}


# ------------------------------------------------------------------ promtool
def promtool() -> Path:
    path = components.tool("promtool")
    if not path.exists():
        why = f"promtool is not built at {path}: run .ci/setup, or `bash raygpu/testing/scripts/build-components.sh promtool`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(why)
        pytest.skip(why)
    return path


def run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_promtool_check_rules_passes():
    out = run(promtool(), "check", "rules", RULES)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in out.stdout


def test_promtool_test_rules_passes_and_each_alert_is_tested_firing(tmp_path):
    out = run(promtool(), "test", "rules", RULES_TEST.name, cwd=MONITORING)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {t["alertname"] for group in tests for t in group.get("alert_rule_test", []) if t["exp_alerts"]}
    assert fired == set(rule_exprs())
    # the tests bite: the same tests against rules whose thresholds moved fail
    broken = tmp_path / RULES.name
    broken.write_text(RULES.read_text().replace("> 900", "> 9000").replace("> 3\n", "> 30\n"))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    out = run(promtool(), "test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert out.returncode != 0
    assert "RaygpuGuardedGangWaitingLong" in out.stdout + out.stderr
    assert "RaygpuReservationsReleasedForDeadDrivers" in out.stdout + out.stderr


def test_promtool_check_metrics_accepts_what_the_sidecar_serves():
    """Prometheus' own lint of the exposition (names, units, help): a counter without _total, a unit in the
    wrong place... would be reported here."""
    from prometheus_client import generate_latest
    m = SidecarMetrics()
    m.guard_waiting.labels("team-a").set(1)  # the lazily labelled gauges too
    m.warm_target.labels("gpu").set(2)
    m.scale_up_pending.labels("waiting").set(1)
    text = generate_latest(m.registry).decode()
    out = subprocess.run([str(promtool()), "check", "metrics"], input=text, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert 'raygpu_guard_waiting_gangs{scope="team-a"} 1.0' in text


def test_every_dashboard_query_is_valid_promql():
    tool = promtool()
    for where, q in dashboard_queries():
        if (lv := _label_values(q)) is not None:
            q = lv[0]
        q = q.replace("$__rate_interval", "5m").replace("$namespace", ".*").replace("$ray_cluster", ".*")
        out = run(tool, "--experimental", "promql", "format", q)
        assert out.returncode == 0, f"{where}: {q}: {out.stdout}{out.stderr}"


# ------------------------------------------------------------------ the chart's copies, the docs
def test_the_charts_copies_equal_deploy_monitoring():
    """The chart can only read files inside itself: deploy/monitoring/sync-chart-files.sh copies them."""
    for f in (RULES, DASHBOARD):
        assert (CHART_FILES / f.name).read_bytes() == f.read_bytes(), \
            f"{CHART_FILES / f.name} differs from {f}: run deploy/monitoring/sync-chart-files.sh"


def test_the_dashboard_is_grafana_json_with_a_datasource_variable():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    assert [v["name"] for v in dash["templating"]["list"]][:1] == ["datasource"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_docs_monitoring_says_what_to_do_for_every_alert():
    text = (REPO / "docs" / "monitoring.md").read_text()
    for alert in rule_exprs():
        assert f"### {alert}" in text, f"docs/monitoring.md has no section for {alert}"
