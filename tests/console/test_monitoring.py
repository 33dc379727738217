"""The shipped monitoring: deploy/prometheus/alerts.yml and deploy/grafana/eventdrop.json.

promtool (Debian's `prometheus` package) checks the rules, runs their unit tests
(alerts_test.yml) and parses every dashboard query; without it these tests are skipped, and
fail on CI (tests/support/tools.py). Every metric either file names must be one /metrics serves.
"""

import json
import re
import subprocess
from pathlib import Path

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.console.conftest import receive_github
from tests.support.tools import tool

pytestmark = pytest.mark.django_db

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULES_TESTS = DEPLOY / "prometheus" / "alerts_test.yml"
DASHBOARD = DEPLOY / "grafana" / "eventdrop.json"
METRIC_NAME = re.compile(r"\beventdrop_[a-z0-9_]+")
PROMTOOL_TIMEOUT_SECONDS = 30


def run_promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [tool("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=PROMTOOL_TIMEOUT_SECONDS,
        check=False,
    )


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def rule_queries() -> list[str]:
    # One `expr:` line per rule (the file keeps each on one line); promtool checks the rest.
    return re.findall(r"^\s*expr:\s*(.+)$", RULES.read_text(), flags=re.MULTILINE)


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_promtool_accepts_the_alert_rules():
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_queries())} rules found" in result.stdout


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_the_alert_rules_fire_when_they_should(tmp_path):
    result = run_promtool("test", "rules", str(RULES_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow  # starts a process (tests/conftest.py)
def test_every_dashboard_query_is_valid_promql(tmp_path):
    # promtool parses expressions only inside rule files: each query becomes a recording rule.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"eventdrop_dashboard:panel_{n}", "expr": expr}
                    for n, expr in enumerate(dashboard_queries())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps(rules))  # JSON is YAML
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_is_importable():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "eventdrop"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])


def served_metric_names(settings) -> set[str]:
    # One acknowledged webhook, so the ACK histogram has samples to serve.
    receive_github(Client(), delivery="monitoring")
    settings.METRICS_BEARER_TOKEN = "monitoring-test-token-0123456789"
    response = Client().get(
        "/metrics", HTTP_AUTHORIZATION=f"Bearer {settings.METRICS_BEARER_TOKEN}"
    )
    assert response.status_code == 200
    # A family is declared (HELP, TYPE) even while it has no sample, e.g. the drift before
    # the first reconciliation run; samples add the histogram's _bucket, _sum and _count.
    families = list(text_string_to_metric_families(response.content.decode()))
    return {family.name for family in families} | {
        sample.name for family in families for sample in family.samples
    }


@pytest.mark.parametrize("source", ["rules", "dashboard"])
def test_every_metric_named_is_served_by_metrics(settings, source):
    queries = rule_queries() if source == "rules" else dashboard_queries()
    named = {name for query in queries for name in METRIC_NAME.findall(query)}
    assert named, "no metric found: the pattern or the file is wrong"
    missing = named - served_metric_names(settings)
    assert not missing, f"{source} name metrics /metrics does not serve: {sorted(missing)}"
