"""deploy/helm/raygpu renders the same objects as the kustomize bases (issue 16 item 2).

Both sides are rendered by the real tools: ``helm template`` (helm built by .ci/setup from helm.sh/helm/v4)
and ``kubectl kustomize`` (kustomize v5 inside the kubectl .ci/setup builds for the testbed), and compared
object by object; the Python render the testbed applies (``raygpu.testing.manifests``) is held to the same
objects. The tools missing is a failure, not a skip: CI builds them (docs/decisions.md).
"""

from __future__ import annotations

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


def helm_template(*args: str, namespace: str = "ray") -> list[dict]:
    out = run(tool("helm"), "template", "raygpu", CHART, "--namespace", namespace, *args)
    assert out.returncode == 0, out.stderr
    return objects(out.stdout)


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


def test_the_chart_with_gang_scale_up_adds_the_objects_of_deploy_sidecar_scale_up(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "ray", "nameSuffix": "-llm",
        "resources": [os.path.relpath(REPO / "deploy" / "sidecar", overlay),
                      os.path.relpath(REPO / "deploy" / "sidecar-scale-up", overlay)]}))
    both = kustomize(overlay)
    expected = [o for o in both if "scale-up" in o["metadata"]["name"]]
    assert [(o["kind"], o["metadata"]["name"]) for o in expected] == [
        ("Role", "raygpu-sidecar-scale-up-llm"), ("RoleBinding", "raygpu-sidecar-scale-up-llm")]
    assert expected[1]["subjects"][0]["name"] == "raygpu-sidecar-llm"  # the sidecar's own, renamed alike
    base = helm_template("--set", "cluster=llm", "--set", "nameSuffix=-llm")
    rendered = helm_template("--set", "cluster=llm", "--set", "nameSuffix=-llm", "--set", "gangScaleUp.enabled=true")
    assert [o for o in rendered if o not in base] == expected


def test_the_chart_with_doctor_adds_the_objects_of_deploy_sidecar_doctor(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "ray", "nameSuffix": "-llm",
        "resources": [os.path.relpath(REPO / "deploy" / "sidecar", overlay),
                      os.path.relpath(REPO / "deploy" / "sidecar-doctor", overlay)]}))
    both = kustomize(overlay)
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


# ------------------------------------------------------------- bad values
@pytest.mark.parametrize("args, says", [
    ((), "cluster"),                                                      # no RayCluster named
    (("--set", "cluster=Gpu"), "cluster"),                                # no RayCluster can have that name
    (("--set", "cluster=gpu", "--set", "mode=sometimes"), "mode"),        # off | dry-run | on
    (("--set", "cluster=gpu", "--set-json", "mode=false"), "mode"),       # a bare `mode: off` in a values file
    (("--set", "cluster=gpu", "--set", "metrics.port=70000"), "port"),
    (("--set", "cluster=gpu", "--set", "nameSuffix=llm"), "nameSuffix"),  # must start with "-"
])
def test_bad_values_are_refused_naming_the_value(args, says):
    assert says in helm_refuses(*args)


def test_helm_lint_passes():
    out = run(tool("helm"), "lint", CHART, "--strict", "--set", "cluster=gpu-cluster")
    assert out.returncode == 0, out.stdout + out.stderr
