"""Issue 26 item 5 and must-show 4: the Helm chart rendered with every option on, monitoring included, is
accepted by a real API server (server-side apply, ``dryRun=All``: schema, CRD validation and admission run,
nothing is stored).

The monitoring objects are prometheus-operator kinds (ServiceMonitor, PodMonitor, PrometheusRule): their CRDs
(v0.85.0, built into the component cache by .ci/setup, ``build-components.sh prometheus-operator-crds``) are
installed for the test where the testbed lacks them and deleted again afterwards (only those it installed).
The chart is rendered by the real ``helm template`` into the test's namespace; the cluster-scoped admission
policies are dry-run applied like the rest.
"""

from __future__ import annotations

import copy
import subprocess
import time

import pytest
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError, UnprocessibleEntityError

from raygpu.testing import components
from raygpu.testing.kube import FIELD_MANAGER, apply, load_yaml_docs
from raygpu.testing.manifests import REPO
from tests.integration.util import wait_for

CHART = REPO / "deploy" / "helm" / "raygpu"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
EVERY_OPTION = ["driver.enabled=true", "sidecarPolicy.enabled=true", "gangScaleUp.enabled=true",
                "rayCluster.create=true", "monitoring.service.enabled=true", "monitoring.serviceMonitor.enabled=true",
                "monitoring.podMonitor.enabled=true", "monitoring.prometheusRule.enabled=true",
                "monitoring.grafanaDashboard.enabled=true", "guard.priorityClass.enabled=true",
                "imagePullSecrets[0].name=regcred"]
# workloadPolicy.enabled: a MutatingAdmissionPolicy, served from Kubernetes 1.36 (the 1.37 pass applies
# deploy/workload itself, tests/integration/test_gang_workload.py); helm lint covers the chart's copy.


def _served(kube, api_version: str, kind: str, deadline_s: float = 30.0):
    """The resource once discovery serves it (a CRD just Established may take a moment to appear)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return kube.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            if time.monotonic() > end:
                raise
            time.sleep(0.5)


def _answers(kube, api, crd: dict, ns: str) -> bool:
    """The CRD is Established and its resource answers a LIST in ``ns``. The client's discovery is cached, so a CRD
    deleted by the test before and created again looks served at once; the server answers 404 on its path until
    it has set the CRD up again."""
    conds = {c["type"]: c["status"] for c in (api.get(name=crd["metadata"]["name"]).to_dict()
                                              .get("status", {}).get("conditions") or [])}
    if conds.get("Established") != "True":
        return False
    try:  # one look: the caller polls (a discovery miss refreshes the client's cache)
        kube.resources.get(api_version="monitoring.coreos.com/v1", kind=crd["spec"]["names"]["kind"]).get(namespace=ns)
        return True
    except (ResourceNotFoundError, NotFoundError):
        return False


@pytest.fixture
def prometheus_operator_crds(testbed, kube, ns):
    folder = components.prometheus_operator_crds()
    if not folder.exists():
        pytest.fail(f"the prometheus-operator CRDs are not at {folder}: run .ci/setup, or "
                    "`bash raygpu/testing/scripts/build-components.sh prometheus-operator-crds`")
    crds = [d for f in sorted(folder.glob("*.yaml")) for d in load_yaml_docs(f)
            if d.get("kind") == "CustomResourceDefinition"]
    assert {c["spec"]["names"]["kind"] for c in crds} == MONITORING_KINDS
    api = kube.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    added = []
    for crd in crds:
        try:
            api.get(name=crd["metadata"]["name"])
        except NotFoundError:
            apply(kube, crd)
            added.append(crd["metadata"]["name"])
    for crd in crds:
        wait_for(f"CRD {crd['metadata']['name']} answers", lambda crd=crd: _answers(kube, api, crd, ns), 60)
    yield
    for name in added:  # cluster-scoped: leave the testbed as it was
        api.delete(name=name)

    def gone(name: str) -> bool:  # a CRD being deleted still answers GET: the next test would take it for installed
        try:
            api.get(name=name)
            return False
        except NotFoundError:
            return True
    for name in added:
        wait_for(f"CRD {name} deleted", lambda name=name: gone(name), 60)


def _render(ns: str, *options: str) -> list[dict]:
    helm = components.tool("helm")
    if not helm.exists():
        pytest.fail(f"helm is not built at {helm}: run .ci/setup, or `bash raygpu/testing/scripts/build-components.sh helm`")
    argv = [str(helm), "template", "raygpu-test", str(CHART), "--namespace", ns, "--set", "cluster=gpu-cluster"]
    for o in options:
        argv += ["--set", o]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return load_yaml_docs(out.stdout)


def _dry_run_apply(kube, obj: dict, ns: str):
    res = _served(kube, obj["apiVersion"], obj["kind"])
    return res.server_side_apply(body=obj, name=obj["metadata"]["name"], namespace=ns if res.namespaced else None,
                                 field_manager=FIELD_MANAGER, force_conflicts=True, dry_run="All")


def test_the_chart_with_every_option_on_applies_with_server_side_dry_run(testbed, ns, kube, prometheus_operator_crds):
    objs = _render(ns, *EVERY_OPTION)
    kinds = {o["kind"] for o in objs}
    assert MONITORING_KINDS | {"Service", "ConfigMap", "RayCluster", "ValidatingAdmissionPolicy", "PriorityClass",
                               "ValidatingAdmissionPolicyBinding", "ServiceAccount", "Role", "RoleBinding"} <= kinds
    failures = []
    for obj in objs:
        try:
            live = _dry_run_apply(kube, copy.deepcopy(obj), ns)
            assert live.metadata.name == obj["metadata"]["name"]
        except Exception as e:  # noqa: BLE001 - every failure is reported, not only the first
            failures.append(f"{obj['kind']} {obj['metadata']['name']}: {type(e).__name__}: "
                            f"{getattr(e, 'body', None) or e}")
    assert not failures, "\n".join(failures)
    # dryRun=All stored nothing
    for kind in sorted(MONITORING_KINDS):
        assert not _served(kube, "monitoring.coreos.com/v1", kind).get(namespace=ns).items, kind
    assert not kube.resources.get(api_version="v1", kind="Service").get(namespace=ns).items


def test_the_api_server_checks_the_monitoring_objects_against_the_crds(testbed, ns, kube, prometheus_operator_crds):
    """The dry run above proves something: the CRDs' schemas refuse a broken monitor and a broken rule."""
    objs = {o["kind"]: o for o in _render(ns, *EVERY_OPTION)}
    monitor = copy.deepcopy(objs["ServiceMonitor"])
    monitor["spec"]["endpoints"][0]["interval"] = "every minute"  # not a Prometheus duration
    rule = copy.deepcopy(objs["PrometheusRule"])
    del rule["spec"]["groups"][0]["rules"][0]["expr"]  # a rule without an expression
    for broken, says in ((monitor, "interval"), (rule, "expr")):
        with pytest.raises(UnprocessibleEntityError) as e:
            _dry_run_apply(kube, broken, ns)
        assert says in str(e.value.body), e.value.body
