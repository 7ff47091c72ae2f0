"""Fake GPU nodes for kwok: a small catalog of shapes GPU feature discovery would label.

A node annotated ``kwok.x-k8s.io/node: fake`` is managed by kwok, which keeps
the capacity set here and marks pods bound to it Running.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raygpu.model.labels import LABEL_TESTBED_SHAPE


@dataclass(frozen=True)
class NodeShape:
    cpu: str
    memory: str
    gpus: dict[str, int]  # Kubernetes resource name -> count
    labels: dict[str, str] = field(default_factory=dict)
    pods: int = 110


CATALOG: dict[str, NodeShape] = {
    # 8 whole H100s, as the device plugin advertises them with no MIG.
    "h100x8": NodeShape(cpu="96", memory="1Ti", gpus={"nvidia.com/gpu": 8}, labels={
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/mig.strategy": "none"}),
    # 8 A100-80GB under the device plugin's *mixed* MIG strategy: 4 GPUs as
    # 2 x 3g.40gb, 4 GPUs as 7 x 1g.10gb; nvidia.com/gpu is then 0.
    "a100x8-mig-mixed": NodeShape(cpu="96", memory="1Ti", gpus={
        "nvidia.com/mig-3g.40gb": 8, "nvidia.com/mig-1g.10gb": 28}, labels={
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81920", "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.capable": "true"}),
    # a small single-GPU node.
    "t4x1": NodeShape(cpu="8", memory="32Gi", gpus={"nvidia.com/gpu": 1}, labels={
        "nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.memory": "15360", "nvidia.com/mig.strategy": "none"}),
    # CPU only, for heads.
    "cpu16": NodeShape(cpu="16", memory="64Gi", gpus={}),
}


def node_manifest(name: str, shape: str | NodeShape, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The Node object for a kwok-managed fake node of ``shape``."""
    s = CATALOG[shape] if isinstance(shape, str) else shape
    resources = {"cpu": s.cpu, "memory": s.memory, "pods": str(s.pods), **{k: str(v) for k, v in s.gpus.items()}}
    labels = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
        "type": "kwok", LABEL_TESTBED_SHAPE: shape if isinstance(shape, str) else "custom",
        **s.labels, **(extra_labels or {}),
    }
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {
            "kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {},
        "status": {"capacity": resources, "allocatable": dict(resources),
                   "nodeInfo": {
                       "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "kwok", "kernelVersion": "",
                       "kubeProxyVersion": "", "kubeletVersion": "kwok", "machineID": "", "operatingSystem": "linux",
                       "osImage": "kwok", "systemUUID": ""}},
    }
