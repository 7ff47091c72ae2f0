"""deploy/: the sidecar's token reaches the raygpu-sidecar container only, and its Role is what the docs list.

Issue 14 item 4: user job code runs in the Ray head container, next to the sidecar. These tests read the
shipped YAML (the example RayCluster, the kustomize base and overlay, the admission policies) and
docs/sidecar.md's permission table, so a change to one without the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raygpu.testing import manifests as m
from raygpu.testing.builders import apply_json_patch

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "examples" / "raycluster-with-sidecar.yaml"
OVERLAY = REPO / "deploy" / "examples" / "sidecar-overlay" / "kustomization.yaml"
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def head_pod_spec() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())["spec"]["headGroupSpec"]["template"]["spec"]


def token_volumes(spec: dict) -> set[str]:
    """Names of the pod's volumes that project a ServiceAccount token."""
    return {v["name"] for v in spec.get("volumes") or []
            if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources") or [])}


def mounts(container: dict) -> dict[str, str]:
    return {vm["mountPath"].rstrip("/"): vm["name"] for vm in container.get("volumeMounts") or []}


def role(objs: list[dict]) -> dict:
    [r] = [o for o in objs if o["kind"] == "Role"]
    return r


def documented_permissions() -> dict[str, set[str]]:
    """The table under "## Permissions" in docs/sidecar.md: resource -> verbs."""
    text = (REPO / "docs" / "sidecar.md").read_text()
    section = text.split("## Permissions", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([a-z, ]+) \|", section, flags=re.M)
    assert rows, "no permission table in docs/sidecar.md"
    out: dict[str, set[str]] = {}
    for res, verbs in rows:  # a resource may have several rows (configmaps: state, keep-warm)
        out.setdefault(res, set()).update(v.strip() for v in verbs.split(","))
    return out


# ------------------------------------------------------------ the head pod
def test_the_head_pod_does_not_automount_and_only_the_sidecar_container_mounts_the_token():
    spec = head_pod_spec()
    assert spec["serviceAccountName"] == "raygpu-sidecar"
    assert spec["automountServiceAccountToken"] is False
    [vol] = token_volumes(spec)
    by_name = {c["name"]: c for c in spec["containers"]}
    assert spec["containers"][0]["name"] == "ray-head"  # KubeRay: the Ray container comes first
    assert mounts(by_name["raygpu-sidecar"]).get(TOKEN_DIR) == vol
    assert all(vm.get("readOnly") for vm in by_name["raygpu-sidecar"]["volumeMounts"] if vm["name"] == vol)
    for c in [*spec["containers"], *(spec.get("initContainers") or [])]:
        if c["name"] != "raygpu-sidecar":
            assert vol not in mounts(c).values(), c["name"]
            assert not any(p == TOKEN_DIR or p.startswith("/var/run/secrets") for p in mounts(c)), c["name"]


def test_the_projected_token_volume_gives_what_the_automount_would():
    spec = head_pod_spec()
    [vol] = token_volumes(spec)
    sources = next(v for v in spec["volumes"] if v["name"] == vol)["projected"]["sources"]
    token = next(s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s)
    assert token["path"] == "token" and 600 <= token["expirationSeconds"] <= 86400
    assert "audience" not in token  # the API server's own audience: the in-cluster client presents it
    ca = next(s["configMap"] for s in sources if "configMap" in s)
    assert ca["name"] == "kube-root-ca.crt" and ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    ns = next(s["downwardAPI"] for s in sources if "downwardAPI" in s)
    assert ns["items"] == [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]


def test_nothing_else_in_the_example_hands_the_sidecars_identity_to_ray_code():
    rc = yaml.safe_load(EXAMPLE.read_text())
    # KubeRay >= 1.6 mounts a token of the head pod's ServiceAccount into ray-head for Ray's K8s token auth
    assert not (rc["spec"].get("authOptions") or {}).get("enableK8sTokenAuth")
    # with in-tree autoscaling KubeRay binds its own Role to the head pod's ServiceAccount (docs/reclaimer.md)
    assert rc["spec"].get("enableInTreeAutoscaling") is False
    for g in rc["spec"]["workerGroupSpecs"]:
        assert g["template"]["spec"].get("serviceAccountName", "default") != "raygpu-sidecar", g["groupName"]


# ------------------------------------------------------------------ the Role
def test_the_role_grants_exactly_the_documented_verbs_and_rayclusters_by_name_only():
    rules = role(m.sidecar_deploy_objects("ray", "gpu-cluster"))["rules"]
    granted: dict[str, set[str]] = {}
    for r in rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"], r
        for group in r["apiGroups"]:
            for res in r["resources"]:
                granted.setdefault(f"{res}.{group}" if group else res, set()).update(r["verbs"])
    assert granted == documented_permissions()
    [rc_rule] = [r for r in rules if "rayclusters" in r["resources"]]
    assert rc_rule["resources"] == ["rayclusters"] and rc_rule["resourceNames"] == ["gpu-cluster"]
    [warm_rule] = [r for r in rules if "patch" in r["verbs"] and r["resources"] == ["configmaps"]]
    assert warm_rule["resourceNames"] == ["gpu-cluster-raygpu-warm"] and set(warm_rule["verbs"]) == {"get", "patch"}
    assert not {"secrets", "pods/exec", "serviceaccounts/token"} & {res for r in rules for res in r["resources"]}


def test_the_base_role_names_a_placeholder_that_matches_no_raycluster():
    base = [o for f in ("role.yaml",) for o in yaml.safe_load_all((REPO / "deploy" / "sidecar" / f).read_text())]
    [rc_rule] = [r for r in role(base)["rules"] if "rayclusters" in r["resources"]]
    assert rc_rule["resourceNames"] == [m.RAYCLUSTER_NAME_PLACEHOLDER]
    assert not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", m.RAYCLUSTER_NAME_PLACEHOLDER)


def test_the_example_overlay_renders_the_role_that_sidecar_deploy_objects_builds():
    overlay = yaml.safe_load(OVERLAY.read_text())
    [patch] = overlay["patches"]
    assert patch["target"] == {"kind": "Role", "name": "raygpu-sidecar"}
    base_role = role([o for o in yaml.safe_load_all((REPO / "deploy" / "sidecar" / "role.yaml").read_text())])
    rendered = apply_json_patch(base_role, yaml.safe_load(patch["patch"]))
    expected = role(m.sidecar_deploy_objects(overlay["namespace"], "gpu-cluster"))
    assert rendered["rules"] == expected["rules"]
    example = yaml.safe_load(EXAMPLE.read_text())
    assert example["metadata"]["name"] == "gpu-cluster"  # the overlay names the example's cluster


@pytest.mark.parametrize("bad", ["", "RAYCLUSTER_NAME", "Gpu", "a_b", "-a", "a" * 254])
def test_sidecar_deploy_objects_refuses_a_name_no_raycluster_can_have(bad):
    with pytest.raises(ValueError, match="not a RayCluster name"):
        m.sidecar_deploy_objects("ray", bad)


def test_the_sidecars_raycluster_watch_is_authorizable_by_resource_name():
    """RBAC authorizes a list/watch limited by resourceNames only when it carries metadata.name=<name>."""
    from kubernetes import client
    from raygpu.adapters.kube_watch import ClusterCache
    cache = ClusterCache(client.ApiClient(client.Configuration()), "ray", "gpu-cluster")
    assert cache.kinds["raycluster"].kwargs == {"field_selector": "metadata.name=gpu-cluster"}


# --------------------------------------------------------- admission policies
SIDECAR_USER = re.compile(r"^system:serviceaccount:[^:]+:raygpu-sidecar(-[^:]+)?$")


def test_every_admission_policy_is_bound_to_deny_fails_closed_and_matches_only_sidecar_accounts():
    objs = m.sidecar_policy_objects()
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {o["spec"]["policyName"]: o for o in objs if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(policies) == set(bindings) == {"raygpu-sidecar-rayclusters", "raygpu-sidecar-configmaps"}
    for name, p in policies.items():
        assert p["apiVersion"] == "admissionregistration.k8s.io/v1"
        assert p["spec"]["failurePolicy"] == "Fail"
        assert bindings[name]["spec"]["validationActions"] == ["Deny"]
        [cond] = p["spec"]["matchConditions"]
        assert SIDECAR_USER.pattern in cond["expression"]
    for user in ("system:serviceaccount:ray:raygpu-sidecar", "system:serviceaccount:ray:raygpu-sidecar-gpu"):
        assert SIDECAR_USER.match(user)
    for user in ("system:serviceaccount:ray:default", "system:serviceaccount:ray:my-raygpu-sidecar",
                 "raygpu-sidecar", "system:serviceaccount:ray:raygpu-sidecarx"):
        assert not SIDECAR_USER.match(user)
