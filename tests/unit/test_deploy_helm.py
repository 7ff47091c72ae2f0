"""deploy/helm/raygpu renders the same objects as the kustomize bases (issue 16 item 2).

Both sides are rendered by the real tools: ``helm template`` (helm built by .ci/setup from helm.sh/helm/v4)
and ``kubectl kustomize`` (kustomize v5 inside the kubectl .ci/setup builds for the testbed), and compared
object by object; the Python render the testbed applies (``raygpu.testing.manifests``) is held to the same
objects. The tools missing is a failure, not a skip: CI builds them (docs/decisions.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from raygpu.testing import components
from raygpu.testing import manifests as m

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "raygpu"
EXAMPLE = REPO / "deploy" / "examples" / "raycluster-with-sidecar.yaml"


def tool(name: str) -> Path:
    path = components.tool(name)
    if not path.exists():
        pytest.fail(f"{name} is not built at {path}: run .ci/setup, or "
                    f"`bash raygpu/testing/scripts/build-components.sh {'helm' if name == 'helm' else 'k8s'}`")
    return path


def run(*cmd: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)


def objects(text: str) -> list[dict]:
    return sorted((o for o in yaml.safe_load_all(text) if o),
                  key=lambda o: (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]))


HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by")


def helm_template(*args: str, namespace: str = "ray", helm_labels: bool = False) -> list[dict]:
    """The chart's objects; without Helm's own labels unless ``helm_labels`` (the kustomize bases have none)."""
    out = run(tool("helm"), "template", "raygpu", CHART, "--namespace", namespace, *args)
    assert out.returncode == 0, out.stderr
    objs = objects(out.stdout)
    if not helm_labels:
        for o in objs:
            labels = o["metadata"].get("labels", {})
            for k in HELM_LABELS:
                labels.pop(k, None)
    return objs


def helm_refuses(*args: str) -> str:
    out = run(tool("helm"), "template", "raygpu", CHART, "--namespace", "ray", *args)
    assert out.returncode != 0, f"helm rendered {args} without complaint"
    return out.stderr


def kustomize(folder: Path) -> list[dict]:
    out = run(tool("kubectl"), "kustomize", folder)
    assert out.returncode == 0, out.stderr
    return objects(out.stdout)


# --------------------------------------------------------- the same objects
def test_the_chart_renders_the_objects_of_the_example_overlay():
    overlay = kustomize(REPO / "deploy" / "examples" / "sidecar-overlay")  # namespace ray, RayCluster gpu-cluster
    assert [o["kind"] for o in overlay] == ["Role", "RoleBinding", "ServiceAccount"]
    assert helm_template("--set", "cluster=gpu-cluster") == overlay
    # the testbed's Python render grants the same (it leaves labels and the subject's namespace to defaults)
    [role] = [o for o in m.sidecar_deploy_objects("ray", "gpu-cluster") if o["kind"] == "Role"]
    assert role["rules"] == overlay[0]["rules"]


def test_the_chart_with_sidecar_policy_adds_the_objects_of_deploy_sidecar_policy():
    policies = kustomize(REPO / "deploy" / "sidecar-policy")
    assert len(policies) == 4
    base = helm_template("--set", "cluster=gpu-cluster")
    rendered = helm_template("--set", "cluster=gpu-cluster", "--set", "sidecarPolicy.enabled=true")
    assert [o for o in rendered if o not in base] == policies
    assert [o["spec"] for o in objects(yaml.safe_dump_all(m.sidecar_policy_objects()))] == [o["spec"] for o in policies]


def sidecar_overlay_with(tmp_path: Path, folder: str) -> list[dict]:
    """kustomize's objects of an overlay (namespace ray, nameSuffix -llm) of deploy/sidecar and deploy/<folder>."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "ray", "nameSuffix": "-llm",
        "resources": [os.path.relpath(REPO / "deploy" / "sidecar", overlay),
                      os.path.relpath(REPO / "deploy" / folder, overlay)]}))
    return kustomize(overlay)


def test_the_chart_with_gang_scale_up_adds_the_objects_of_deploy_sidecar_scale_up(tmp_path):
    both = sidecar_overlay_with(tmp_path, "sidecar-scale-up")
    expected = [o for o in both if "scale-up" in o["metadata"]["name"]]
    assert [(o["kind"], o["metadata"]["name"]) for o in expected] == [
        ("Role", "raygpu-sidecar-scale-up-llm"), ("RoleBinding", "raygpu-sidecar-scale-up-llm")]
    assert expected[1]["subjects"][0]["name"] == "raygpu-sidecar-llm"  # the sidecar's own, renamed alike
    base = helm_template("--set", "cluster=llm", "--set", "nameSuffix=-llm")
    rendered = helm_template("--set", "cluster=llm", "--set", "nameSuffix=-llm", "--set", "gangScaleUp.enabled=true")
    assert [o for o in rendered if o not in base] == expected


def test_the_chart_with_doctor_adds_the_objects_of_deploy_sidecar_doctor(tmp_path):
    both = sidecar_overlay_with(tmp_path, "sidecar-doctor")
    expected = [o for o in both if "doctor" in o["metadata"]["name"]]
    assert [(o["kind"], o["metadata"]["name"]) for o in expected] == [
        ("ClusterRole", "raygpu-sidecar-doctor-llm"), ("ClusterRoleBinding", "raygpu-sidecar-doctor-llm")]
    assert expected[0]["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}]
    assert expected[1]["subjects"] == [{"kind": "ServiceAccount", "name": "raygpu-sidecar-llm", "namespace": "ray"}]
    base = helm_template("--set", "cluster=llm", "--set", "nameSuffix=-llm")
    rendered = helm_template("--set", "cluster=llm", "--set", "nameSuffix=-llm", "--set", "doctor.enabled=true")
    assert [o for o in rendered if o not in base] == expected


DRIVER_OVERLAY = REPO / "deploy" / "examples" / "driver-overlay"


def test_the_chart_with_driver_adds_the_objects_of_the_driver_overlay():
    driver = kustomize(DRIVER_OVERLAY)  # namespace ray, RayCluster gpu-cluster
    assert [o["kind"] for o in driver] == ["Role", "RoleBinding", "ServiceAccount"]
    base = helm_template("--set", "cluster=gpu-cluster")
    rendered = helm_template("--set", "cluster=gpu-cluster", "--set", "driver.enabled=true")
    assert [o for o in rendered if o not in base] == driver


def test_name_suffix_and_namespace_render_as_a_kustomize_overlay_with_name_suffix_does(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "team-a", "nameSuffix": "-llm",
        "resources": [os.path.relpath(REPO / "deploy" / "sidecar", overlay)],  # kustomize: no absolute roots
        "patches": [{"target": {"kind": "Role", "name": "raygpu-sidecar"}, "patch": yaml.safe_dump([
            {"op": "replace", "path": "/rules/0/resourceNames/0", "value": "llm"},
            {"op": "replace", "path": "/rules/4/resourceNames/0", "value": "llm-raygpu-warm"}])}]}))
    expected = kustomize(overlay)
    assert {o["metadata"]["name"] for o in expected} == {"raygpu-sidecar-llm"}
    assert helm_template("--set", "cluster=llm", "--set", "nameSuffix=-llm", "--set", "namespace=team-a",
                         namespace="default") == expected


def test_the_chart_can_render_the_example_raycluster_itself(tmp_path):
    example = yaml.safe_load(EXAMPLE.read_text())
    annotations = dict(example["metadata"]["annotations"])
    mode = annotations.pop("raygpu.io/reclaim")
    head = example["spec"]["headGroupSpec"]["template"]["spec"]
    containers = {c["name"]: c for c in head["containers"]}
    sidecar = containers["raygpu-sidecar"]
    repo, _, tag = sidecar["image"].rpartition(":")
    values = {"cluster": example["metadata"]["name"], "mode": mode, "image": {"repository": repo, "tag": tag},
              "metrics": {"port": sidecar["ports"][0]["containerPort"]},
              "rayCluster": {"create": True, "rayVersion": example["spec"]["rayVersion"],
                             "rayImage": containers["ray-head"]["image"], "annotations": annotations,
                             "head": {"resources": containers["ray-head"]["resources"]},
                             "sidecar": {"args": [a for a in sidecar["args"] if not a.startswith("--metrics-port")],
                                         "resources": sidecar["resources"]},
                             "workerGroupSpecs": example["spec"]["workerGroupSpecs"]}}
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    [rc] = [o for o in helm_template("-f", str(values_file)) if o["kind"] == "RayCluster"]
    assert rc["metadata"].pop("namespace") == "ray"
    assert rc == example


def test_metrics_port_zero_drops_the_port_and_the_probe_and_tells_the_sidecar():
    [rc] = [o for o in helm_template("--set", "cluster=gpu-cluster", "--set", "metrics.port=0",
                                     "--set", "rayCluster.create=true") if o["kind"] == "RayCluster"]
    [sidecar] = [c for c in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
                 if c["name"] == "raygpu-sidecar"]
    assert "--metrics-port=0" in sidecar["args"] and "ports" not in sidecar and "readinessProbe" not in sidecar


# ------------------------------------------------------------- monitoring (docs/monitoring.md)
MONITORING = REPO / "deploy" / "monitoring"
MONITORING_ON = ("--set", "monitoring.service.enabled=true", "--set", "monitoring.serviceMonitor.enabled=true",
                 "--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.prometheusRule.enabled=true",
                 "--set", "monitoring.grafanaDashboard.enabled=true")


def test_monitoring_is_off_by_default_and_each_option_adds_its_object():
    base = helm_template("--set", "cluster=gpu-cluster")
    assert not {"Service", "ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} & {o["kind"] for o in base}
    added = {}
    for option, kinds in {"service": ["Service"], "serviceMonitor": ["Service", "ServiceMonitor"],
                          "podMonitor": ["PodMonitor"], "prometheusRule": ["PrometheusRule"],
                          "grafanaDashboard": ["ConfigMap"]}.items():
        rendered = helm_template("--set", "cluster=gpu-cluster", "--set", f"monitoring.{option}.enabled=true")
        added[option] = [o for o in rendered if o not in base]
        assert sorted(o["kind"] for o in added[option]) == kinds, option
    assert added["service"][0]["metadata"]["name"] == "raygpu-sidecar-metrics"


def test_monitoring_objects_scrape_the_sidecars_port_and_carry_deploy_monitoring_s_files():
    objs = {o["kind"]: o for o in helm_template("--set", "cluster=gpu-cluster", "--set", "rayCluster.create=true",
                                                 "--set", "monitoring.serviceMonitor.labels.release=prom",
                                                 *MONITORING_ON)}
    head = objs["RayCluster"]["spec"]["headGroupSpec"]["template"]["spec"]
    [port] = [c for c in head["containers"] if c["name"] == "raygpu-sidecar"][0]["ports"]
    svc, sm, pm = objs["Service"], objs["ServiceMonitor"], objs["PodMonitor"]
    # the Service and the PodMonitor select the RayCluster's head pod (KubeRay's labels) and its named port
    head_labels = {"ray.io/cluster": "gpu-cluster", "ray.io/node-type": "head"}
    assert svc["spec"]["selector"] == head_labels == pm["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == port["name"] and svc["spec"]["ports"][0]["port"] == port["containerPort"]
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == port["name"]
    # the ServiceMonitor selects that Service, on that port, and is labelled for the operator's selector
    svc_labels = helm_template("--set", "cluster=gpu-cluster", *MONITORING_ON, helm_labels=True)
    [svc_labels] = [o["metadata"]["labels"] for o in svc_labels if o["kind"] == "Service"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc_labels.items()
    assert "app.kubernetes.io/version" not in sm["spec"]["selector"]["matchLabels"]
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    assert sm["metadata"]["labels"]["release"] == "prom"
    # both add the ray_cluster label the rules and the dashboard group by
    for endpoint in (sm["spec"]["endpoints"][0], pm["spec"]["podMetricsEndpoints"][0]):
        assert {"sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"], "targetLabel": "ray_cluster"} in \
            endpoint["relabelings"]
    assert objs["PrometheusRule"]["spec"] == yaml.safe_load((MONITORING / "raygpu-rules.yaml").read_text())
    dashboard = objs["ConfigMap"]["data"]["raygpu.json"]
    assert json.loads(dashboard) == json.loads((MONITORING / "grafana-dashboard.json").read_text())
    assert objs["ConfigMap"]["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize("option", ["service", "serviceMonitor", "podMonitor"])
def test_scraping_with_metrics_port_zero_is_refused_naming_the_port(option):
    assert "metrics.port" in helm_refuses("--set", "cluster=gpu", "--set", "metrics.port=0",
                                          "--set", f"monitoring.{option}.enabled=true")


def test_helm_lint_passes_with_every_option_on():
    out = run(tool("helm"), "lint", CHART, "--strict", "--set", "cluster=gpu-cluster", "--set", "driver.enabled=true",
              "--set", "sidecarPolicy.enabled=true", "--set", "gangScaleUp.enabled=true",
              "--set", "rayCluster.create=true", "--set", "guard.priorityClass.enabled=true",
              "--set", "workloadPolicy.enabled=true", "--set", "imagePullSecrets[0].name=regcred", *MONITORING_ON)
    assert out.returncode == 0, out.stdout + out.stderr


# ------------------------------------------------------------- bad values
@pytest.mark.parametrize("args, says", [
    ((), "cluster"),                                                      # no RayCluster named
    (("--set", "cluster=Gpu"), "cluster"),                                # no RayCluster can have that name
    (("--set", "cluster=gpu", "--set", "mode=sometimes"), "mode"),        # off | dry-run | on
    (("--set", "cluster=gpu", "--set-json", "mode=false"), "mode"),       # a bare `mode: off` in a values file
    (("--set", "cluster=gpu", "--set", "metrics.port=70000"), "port"),
    (("--set", "cluster=gpu", "--set", "nameSuffix=llm"), "nameSuffix"),  # must start with "-"
    (("--set", "cluster=gpu", "--set", "monitoring.podMonitor.interval=often"), "interval"),
    (("--set", "cluster=gpu", "--set", "monitoring.servicemonitor.enabled=true"), "servicemonitor"),  # a typo
])
def test_bad_values_are_refused_naming_the_value(args, says):
    assert says in helm_refuses(*args)


def test_helm_lint_passes():
    out = run(tool("helm"), "lint", CHART, "--strict", "--set", "cluster=gpu-cluster")
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("cluster", ["gpu-cluster", "team.a.llm", "a" * 51, "a" * 52, "b" * 63,
                                     "x" * 40 + ".y" * 6, "a" * 253])
def test_the_role_names_the_keep_warm_configmap_the_sidecar_uses(cluster):
    """Dotted names and names of 52 characters and more are hashed by the sidecar (warm_state_name); the
    Role's resourceNames must be that very name, or keep-warm is refused on such clusters."""
    from raygpu.model.labels import warm_state_name
    [role] = [o for o in helm_template("--set", f"cluster={cluster}") if o["kind"] == "Role"
              and any("patch" in r["verbs"] and r.get("resourceNames") for r in o["rules"]
                      if r["resources"] == ["configmaps"])]
    [names] = [r["resourceNames"] for r in role["rules"] if r["resources"] == ["configmaps"] and r.get("resourceNames")]
    assert names == [warm_state_name(cluster)]


ALL_ON = ("--set", "cluster=gpu-cluster", "--set", "sidecarPolicy.enabled=true", "--set", "gangScaleUp.enabled=true",
          "--set", "driver.enabled=true", "--set", "rayCluster.create=true")


def test_every_object_but_the_users_raycluster_carries_the_standard_helm_labels():
    objs = helm_template(*ALL_ON, *MONITORING_ON, "--set", "nameOverride=acme", helm_labels=True)
    for o in objs:
        if o["kind"] == "RayCluster":
            continue
        labels = o["metadata"]["labels"]
        assert labels["helm.sh/chart"] == "raygpu-0.1.0", o["metadata"]
        assert labels["app.kubernetes.io/instance"] == "raygpu"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == "0.1.0-ray2.60.0"
        assert labels["app.kubernetes.io/name"] in ("acme-sidecar", "acme-driver"), labels


def test_full_name_override_names_the_sidecars_and_the_drivers_objects():
    objs = helm_template(*ALL_ON, "--set", "fullnameOverride=raygpu-sidecar-prod")
    names = {(o["kind"], o["metadata"]["name"]) for o in objs if o["kind"] in ("ServiceAccount", "RoleBinding")}
    assert ("ServiceAccount", "raygpu-sidecar-prod") in names and ("ServiceAccount", "raygpu-driver-prod") in names
    [rc] = [o for o in objs if o["kind"] == "RayCluster"]
    assert rc["spec"]["headGroupSpec"]["template"]["spec"]["serviceAccountName"] == "raygpu-sidecar-prod"
    # a name the admission policies would not know as the sidecar's is refused
    assert "fullnameOverride" in helm_refuses("--set", "cluster=gpu-cluster", "--set", "fullnameOverride=my-sidecar")


def test_the_sidecar_container_is_restricted_and_probed_and_the_pod_gets_pull_secrets():
    [rc] = [o for o in helm_template(*ALL_ON, "--set", "imagePullSecrets[0].name=regcred") if o["kind"] == "RayCluster"]
    pod = rc["spec"]["headGroupSpec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    [sidecar] = [c for c in pod["containers"] if c["name"] == "raygpu-sidecar"]
    sc = sidecar["securityContext"]
    assert sc == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                  "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}}
    assert {"name": "raygpu-sidecar-tmp", "mountPath": "/tmp"} in sidecar["volumeMounts"]  # Ray's session files
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "raygpu-metrics"}


@pytest.mark.parametrize("args", [("--set", "nosuchkey=1"), ("--set", "image.nosuch=1"),
                                  ("--set", "rayCluster.sidecar.nosuch=1"), ("--set", "gangScaleUp.on=true")])
def test_an_unknown_value_is_refused_not_ignored(args):
    """additionalProperties: false, as KubeRay's and Kueue's schemas: a misspelt value never passes silently."""
    assert "additional" in helm_refuses("--set", "cluster=gpu-cluster", *args).lower()


@pytest.mark.parametrize("option, source, copy", [
    ("guard.priorityClass.enabled", "deploy/guard/priorityclasses.yaml", "guard-priorityclasses.yaml"),
    ("workloadPolicy.enabled", "deploy/workload/mutating-admission-policy.yaml",
     "workload-mutating-admission-policy.yaml")])
def test_the_guards_priority_class_and_the_workload_policy_are_chart_options_equal_to_deploy(option, source, copy):
    """Off by default; on, the chart renders exactly the objects of the deploy/ file (plus Helm's labels)."""
    base = helm_template("--set", "cluster=gpu-cluster")
    added = [o for o in helm_template("--set", "cluster=gpu-cluster", "--set", f"{option}=true") if o not in base]
    assert added == objects((REPO / source).read_text())
    chart_copy = REPO / "deploy/helm/raygpu/files" / copy
    assert chart_copy.read_text() == (REPO / source).read_text(), "run deploy/monitoring/sync-chart-files.sh"
