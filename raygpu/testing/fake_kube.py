"""The one fake Kubernetes of the unit tests: the KubeAdapter calls the sidecar and the doctor make, over one
RayCluster dict, with the API server's semantics, namespaces included.

Every accepted patch is applied all or nothing (``apply_json_patch``) and bumps
the resourceVersion; a failed ``test`` op is a ``ConflictError`` (or, with
``bare_422``, the bare 422 ``InvalidError`` a malformed patch gets).
``conflicts=n`` makes the next n patches find that someone else wrote the
RayCluster first. Events are recorded as ``Event`` tuples.

Other objects (a reservation's state ConfigMap, gang objects) live in
``objects`` by (kind, namespace, name) with ``create``/``get``/``list``/``merge_patch``
(RFC 7386; a ``metadata.resourceVersion`` in the body must match, else ConflictError, as the API
server checks it)/``delete``. Namespaces are honoured as the API server does: a namespaced object is
found only in its own namespace (``list`` with namespace None lists every namespace); a cluster-scoped
kind (``CLUSTER_SCOPED``: Node, PriorityClass, ResourceSlice...) has namespace None in its key and ignores
the namespace asked for. ``put`` stores an object as a test's setup, keyed from its own metadata. The
RayCluster is found only under its own namespace and name (``get_raycluster``, ``get`` of kind
RayCluster...): anything else is not found; ``ray_pods`` lists only the pods of the namespace (and
cluster) asked for. ``fail(method, error, times, when)`` makes the next
calls of a method raise, to test what a 5xx or a timeout does. With
``kuberay=True`` the pods in ``extra_pods`` of a worker group that was
scaled to zero or removed go away after the patch, as KubeRay deletes them.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, Callable, Iterable, NamedTuple

from raygpu.errors import ConflictError, InvalidError, NotFoundError
from raygpu.model.raycluster import RayClusterView
from raygpu.model.views import K8sPodView
from raygpu.testing.builders.patch import PatchTestFailed, apply_json_patch


class Event(NamedTuple):
    """One Event the code under test recorded: the involved object's kind and name, then what it said."""

    kind: str
    name: str
    reason: str
    type: str
    message: str


# Kinds that live outside namespaces: their key's namespace is None, and the namespace of a call is ignored.
CLUSTER_SCOPED = frozenset({"Node", "Namespace", "PriorityClass", "ResourceSlice", "DeviceClass", "ClusterRole",
                            "ClusterRoleBinding", "CustomResourceDefinition", "StorageClass", "RuntimeClass",
                            "ClusterQueue", "ResourceFlavor", "SelfSubjectAccessReview"})


def _field(obj: dict, path: str) -> str:
    """The value at a dotted field path (``spec.nodeName``) as the API server compares it: a string, '' if unset."""
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


class FakeKube:
    def __init__(self, raw: dict[str, Any], *, pods: Iterable[K8sPodView] = (), conflicts: int = 0,
                 bare_422: bool = False, kuberay: bool = False) -> None:
        self.raw = copy.deepcopy(raw)
        self.pods = tuple(pods)  # what ray_pods lists (plus extra_pods)
        self.conflicts = conflicts
        self.bare_422 = bare_422  # answer a failed test with a bare 422 (a malformed patch, as the adapter sees it)
        self.patches: list[list[dict]] = []
        self.events: list[Event] = []
        self.deleted: list[tuple[str, str]] = []
        # ConfigMaps that exist in the RayCluster's namespace without a stored object (names): a delete there
        # removes the name; configmap_uids (name -> uid) is checked by a delete with a uid precondition
        self.configmaps: set[str] = set()
        self.configmap_uids: dict[str, str] = {}
        self.extra_pods: list[K8sPodView] = []
        self.kuberay = kuberay  # delete the extra_pods of groups scaled to zero or removed, as KubeRay does
        # (kind, namespace or None when cluster-scoped, name) -> object, besides the RayCluster
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.allowed: set[tuple[str, str]] = set()  # SelfSubjectAccessReview answers: (verb, resource) allowed
        self.calls: list[tuple[str, tuple]] = []  # (method, args) of every create/merge_patch/delete/get
        self._failures: list[list[Any]] = []  # [method, error, times left, when]
        # what API discovery of an API group finds: group -> version -> kinds (default: a 1.37 server with
        # the Workload API in v1beta1 and v1alpha3)
        self.served: dict[str, dict[str, frozenset[str]]] = {"scheduling.k8s.io": {
            "v1": frozenset({"PriorityClass"}), "v1beta1": frozenset({"Workload", "PodGroup"}),
            "v1alpha3": frozenset({"Workload", "PodGroup", "CompositePodGroup"})}}
        # API discovery (``dyn.resources.search``): (group, version, kind) served, e.g. ("resource.k8s.io", "v1",
        # "ResourceSlice"); fail("discover", ...) makes discovery itself fail
        self.served_kinds: set[tuple[str, str, str]] = set()

    @property
    def dyn(self) -> Any:
        """The slice of ``DynamicClient`` the adapters use: ``dyn.resources.search(group=, kind=)``."""
        fake = self

        class _Resources:
            @staticmethod
            def search(group: str = "", kind: str = "") -> list[Any]:
                fake._maybe_fail("discover", group, kind)
                return [SimpleNamespace(group=g, api_version=v, kind=k) for g, v, k in sorted(fake.served_kinds)
                        if g == group and k == kind]

        return SimpleNamespace(resources=_Resources())

    def fail(self, method: str, error: BaseException, times: int = 1,
             when: Callable[..., bool] = lambda *args: True, lost: bool = False) -> None:
        """The next ``times`` calls of ``method`` whose arguments satisfy ``when`` raise ``error``: nothing is
        written, or with ``lost`` (``create`` only) the write lands and only its answer is lost."""
        if lost and method != "create":
            raise ValueError("a lost answer is modelled for create only")
        self._failures.append([method, error, times, when, lost])

    def _maybe_fail(self, method: str, *args: Any) -> BaseException | None:
        """Raise a matching failure now, or return a matching lost-answer one for the caller to raise after writing."""
        self.calls.append((method, args))
        for rule in self._failures:
            if rule[0] == method and rule[2] > 0 and rule[3](*args):
                rule[2] -= 1
                if rule[4]:
                    return rule[1]
                raise rule[1]
        return None

    def with_reason(self, reason: str) -> list[Event]:
        """The recorded events with this reason, in order."""
        return [e for e in self.events if e.reason == reason]

    def bump(self, mutate: Callable[[dict], Any] = lambda raw: None) -> None:
        """Someone (or the API server itself) wrote the RayCluster: ``mutate`` it and bump the resourceVersion."""
        mutate(self.raw)
        self.raw["metadata"]["resourceVersion"] = str(int(self.raw["metadata"]["resourceVersion"]) + 1)

    @property
    def namespace(self) -> str:
        """The RayCluster's namespace."""
        return self.raw["metadata"]["namespace"]

    @staticmethod
    def key(kind: str, name: str, namespace: str | None) -> tuple[str, str | None, str]:
        """The ``objects`` key of an object: a cluster-scoped kind has none of a namespace (the call's is ignored,
        as the API server does); a namespaced kind asked for without one is a caller's bug (the real client
        raises ValueError too)."""
        if kind in CLUSTER_SCOPED:
            return kind, None, name
        if not namespace:
            raise ValueError(f"{kind} {name!r} is namespaced: a namespace is required")
        return kind, namespace, name

    def put(self, obj: dict[str, Any], kind: str | None = None) -> dict[str, Any]:
        """Store ``obj`` as it is (a test's setup, no resourceVersion bump), keyed by ``kind`` (default: its
        own ``kind``) and its ``metadata.namespace`` and ``metadata.name``. Returns it."""
        kind = kind or obj.get("kind")
        if not kind:
            raise ValueError(f"put: no kind for {obj.get('metadata', {}).get('name')!r}: pass kind=")
        md = obj["metadata"]
        self.objects[self.key(kind, md["name"], md.get("namespace"))] = obj
        return obj

    def obj(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object (not a copy: a test may change it), or None."""
        return self.objects.get(self.key(kind, name, namespace))

    def _is_cluster(self, namespace: str | None, name: str) -> bool:
        md = self.raw["metadata"]
        return namespace == md.get("namespace") and name == md.get("name")

    def _cluster_or_404(self, namespace: str, name: str) -> None:
        if not self._is_cluster(namespace, name):
            raise NotFoundError(f"unknown cluster: RayCluster {namespace}/{name} does not exist")

    # ------------------------------------------------------------ KubeAdapter
    def ray_pods(self, namespace, cluster=None):
        self._maybe_fail("ray_pods", namespace, cluster)
        return [p for p in list(self.pods) + list(self.extra_pods)
                if (not namespace or p.namespace == namespace) and (cluster is None or p.ray_cluster == cluster)]

    def api_group_kinds(self, group):
        self._maybe_fail("api_group_kinds", group)
        return dict(self.served.get(group, {}))

    def get_raycluster(self, namespace, name):
        self._cluster_or_404(namespace, name)
        return RayClusterView.from_k8s(self.raw)

    def raw_raycluster(self, namespace, name):
        self._cluster_or_404(namespace, name)
        return copy.deepcopy(self.raw)

    def patch_raycluster(self, namespace, name, patch):
        self._maybe_fail("patch_raycluster", namespace, name, patch)
        self._cluster_or_404(namespace, name)
        assert patch[0]["op"] == "test" and patch[0]["path"] == "/metadata/resourceVersion"
        if self.conflicts:  # someone else wrote the RayCluster first
            self.conflicts -= 1
            self.bump()
        try:
            out = apply_json_patch(self.raw, patch)
        except PatchTestFailed as e:
            if self.bare_422:
                raise InvalidError(f"patch RayCluster {namespace}/{name}: 422: the server rejected our request "
                                   "due to an error in our request") from e
            raise ConflictError(str(e)) from e
        self.patches.append(patch)
        self.raw = out
        self.bump()
        if self.kuberay:
            live = {g["groupName"] for g in self.raw["spec"].get("workerGroupSpecs", []) if g.get("replicas", 0) > 0}
            self.extra_pods = [p for p in self.extra_pods if p.ray_group in live]
        return RayClusterView.from_k8s(self.raw)

    def event(self, involved, reason, message, type_="Normal", component="raygpu"):
        assert involved["kind"] == "RayCluster" and involved["uid"]
        self.events.append(Event(involved["kind"], involved["name"], reason, type_, message))

    def create(self, obj):
        if obj["kind"] == "SelfSubjectAccessReview":  # a question, not a write: answered from ``allowed``
            attrs = obj["spec"]["resourceAttributes"]
            self._maybe_fail("access_review", attrs["verb"], attrs["resource"])
            return {**copy.deepcopy(obj), "status": {"allowed": (attrs["verb"], attrs["resource"]) in self.allowed}}
        lost = self._maybe_fail("create", obj)
        key = self.key(obj["kind"], obj["metadata"]["name"], obj["metadata"].get("namespace"))
        if key in self.objects:
            raise ConflictError(f"{key[0]} {key[1]}/{key[2]} already exists")
        out = copy.deepcopy(obj)
        out["metadata"].update(uid=self._new_uid(key[2]), resourceVersion="1")
        self.objects[key] = out
        if key[0] == "ConfigMap" and key[1] == self.namespace:
            self.configmaps.add(key[2])
        if lost is not None:
            raise lost
        return copy.deepcopy(out)

    def _new_uid(self, name: str) -> str:
        """``uid-<name>``, or, if a stored object already has it (a namespace of its own), ``uid-<name>-<n>``."""
        taken = {o["metadata"].get("uid") for o in self.objects.values()}
        uid, n = f"uid-{name}", 1
        while uid in taken:
            n += 1
            uid = f"uid-{name}-{n}"
        return uid

    def get(self, api_version, kind, name, namespace=None):
        self._maybe_fail("get", api_version, kind, name, namespace)
        if kind == "RayCluster" and self._is_cluster(namespace, name):
            return copy.deepcopy(self.raw)
        if kind not in CLUSTER_SCOPED and not namespace:  # the API server: no such object at the cluster path
            return None
        obj = self.objects.get(self.key(kind, name, namespace))
        return copy.deepcopy(obj) if obj is not None else None

    def list(self, api_version, kind, namespace=None, label_selector="", field_selector=""):
        self._maybe_fail("list", api_version, kind, namespace, label_selector, field_selector)
        terms = [t.split("=", 1) for t in label_selector.split(",") if t]
        fields = [(t.split("!=", 1), False) if "!=" in t else (t.split("=", 1), True)
                  for t in field_selector.split(",") if t]  # path=value and path!=value
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items() if k == kind
                and (kind in CLUSTER_SCOPED or not namespace or ns == namespace) and all(
            (o["metadata"].get("labels") or {}).get(t[0]) == t[1] if len(t) == 2
            else t[0] in (o["metadata"].get("labels") or {}) for t in terms)
            and all((_field(o, path) == value) == eq for (path, value), eq in fields)]

    def merge_patch(self, api_version, kind, name, namespace, body):
        self._maybe_fail("merge_patch", api_version, kind, name, namespace, body)
        obj = self.objects.get(self.key(kind, name, namespace))
        if obj is None:
            raise NotFoundError(f"patch {kind} {namespace}/{name}: 404")
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != obj["metadata"]["resourceVersion"]:  # the API server's precondition
            raise ConflictError(f"patch {kind} {namespace}/{name}: 409: resourceVersion {want} is not "
                                f"{obj['metadata']['resourceVersion']}")
        _merge(obj, copy.deepcopy(body))
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(obj)

    def delete(self, api_version, kind, name, namespace=None, *, uid=None):
        self._maybe_fail("delete", api_version, kind, name, namespace)
        key = self.key(kind, name, namespace)
        listed = kind == "ConfigMap" and namespace == self.namespace  # ``configmaps`` live in the cluster's namespace
        if uid is not None and listed and name in self.configmap_uids and self.configmap_uids[name] != uid:
            raise ConflictError(f"delete {kind} {namespace}/{name}: precondition failed: uid {uid}")
        stored_uid = (self.objects.get(key) or {}).get("metadata", {}).get("uid")
        if uid is not None and stored_uid is not None and stored_uid != uid:  # the API server's uid precondition
            raise ConflictError(f"delete {kind} {namespace}/{name}: precondition failed: uid {uid} is not {stored_uid}")
        self.deleted.append((kind, name))
        stored = self.objects.pop(key, None) is not None
        if listed and name in self.configmaps:
            self.configmaps.discard(name)
            return True
        return stored


def _merge(target: dict, patch: dict) -> None:
    """RFC 7386 merge patch, in place: None deletes a key, dicts merge, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = value
