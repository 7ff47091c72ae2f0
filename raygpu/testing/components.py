"""Pinned versions of the testbed's components and where their binaries live.

Binaries are built from the Go module proxy by ``scripts/build-components.sh``
into ``$RAYGPU_CACHE/bin/<set>-<version>/`` (default ``~/.cache/raygpu``),
keyed by versions, and reused when present.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

VERSIONS = {
    "kubernetes": "v1.34.4",  # kube-apiserver, kube-scheduler, kube-controller-manager, kubectl
    "scheduler-plugins": "v0.34.7",  # coscheduling; released for 1.34.7, built against 1.34.4
    "kuberay": "v1.6.2",  # ray-operator, its own build (k8s 0.35 libs); v1.7.0 is refused by the proxy
    "kueue": "v0.17.0",
    "kwok": "v0.8.0",
    "etcd": "v3.6.16",
    "helm": "v4.3.2",  # not part of the testbed: the unit tests render and lint deploy/helm/raygpu with it
}

BUILD_SCRIPT = Path(__file__).parent / "scripts" / "build-components.sh"
# the build script's environment variable for each pinned version (so the script builds what _dirs() names)
VERSION_ENV = {"kubernetes": "K8S_VERSION", "scheduler-plugins": "SCHED_PLUGINS_VERSION",
               "kuberay": "KUBERAY_VERSION", "kueue": "KUEUE_VERSION", "kwok": "KWOK_VERSION",
               "etcd": "ETCD_VERSION", "helm": "HELM_VERSION"}


def cache_dir() -> Path:
    return Path(os.environ.get("RAYGPU_CACHE", Path.home() / ".cache" / "raygpu"))


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    sp_scheduler: Path
    sp_controller: Path
    ray_operator: Path
    kueue: Path
    kwok: Path
    kuberay_crds: Path
    scheduler_plugins_crds: Path
    kueue_config: Path  # kueue's config/components
    kwok_stages: Path


def _dirs() -> dict[str, Path]:
    b = cache_dir() / "bin"
    v = VERSIONS
    return {
        "k8s": b / f"k8s-{v['kubernetes']}-sp-{v['scheduler-plugins']}",
        "kuberay": b / f"kuberay-{v['kuberay']}",
        "kueue": b / f"kueue-{v['kueue']}",
        "kwok": b / f"kwok-{v['kwok']}",
        "etcd": b / f"etcd-{v['etcd']}",
    }


def tool(name: str) -> Path:
    """Where the built ``helm`` or ``kubectl`` (whose ``kubectl kustomize`` is kustomize) is; it may not exist yet:
    ``.ci/setup`` builds both, ``bash raygpu/testing/scripts/build-components.sh helm`` (or ``k8s``) one set."""
    if name == "helm":
        return cache_dir() / "bin" / f"helm-{VERSIONS['helm']}" / "helm"
    if name == "kubectl":
        return _dirs()["k8s"] / "kubectl"
    raise ValueError(f"no tool {name!r}: helm or kubectl")


def missing() -> list[str]:
    """Component sets not built yet."""
    return [name for name, d in _dirs().items() if not (d / ".done").exists()]


def build_seconds() -> dict[str, int]:
    """Seconds each cached set took to build (as recorded when it was built)."""
    out = {}
    for name, d in _dirs().items():
        f = d / ".build_seconds"
        if f.exists():
            out[name] = int(f.read_text().strip() or 0)
    return out


def ensure_built(progress=print) -> Binaries:
    """Build what is missing (minutes on a cold cache), then return the binaries.

    Raises RuntimeError naming the component whose build failed.
    """
    todo = missing()
    if todo:
        progress(f"building testbed components from the Go module proxy: {', '.join(todo)} "
                 f"(cold cache: about 30-45 min on 2 cores; cached in {cache_dir()}/bin)")
        t0 = time.monotonic()
        env = dict(os.environ, RAYGPU_CACHE=str(cache_dir()), **{VERSION_ENV[k]: v for k, v in VERSIONS.items()})
        for name in todo:
            proc = subprocess.run(["bash", str(BUILD_SCRIPT), name], env=env, stdout=sys.stderr, stderr=sys.stderr)
            if proc.returncode != 0:
                raise RuntimeError(f"building testbed component set {name!r} failed (exit {proc.returncode}); "
                                   f"see the [build] lines above")
        progress(f"components built in {time.monotonic() - t0:.0f} s")
    d = _dirs()
    k = d["k8s"]
    return Binaries(
        etcd=d["etcd"] / "etcd",
        kube_apiserver=k / "kube-apiserver",
        kube_controller_manager=k / "kube-controller-manager",
        kube_scheduler=k / "kube-scheduler",
        kubectl=k / "kubectl",
        sp_scheduler=k / "sp-scheduler",
        sp_controller=k / "sp-controller",
        ray_operator=d["kuberay"] / "ray-operator",
        kueue=d["kueue"] / "kueue",
        kwok=d["kwok"] / "kwok",
        kuberay_crds=d["kuberay"] / "crds",
        scheduler_plugins_crds=k / "crds" / "scheduler-plugins",
        kueue_config=d["kueue"] / "crds",
        kwok_stages=d["kwok"] / "crds",
    )
