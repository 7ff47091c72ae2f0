"""What a run can leave behind on the testbed.

``python -m raygpu.testing.leftovers``: exit 1 (listing them) if any testbed process is still running: a
component binary from the build cache, or a Ray process the bridge started. ``reservation_leftovers``: the
Kubernetes objects a reservation could leave in a namespace."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from raygpu.testing.bridge import MARKER_ENV
from raygpu.testing.components import cache_dir

if TYPE_CHECKING:
    from raygpu.adapters.kube import KubeAdapter


def reservation_leftovers(kube: KubeAdapter, ns: str, cluster: str, keep: Iterable[str] = ()) -> dict:
    """Everything a reservation of RayCluster ``ns/cluster`` could leave behind (reservation worker groups,
    state ConfigMaps, PodGroups, reserved pods); ``keep``: names of a user's objects that look like ours."""
    from raygpu.model.labels import LABEL_RESERVATION
    keep = set(keep)
    view = kube.get_raycluster(ns, cluster)
    left = {
        "worker_groups": [g.group_name for g in view.worker_groups if g.group_name.startswith("rg-")],
        "state_configmaps": [c["metadata"]["name"] for c in kube.list("v1", "ConfigMap", ns, LABEL_RESERVATION)],
        "podgroups": [p["metadata"]["name"] for p in kube.list("scheduling.x-k8s.io/v1alpha1", "PodGroup", ns)],
        "reserved_pods": [p.name for p in kube.ray_pods(ns, cluster) if LABEL_RESERVATION in p.labels],
    }
    return {k: [n for n in v if n not in keep and not any(n.startswith(f"{cluster}-{g}-") for g in keep)]
            for k, v in left.items()}


def leftovers() -> list[str]:
    bin_dir = str(cache_dir() / "bin")
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            exe = os.readlink(p / "exe")
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if exe.startswith(bin_dir) or any(e.startswith(MARKER_ENV.encode() + b"=") for e in env):
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            found.append(f"pid {p.name}: {cmd}")
    return found


if __name__ == "__main__":
    left = leftovers()
    for line in left:
        print(f"left running: {line}", file=sys.stderr)
    print(f"testbed leftovers: {len(left)} processes")
    sys.exit(1 if left else 0)
