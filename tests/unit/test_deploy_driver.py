"""deploy/driver: the driver's Role is what docs/permissions.md lists, limited to its RayCluster by name.

Issue 16 item 3. These tests read the shipped YAML (the kustomize base and the example overlay) and the
permission table of docs/permissions.md, so a change to one without the other fails here. That the Role is
enough, and each verb used, is shown on the testbed (tests/integration/test_driver_rbac.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raygpu.testing import manifests as m
from raygpu.testing.builders import apply_json_patch

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "driver"
OVERLAY = REPO / "deploy" / "examples" / "driver-overlay" / "kustomization.yaml"


def role(objs: list[dict]) -> dict:
    [r] = [o for o in objs if o["kind"] == "Role"]
    return r


def granted(rules: list[dict]) -> dict[str, set[str]]:
    """resource (``<plural>[.<group>]``) -> verbs, over every rule."""
    out: dict[str, set[str]] = {}
    for r in rules:
        for group in r["apiGroups"]:
            for res in r["resources"]:
                out.setdefault(f"{res}.{group}" if group else res, set()).update(r["verbs"])
    return out


def documented_permissions() -> dict[str, set[str]]:
    """The table under "## The driver" in docs/permissions.md: resource -> verbs."""
    text = (REPO / "docs" / "permissions.md").read_text()
    section = text.split("## The driver", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([a-z, ]+) \|", section, flags=re.M)
    assert rows, "no permission table in docs/permissions.md"
    out: dict[str, set[str]] = {}
    for res, verbs in rows:
        out.setdefault(res, set()).update(v.strip() for v in verbs.split(","))
    return out


def test_the_role_grants_exactly_the_documented_verbs_and_its_raycluster_by_name_only():
    rules = role(m.driver_deploy_objects("ray", "gpu-cluster"))["rules"]
    for r in rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"], r
    assert granted(rules) == documented_permissions()
    [rc_rule] = [r for r in rules if "rayclusters" in r["resources"]]
    assert rc_rule["resources"] == ["rayclusters"] and rc_rule["resourceNames"] == ["gpu-cluster"]
    verbs = granted(rules)
    assert verbs["pods"] == {"list"}, "the driver never writes a pod: KubeRay does"
    assert not {"list", "watch"} & (verbs["configmaps"] | verbs["rayclusters.ray.io"])
    assert not {"secrets", "pods/exec", "serviceaccounts/token", "nodes"} & {res for r in rules for res in r["resources"]}


def test_the_base_binds_its_own_serviceaccount_and_names_a_placeholder():
    objs = m.driver_deploy_objects("ray", "gpu-cluster")
    assert [o["kind"] for o in objs] == ["ServiceAccount", "Role", "RoleBinding"]
    assert {o["metadata"]["name"] for o in objs} == {"raygpu-driver"}
    [binding] = [o for o in objs if o["kind"] == "RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "raygpu-driver"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "raygpu-driver"}]
    base = role(list(yaml.safe_load_all((BASE / "role.yaml").read_text())))
    [rc_rule] = [r for r in base["rules"] if "rayclusters" in r["resources"]]
    assert rc_rule["resourceNames"] == [m.RAYCLUSTER_NAME_PLACEHOLDER]


def test_the_example_overlay_renders_the_role_that_driver_deploy_objects_builds():
    overlay = yaml.safe_load(OVERLAY.read_text())
    [patch] = overlay["patches"]
    assert patch["target"] == {"kind": "Role", "name": "raygpu-driver"}
    base_role = role(list(yaml.safe_load_all((BASE / "role.yaml").read_text())))
    rendered = apply_json_patch(base_role, yaml.safe_load(patch["patch"]))
    assert rendered["rules"] == role(m.driver_deploy_objects(overlay["namespace"], "gpu-cluster"))["rules"]


@pytest.mark.parametrize("bad", ["", "RAYCLUSTER_NAME", "Gpu", "a_b", "a" * 254])
def test_driver_deploy_objects_refuses_a_name_no_raycluster_can_have(bad):
    with pytest.raises(ValueError, match="not a RayCluster name"):
        m.driver_deploy_objects("ray", bad)
