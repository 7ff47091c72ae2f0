"""Backend ``workload``: Kubernetes' own gang scheduling, a Workload and a PodGroup (``scheduling.k8s.io``, KEP-4671).

One reservation is one Workload (a single PodGroupTemplate ``workers`` with
``schedulingPolicy.gang.minCount = n``) and one runtime PodGroup of the same
name that refers to it, both named ``plan.gang_name``. The default
kube-scheduler's GangScheduling plugin keeps every pod whose
``spec.schedulingGroup.podGroupName`` names the PodGroup out of the active
queue until ``minCount`` of them exist, and binds none of them until all
``minCount`` fit: a gang holds no GPU half-placed.

The API moved between releases (read in the Kubernetes source, not guessed):

| server | versions serving Workload and PodGroup | PodGroup's link to its template |
|---|---|---|
| 1.35 | v1alpha1 (no PodGroup object: pods named the Workload) | not supported here |
| 1.36 | v1alpha2 | ``spec.podGroupTemplateRef.workload.{workloadName, podGroupTemplateName}`` |
| 1.37 | v1beta1 (preferred), v1alpha3 | ``spec.workloadRef.{workloadName, templateName}`` |

all behind the ``GenericWorkload`` feature gate (off by default, beta in 1.37)
on kube-apiserver and kube-scheduler, and beta/alpha API versions must be
enabled with ``--runtime-config``. :func:`choose_api_version` picks the version
from what API discovery says the server serves; the reservation path asks the
server (gang/reservation.py) before it writes anything, so an older server
gets a :class:`PermanentError` naming the missing API and the gate, and nothing
is created.

Pods join with ``spec.schedulingGroup.podGroupName``. KubeRay v1.6 builds pods
with Kubernetes 0.35 types and its RayCluster CRD has no such field, so the
field set in the worker group's template is pruned: the pods also carry the
label ``raygpu.io/scheduling-group: <PodGroup>``, which the
MutatingAdmissionPolicy of ``deploy/workload`` copies into the field when the
pod is created (docs/decisions.md). The field is immutable, so it cannot be
added later.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from raygpu.errors import PermanentError
from raygpu.gang.backends.base import GangBackend, gang_object_metadata
from raygpu.gang.backends.topology import add_pod_affinity, scheduling_constraints
from raygpu.model.gang import Backend, GangPlan, GangRequest
from raygpu.model.labels import LABEL_SCHEDULING_GROUP

GROUP = "scheduling.k8s.io"
# Most preferred first. v1alpha3 has v1beta1's shape; v1alpha2 links a PodGroup to its template differently.
VERSIONS = ("v1beta1", "v1alpha3", "v1alpha2")
NEEDED_KINDS = frozenset({"Workload", "PodGroup"})
FEATURE_GATE = "GenericWorkload"
TOPOLOGY_GATE = "TopologyAwareWorkloadScheduling"  # alpha, off by default in 1.36 and 1.37
TEMPLATE_NAME = "workers"  # the Workload's one PodGroupTemplate: the reservation's pods
DEFAULT_SCHEDULER_NAME = "default-scheduler"  # kube-scheduler's default profile runs GangScheduling
MAP_NAME = "raygpu-scheduling-group"  # deploy/workload: the policy that sets spec.schedulingGroup


def choose_api_version(served: Mapping[str, Iterable[str]]) -> str:
    """The ``scheduling.k8s.io/<version>`` to use, from ``served`` (version -> kinds, as API discovery lists them).

    The first of :data:`VERSIONS` that serves both Workload and PodGroup.
    Raises PermanentError naming the API, the versions looked for, the
    feature gate and what the server does serve, when none does.
    """
    for version in VERSIONS:
        if NEEDED_KINDS <= set(served.get(version, ())):
            return f"{GROUP}/{version}"
    seen = "; ".join(f"{GROUP}/{v}: {', '.join(sorted(k)) or 'nothing'}" for v, k in sorted(served.items())) or \
        f"no {GROUP} API at all"
    raise PermanentError(
        f"gang backend workload needs the Workload API ({GROUP} {', '.join(VERSIONS)} serving Workload and "
        f"PodGroup: Kubernetes >= 1.36 with feature gate {FEATURE_GATE}=true on kube-apiserver and "
        f"kube-scheduler and the version enabled by --runtime-config, e.g. {GROUP}/v1beta1=true); "
        f"this server serves {seen}. Use another gang backend (coscheduling, kueue, volcano, none) on it")


class WorkloadBackend(GangBackend):
    """Builds the Workload and PodGroup of ``api_version`` (one of :data:`VERSIONS`; default v1beta1)."""

    name = Backend.WORKLOAD

    def __init__(self, api_version: str = f"{GROUP}/{VERSIONS[0]}",
                 scheduler_name: str = DEFAULT_SCHEDULER_NAME) -> None:
        """Raises PermanentError for an ``api_version`` this backend does not know the shape of."""
        if api_version not in {f"{GROUP}/{v}" for v in VERSIONS}:
            raise PermanentError(f"gang backend workload: unsupported API version {api_version!r}; "
                                 f"known: {', '.join(f'{GROUP}/{v}' for v in VERSIONS)}")
        self.api_version = api_version
        self.scheduler_name = scheduler_name

    def wire_pods(self, template: dict[str, Any], plan: GangPlan, request: GangRequest) -> None:
        """The pod label the admission policy reads, the field itself (kept where the CRD knows it), the scheduler."""
        template["metadata"]["labels"][LABEL_SCHEDULING_GROUP] = plan.gang_name
        spec = template.setdefault("spec", {})
        spec["schedulingGroup"] = {"podGroupName": plan.gang_name}
        spec["schedulerName"] = self.scheduler_name

    def gang_objects(self, plan: GangPlan, request: GangRequest, owner_ref: dict[str, Any] | None) -> list[dict[str, Any]]:
        """The Workload, then its PodGroup (``minCount`` = the reservation's pods); created in that order."""
        policy = {"gang": {"minCount": plan.pod_count}}
        constraints = scheduling_constraints(plan)  # a required topology; {} otherwise
        workload = {"apiVersion": self.api_version, "kind": "Workload",
                    "metadata": gang_object_metadata(plan, request, owner_ref),
                    "spec": {"controllerRef": {"apiGroup": "ray.io", "kind": "RayCluster", "name": plan.cluster},
                             "podGroupTemplates": [{"name": TEMPLATE_NAME, "schedulingPolicy": policy,
                                                    **constraints}]}}
        if self.api_version.endswith("/v1alpha2"):
            link = {"podGroupTemplateRef": {"workload": {"workloadName": plan.gang_name,
                                                         "podGroupTemplateName": TEMPLATE_NAME}}}
        else:
            link = {"workloadRef": {"workloadName": plan.gang_name, "templateName": TEMPLATE_NAME}}
        pod_group = {"apiVersion": self.api_version, "kind": "PodGroup",
                     "metadata": gang_object_metadata(plan, request, owner_ref),
                     "spec": {**link, "schedulingPolicy": policy, **constraints}}
        return [workload, pod_group]

    def wire_topology(self, template: dict[str, Any], plan: GangPlan) -> None:
        """A required topology is the PodGroup's ``schedulingConstraints`` (gang_objects), which the
        scheduler places the whole gang by; the API has no preferred one, so that is pod affinity."""
        if plan.topology is not None and not plan.topology.required:
            add_pod_affinity(template, plan)

    def check_created(self, sent: dict[str, Any], made: dict[str, Any]) -> None:
        """Raises PermanentError when the server dropped ``schedulingConstraints``: with feature gate
        TopologyAwareWorkloadScheduling off, kube-apiserver silently clears the field on create, and the gang
        would be placed without its required topology."""
        wanted = _constraints(sent)
        if wanted and _constraints(made) != wanted:
            raise PermanentError(
                f"the API server dropped the required topology constraint of {sent.get('kind')} "
                f"{(sent.get('metadata') or {}).get('name')} (schedulingConstraints {wanted}): it needs feature "
                f"gate {TOPOLOGY_GATE}=true on kube-apiserver and kube-scheduler; nothing was left placed without "
                "it. Use backend kueue (Topology Aware Scheduling) or another backend (pod affinity) on this cluster")


def _constraints(obj: dict[str, Any]) -> Any:
    """``schedulingConstraints`` of a PodGroup, or of a Workload's (one) PodGroupTemplate; None if unset."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Workload":
        spec = (spec.get("podGroupTemplates") or [{}])[0] or {}
    return spec.get("schedulingConstraints")
