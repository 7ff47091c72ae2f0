"""Issue 16 item 4: every manifest raygpu ships applies on a real API server (server-side dry run).

Walks ``deploy/**`` and ``examples/**`` (``manifests.shipped_manifests``): every plain YAML file on its own,
as ``kubectl apply -f`` would, and every kustomization directory rendered by the testbed's ``kubectl
kustomize``, as ``kubectl apply -k`` would. Each object is server-side applied with ``dryRun=All``: schema,
CRD validation, admission (ValidatingAdmissionPolicy CEL type-checking included) run, nothing is stored.
Cluster-scoped objects (PriorityClass, ValidatingAdmissionPolicy and its binding) included. A namespaced
object goes to the test's namespace (the overlays name ``ray``, which the testbed does not have).

Skipped on purpose: ``deploy/helm`` (a Helm chart, rendered and compared by its own tests, and dry-run applied
by test_deploy_helm_dry_run.py), ``deploy/monitoring`` (Prometheus rules and a Grafana dashboard, no Kubernetes
objects: tests/unit/test_monitoring.py) and every file
that is not ``*.yaml``/``*.yml`` (``deploy/image``'s Containerfile, the Python examples). A failure names
the file (or kustomization), the document's index, and the object.
"""

from __future__ import annotations

import subprocess

import pytest
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from raygpu.testing import components
from raygpu.testing import manifests as m
from raygpu.testing.kube import FIELD_MANAGER, load_yaml_docs


def _dry_run_apply(kube, obj: dict, ns: str) -> None:
    res = kube.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    if res.namespaced:
        obj["metadata"]["namespace"] = ns
    res.server_side_apply(body=obj, name=obj["metadata"]["name"], namespace=ns if res.namespaced else None,
                          field_manager=FIELD_MANAGER, force_conflicts=True, dry_run="All")


@pytest.mark.k137  # manifests 1.34 does not serve apply on 1.37
def test_every_shipped_manifest_applies_with_server_side_dry_run(testbed, ns, kube):
    kubectl = components.ensure_built(progress=lambda _m: None).kubectl
    files, kustomizations = m.shipped_manifests()
    # (where, its objects, the Kubernetes minor its tree needs or None): needs_kubernetes once per source
    sources: list[tuple[str, list[dict], str | None]] = [(str(f), load_yaml_docs(m.REPO / f), m.needs_kubernetes(f))
                                                         for f in files]
    for k in kustomizations:
        out = subprocess.run([str(kubectl), "kustomize", str(m.REPO / k)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"kubectl kustomize {k}: {out.stderr}"
        sources.append((f"{k}/ (kustomize)", load_yaml_docs(out.stdout), m.needs_kubernetes(k)))
    # the walk found what the repository ships (a moved or renamed tree would otherwise pass empty)
    assert {"deploy/sidecar", "deploy/driver", "deploy/sidecar-policy"} <= {str(k) for k in kustomizations}
    assert "deploy/guard/priorityclasses.yaml" in {str(f) for f in files}
    assert not [f for f in files if str(f).startswith(("deploy/helm/", "deploy/monitoring/"))]

    failures, applied, kinds, not_served = [], 0, set(), []
    for where, docs, need in sources:
        assert docs, f"{where}: no object in it"
        for i, obj in enumerate(docs):
            what = f"{where} document {i}: {obj.get('kind')} {(obj.get('metadata') or {}).get('name')}"
            try:
                _dry_run_apply(kube, obj, ns)
                applied += 1
                kinds.add(obj["kind"])
            except ResourceNotFoundError as e:
                # an API this control plane does not serve: expected only where the tree says it needs a newer
                # one (the 1.37 pass of .ci/run applies it); anywhere else a failure like any other
                if need and not m.minor_at_least(testbed.kubernetes, need):
                    not_served.append(what)
                else:
                    failures.append(f"{what}: {type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - every failure is reported, not only the first
                failures.append(f"{what}: {type(e).__name__}: {getattr(e, 'body', None) or e}")
    assert not failures, "\n".join(failures)
    # on an older control plane exactly the trees that need a newer one were not served, and said so
    needing = [where for where, _, need in sources if need]
    if all(m.minor_at_least(testbed.kubernetes, v) for v in m.NEEDS_KUBERNETES.values()):
        assert not not_served, not_served
    else:
        assert needing and {w.split(" document ")[0] for w in not_served} == set(needing), (needing, not_served)
        print(f"not served by Kubernetes {testbed.kubernetes} (applied in the 1.37 pass): {not_served}")
    assert {"PriorityClass", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Role",
            "RoleBinding", "ServiceAccount", "RayCluster"} <= kinds, kinds
    # dryRun=All stored nothing
    assert not kube.resources.get(api_version="v1", kind="ServiceAccount").get(
        namespace=ns, field_selector="metadata.name=raygpu-driver").items
    assert applied >= len(sources)


def test_the_example_overlays_render_the_roles_the_tests_use():
    """kubectl kustomize of each example overlay gives the Role rules that manifests.*_deploy_objects build,
    which the RBAC integration tests apply: what they prove is what an operator applies."""
    kubectl = components.ensure_built(progress=lambda _m: None).kubectl
    for overlay, build in {"deploy/examples/sidecar-overlay": m.sidecar_deploy_objects,
                           "deploy/examples/driver-overlay": m.driver_deploy_objects}.items():
        out = subprocess.run([str(kubectl), "kustomize", str(m.REPO / overlay)], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, f"kubectl kustomize {overlay}: {out.stderr}"
        [rendered] = [o for o in load_yaml_docs(out.stdout) if o["kind"] == "Role"]
        [built] = [o for o in build(rendered["metadata"]["namespace"], "gpu-cluster") if o["kind"] == "Role"]
        assert rendered["rules"] == built["rules"], overlay
        assert rendered["metadata"]["namespace"] == "ray"
