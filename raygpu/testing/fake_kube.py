"""The one fake Kubernetes of the unit tests: the KubeAdapter calls the sidecar and the doctor make, over one
RayCluster dict, with the API server's semantics.

Every accepted patch is applied all or nothing (``apply_json_patch``) and bumps
the resourceVersion; a failed ``test`` op is a ``ConflictError`` (or, with
``bare_422``, the bare 422 ``InvalidError`` a malformed patch gets).
``conflicts=n`` makes the next n patches find that someone else wrote the
RayCluster first. Events are recorded as ``Event`` tuples.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable, NamedTuple

from raygpu.errors import ConflictError, InvalidError
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


class FakeKube:
    def __init__(self, raw: dict[str, Any], *, pods: Iterable[K8sPodView] = (), conflicts: int = 0,
                 bare_422: bool = False) -> None:
        self.raw = copy.deepcopy(raw)
        self.pods = tuple(pods)  # what ray_pods lists (plus extra_pods)
        self.conflicts = conflicts
        self.bare_422 = bare_422  # answer a failed test with a bare 422 (a malformed patch, as the adapter sees it)
        self.patches: list[list[dict]] = []
        self.events: list[Event] = []
        self.deleted: list[tuple[str, str]] = []
        self.configmaps: set[str] = set()
        self.configmap_uids: dict[str, str] = {}  # name -> uid, checked by a delete with a uid precondition
        self.extra_pods: list[K8sPodView] = []

    def with_reason(self, reason: str) -> list[Event]:
        """The recorded events with this reason, in order."""
        return [e for e in self.events if e.reason == reason]

    def bump(self, mutate: Callable[[dict], Any] = lambda raw: None) -> None:
        """Someone (or the API server itself) wrote the RayCluster: ``mutate`` it and bump the resourceVersion."""
        mutate(self.raw)
        self.raw["metadata"]["resourceVersion"] = str(int(self.raw["metadata"]["resourceVersion"]) + 1)

    # ------------------------------------------------------------ KubeAdapter
    def ray_pods(self, namespace, cluster=None):
        return list(self.pods) + list(self.extra_pods)

    def get_raycluster(self, namespace, name):
        return RayClusterView.from_k8s(self.raw)

    def patch_raycluster(self, namespace, name, patch):
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
        return RayClusterView.from_k8s(self.raw)

    def event(self, involved, reason, message, type_="Normal", component="raygpu"):
        assert involved["kind"] == "RayCluster" and involved["uid"]
        self.events.append(Event(involved["kind"], involved["name"], reason, type_, message))

    def delete(self, api_version, kind, name, namespace=None, *, uid=None):
        if uid is not None and name in self.configmap_uids and self.configmap_uids[name] != uid:
            raise ConflictError(f"delete {kind} {name}: precondition failed: uid {uid}")
        self.deleted.append((kind, name))
        if name in self.configmaps:
            self.configmaps.discard(name)
            return True
        return False
