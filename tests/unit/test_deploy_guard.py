"""deploy/guard/rbac.yaml grants what the guard's code asks for, in the guard namespace, and nothing broader."""

from __future__ import annotations

from pathlib import Path

import yaml

from raygpu.model.labels import DEFAULT_GUARD_NAMESPACE

DOCS = list(yaml.safe_load_all((Path(__file__).resolve().parents[2] / "deploy/guard/rbac.yaml").read_text()))


def _one(kind: str, name: str) -> dict:
    [doc] = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _rules(doc: dict) -> dict[tuple[str, str], set[str]]:
    return {(g, r): set(rule["verbs"]) for rule in doc["rules"] for g in rule["apiGroups"] for r in rule["resources"]}


def test_the_guard_namespace_role_covers_the_lease_ticket_and_blocker_writes_only_there():
    assert _one("Namespace", DEFAULT_GUARD_NAMESPACE)
    role = _one("Role", "raygpu-guard")
    assert role["metadata"]["namespace"] == DEFAULT_GUARD_NAMESPACE
    assert _rules(role) == {("coordination.k8s.io", "leases"): {"get", "list", "create", "patch", "delete"},
                            ("", "pods"): {"list", "create", "delete"}}
    binding = _one("RoleBinding", "raygpu-guard-drivers")
    assert binding["metadata"]["namespace"] == DEFAULT_GUARD_NAMESPACE and binding["roleRef"]["name"] == "raygpu-guard"


def test_cluster_wide_the_guard_only_reads_and_patches_pods_only_where_bound():
    assert _rules(_one("ClusterRole", "raygpu-guard-read")) == {
        ("", "nodes"): {"get", "list"}, ("", "pods"): {"list"}, ("scheduling.k8s.io", "priorityclasses"): {"get"}}
    assert _rules(_one("ClusterRole", "raygpu-guard-gang")) == {("", "pods"): {"patch"}}
    assert not [d for d in DOCS if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "raygpu-guard-gang"]



def test_the_guard_namespace_role_is_enough_to_backfill_and_each_lease_verb_is_needed():
    from raygpu.gang.reservation import _may_backfill
    from raygpu.testing.builders.clusters import cluster
    from raygpu.testing.fake_kube import FakeKube

    role = {(v, "leases") for v in _rules(_one("Role", "raygpu-guard"))[("coordination.k8s.io", "leases")]}
    kube = FakeKube(cluster("c").raw())
    kube.allowed = role | {("patch", "pods")}
    assert _may_backfill(kube, "default", print)  # the scope's Lease read, its own ask Lease written
    for verb in ("get", "create", "patch", "delete"):
        kube.allowed = role - {(verb, "leases")} | {("patch", "pods")}
        assert not _may_backfill(kube, "default", lambda m: None), verb
