"""Pinned versions of the testbed's components and where their binaries live.

Binaries are built from the Go module proxy by ``scripts/build-components.sh``
into ``$RAYGPU_CACHE/bin/<set>-<version>/`` (default ``~/.cache/raygpu``),
keyed by versions, and reused when present.

The control plane's Kubernetes version is selectable (``raygpu testbed up --kubernetes 1.37``, or
``RAYGPU_TESTBED_KUBERNETES=1.37`` for every ``Testbed()``, the pytest fixture included). Everything
else is shared: a non-default control plane runs the default set's scheduler-plugins (built with
the default Kubernetes) against it, docs/testbed.md "Kubernetes versions".
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
    # not part of the testbed either: promtool (Prometheus 3.16.0's module version) checks and unit-tests
    # deploy/monitoring's rules; the prometheus-operator's CRDs let the chart's dry run apply its monitors
    "promtool": "v0.316.0",
    "prometheus-operator": "v0.85.0",
}

# `--kubernetes <minor>` -> the kube-apiserver/scheduler/controller-manager/kubectl version it runs
KUBERNETES = {"1.34": "v1.34.4", "1.37": "v1.37.2"}
DEFAULT_KUBERNETES = "1.34"
KUBERNETES_ENV = "RAYGPU_TESTBED_KUBERNETES"
# What a control plane turns on beyond its defaults (read from the v1.37.2 source, docs/testbed.md): the
# Workload API (scheduling.k8s.io/v1beta1 Workload + PodGroup) is beta, gate GenericWorkload off by default
# and its group version off by default; DRA (resource.k8s.io/v1) and its extended-resource mapping
# (DRAExtendedResource, KEP-5004) are GA and locked on in 1.37, so nothing to set for them.
# apiserver, scheduler, controller-manager. 1.34: DRA device taints and pods' allocatedResourcesStatus are
# alpha there and dropped from writes without their gates (the doctor's DRA test writes both); on by default in 1.37.
# NOT on the scheduler/controller-manager: with DRADeviceTaints they watch resource.k8s.io/v1alpha3
# DeviceTaintRules, which this apiserver does not serve, so their caches never sync and nothing is scheduled.
# 1.37 also: TopologyAwareWorkloadScheduling (alpha, off by default; needs GenericWorkload), on the apiserver
# (else it drops a PodGroup's schedulingConstraints on create) and the scheduler (else it ignores them: its
# TopologyPlacementGenerator plugin places the whole PodGroup in one domain). It watches nothing new
# (CompositePodGroup, which would, stays off). Backend workload's required topology needs both.
FEATURE_GATES = {"1.34": "", "1.37": "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"}
APISERVER_FEATURE_GATES = {"1.34": "DRADeviceTaints=true,ResourceHealthStatus=true",
                           "1.37": "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"}
RUNTIME_CONFIG = {"1.34": "", "1.37": "scheduling.k8s.io/v1beta1=true"}  # apiserver only

BUILD_SCRIPT = Path(__file__).parent / "scripts" / "build-components.sh"
# the build script's environment variable for each pinned version (so the script builds what _dirs() names)
VERSION_ENV = {"kubernetes": "K8S_VERSION", "scheduler-plugins": "SCHED_PLUGINS_VERSION",
               "kuberay": "KUBERAY_VERSION", "kueue": "KUEUE_VERSION", "kwok": "KWOK_VERSION",
               "etcd": "ETCD_VERSION", "helm": "HELM_VERSION", "promtool": "PROMTOOL_VERSION",
               "prometheus-operator": "PROMETHEUS_OPERATOR_VERSION"}


def selected_kubernetes(flag: str | None = None) -> str:
    """The control plane to run: ``flag`` (``--kubernetes``), else ``$RAYGPU_TESTBED_KUBERNETES``, else the
    default. Raises ValueError naming the bad value and the choices."""
    value = flag or os.environ.get(KUBERNETES_ENV) or DEFAULT_KUBERNETES
    if value not in KUBERNETES:
        where = "--kubernetes" if flag else KUBERNETES_ENV
        raise ValueError(f"{where}={value!r}: the testbed runs Kubernetes {' or '.join(KUBERNETES)}")
    return value


def versions(kubernetes: str = DEFAULT_KUBERNETES) -> dict[str, str]:
    """Every pinned version of a testbed whose control plane is ``kubernetes`` (a key of KUBERNETES).
    A non-default one also names the Kubernetes scheduler-plugins was built with (the version skew)."""
    out = dict(VERSIONS)
    if KUBERNETES[kubernetes] != VERSIONS["kubernetes"]:
        out["kubernetes"] = KUBERNETES[kubernetes]
        out["scheduler-plugins-kubernetes"] = VERSIONS["kubernetes"]
    return out


def other_control_planes() -> list[str]:
    """The Kubernetes versions built as control-plane-only sets (the build script's K8S_OTHER_VERSIONS)."""
    return [v for v in KUBERNETES.values() if v != VERSIONS["kubernetes"]]


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


def _dirs(kubernetes: str = DEFAULT_KUBERNETES) -> dict[str, Path]:
    """The folder of each component set a testbed with this control plane needs, keyed by the build
    script's target for it. ``k8s`` (the default Kubernetes + scheduler-plugins) is always needed; another
    control plane is its own set ``k8s-vX.Y.Z`` (control plane and kubectl only)."""
    b = cache_dir() / "bin"
    v = VERSIONS
    out = {
        "k8s": b / f"k8s-{v['kubernetes']}-sp-{v['scheduler-plugins']}",
        "kuberay": b / f"kuberay-{v['kuberay']}",
        "kueue": b / f"kueue-{v['kueue']}",
        "kwok": b / f"kwok-{v['kwok']}",
        "etcd": b / f"etcd-{v['etcd']}",
    }
    control_plane = KUBERNETES[kubernetes]
    if control_plane != v["kubernetes"]:
        out[f"k8s-{control_plane}"] = b / f"k8s-{control_plane}"
    return out


def _control_plane_dir(d: dict[str, Path], kubernetes: str) -> Path:
    return d.get(f"k8s-{KUBERNETES[kubernetes]}", d["k8s"])


def tool(name: str) -> Path:
    """Where the built ``helm``, ``promtool`` or ``kubectl`` (whose ``kubectl kustomize`` is kustomize) is; it may
    not exist yet: ``.ci/setup`` builds them, ``bash raygpu/testing/scripts/build-components.sh helm`` (or
    ``promtool``, ``k8s``) one set."""
    if name in ("helm", "promtool"):
        return cache_dir() / "bin" / f"{name}-{VERSIONS[name]}" / name
    if name == "kubectl":
        return _dirs()["k8s"] / "kubectl"
    raise ValueError(f"no tool {name!r}: helm, promtool or kubectl")


def prometheus_operator_crds() -> Path:
    """The folder of the prometheus-operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs (one YAML file
    each); it may not exist yet: ``.ci/setup``, or ``build-components.sh prometheus-operator-crds``."""
    return cache_dir() / "bin" / f"prometheus-operator-crds-{VERSIONS['prometheus-operator']}" / "crds"


def missing(kubernetes: str = DEFAULT_KUBERNETES) -> list[str]:
    """Component sets not built yet (build script targets)."""
    return [name for name, d in _dirs(kubernetes).items() if not (d / ".done").exists()]


def build_seconds(kubernetes: str = DEFAULT_KUBERNETES) -> dict[str, int]:
    """Seconds each cached set took to build (as recorded when it was built)."""
    out = {}
    for name, d in _dirs(kubernetes).items():
        f = d / ".build_seconds"
        if f.exists():
            out[name] = int(f.read_text().strip() or 0)
    return out


def ensure_built(progress=print, kubernetes: str = DEFAULT_KUBERNETES) -> Binaries:
    """Build what a testbed with this control plane needs and is missing (minutes on a cold cache), then
    return the binaries.

    Raises RuntimeError naming the component whose build failed.
    """
    todo = missing(kubernetes)
    if todo:
        progress(f"building testbed components from the Go module proxy: {', '.join(todo)} "
                 f"(cold cache: about 30-45 min on 2 cores; cached in {cache_dir()}/bin)")
        t0 = time.monotonic()
        env = dict(os.environ, RAYGPU_CACHE=str(cache_dir()), K8S_OTHER_VERSIONS=" ".join(other_control_planes()),
                   **{VERSION_ENV[k]: v for k, v in VERSIONS.items()})
        for name in todo:
            proc = subprocess.run(["bash", str(BUILD_SCRIPT), name], env=env, stdout=sys.stderr, stderr=sys.stderr)
            if proc.returncode != 0:
                raise RuntimeError(f"building testbed component set {name!r} failed (exit {proc.returncode}); "
                                   f"see the [build] lines above")
        progress(f"components built in {time.monotonic() - t0:.0f} s")
    d = _dirs(kubernetes)
    k, cp = d["k8s"], _control_plane_dir(d, kubernetes)
    return Binaries(
        etcd=d["etcd"] / "etcd",
        kube_apiserver=cp / "kube-apiserver",
        kube_controller_manager=cp / "kube-controller-manager",
        kube_scheduler=cp / "kube-scheduler",
        kubectl=cp / "kubectl",
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
