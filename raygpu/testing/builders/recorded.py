"""A RayCluster recorded from the testbed's API server, and the pods and Ray views around it.

Recorded with KubeRay v1.5.0 after the operator reconciled it (managedFields
dropped): groups ``gpu`` (3 x 8 GPUs) and ``small`` (1 x 1 GPU, with a stale
``workersToDelete`` entry). The reclaimer's patch and cycle tests plan on it.
"""

from __future__ import annotations

import json

from raygpu.model.raycluster import RayClusterView
from raygpu.model.reclaim import ReclaimPolicy, ReclaimReason
from raygpu.model.views import K8sPodView, K8sView, RayNodeView, RayView, Snapshot
from raygpu.plan.reclaim.scale_down import plan_reclaim

NOW_S = 2_000_000.0
R = ReclaimReason

RECORDED = json.loads(r"""
{
 "apiVersion": "ray.io/v1",
 "kind": "RayCluster",
 "metadata": {
  "annotations": {
   "raygpu.io/idle-timeout": "5s",
   "raygpu.io/reclaim": "on"
  },
  "creationTimestamp": "2026-12-02T13:26:18Z",
  "generation": 1,
  "name": "rc",
  "namespace": "record-rc",
  "resourceVersion": "2533",
  "uid": "ce5a4c98-9e68-4274-a4a8-e8438696f3c3"
 },
 "spec": {
  "headGroupSpec": {
   "rayStartParams": {},
   "template": {
    "spec": {
     "containers": [
      {
       "image": "rayproject/ray:2.60.0",
       "name": "ray-head",
       "resources": {
        "limits": {
         "cpu": "2",
         "memory": "8Gi"
        },
        "requests": {
         "cpu": "2",
         "memory": "8Gi"
        }
       }
      }
     ],
     "nodeSelector": {
      "raygpu.io/pool": "record-none",
      "raygpu.io/testbed-shape": "cpu16"
     }
    }
   }
  },
  "rayVersion": "2.60.0",
  "workerGroupSpecs": [
   {
    "groupName": "gpu",
    "maxReplicas": 16,
    "minReplicas": 0,
    "numOfHosts": 1,
    "rayStartParams": {},
    "replicas": 3,
    "template": {
     "spec": {
      "containers": [
       {
        "image": "rayproject/ray:2.60.0",
        "name": "ray-worker",
        "resources": {
         "limits": {
          "cpu": "8",
          "memory": "64Gi",
          "nvidia.com/gpu": "8"
         },
         "requests": {
          "cpu": "8",
          "memory": "64Gi",
          "nvidia.com/gpu": "8"
         }
        }
       }
      ],
      "nodeSelector": {
       "raygpu.io/pool": "record-none"
      }
     }
    }
   },
   {
    "groupName": "small",
    "maxReplicas": 4,
    "minReplicas": 0,
    "numOfHosts": 1,
    "rayStartParams": {},
    "replicas": 1,
    "scaleStrategy": {
     "workersToDelete": [
      "rc-small-worker-gone1"
     ]
    },
    "template": {
     "spec": {
      "containers": [
       {
        "image": "rayproject/ray:2.60.0",
        "name": "ray-worker",
        "resources": {
         "limits": {
          "cpu": "4",
          "memory": "16Gi",
          "nvidia.com/gpu": "1"
         },
         "requests": {
          "cpu": "4",
          "memory": "16Gi",
          "nvidia.com/gpu": "1"
         }
        }
       }
      ],
      "nodeSelector": {
       "raygpu.io/pool": "record-none"
      }
     }
    }
   }
  ]
 },
 "status": {
  "conditions": [
   {
    "lastTransitionTime": "2026-12-02T13:26:18Z",
    "message": "",
    "reason": "Unknown",
    "status": "False",
    "type": "HeadPodReady"
   },
   {
    "lastTransitionTime": "2026-12-02T13:26:18Z",
    "message": "RayCluster Pods are being provisioned for first time",
    "reason": "RayClusterPodsProvisioning",
    "status": "False",
    "type": "RayClusterProvisioned"
   },
   {
    "lastTransitionTime": "2026-12-02T13:26:18Z",
    "message": "",
    "reason": "RayClusterSuspended",
    "status": "False",
    "type": "RayClusterSuspended"
   },
   {
    "lastTransitionTime": "2026-12-02T13:26:18Z",
    "message": "",
    "reason": "RayClusterSuspending",
    "status": "False",
    "type": "RayClusterSuspending"
   }
  ],
  "desiredCPU": "30",
  "desiredGPU": "25",
  "desiredMemory": "216Gi",
  "desiredTPU": "0",
  "desiredWorkerReplicas": 4,
  "endpoints": {
   "client": "10001",
   "dashboard": "8265",
   "gcs-server": "6379",
   "metrics": "8080",
   "serve": "8000"
  },
  "head": {
   "podName": "rc-head-7dn79",
   "serviceName": "rc-head-svc"
  },
  "lastUpdateTime": "2026-12-02T13:26:18Z",
  "maxWorkerReplicas": 20,
  "observedGeneration": 1
 }
}
""")
NS = RECORDED["metadata"]["namespace"]
RV0 = int(RECORDED["metadata"]["resourceVersion"])


def pod(name: str, group: str, node: str, age_s: float = 3600, head: bool = False) -> K8sPodView:
    return K8sPodView(name=name, namespace=NS, node_name=node, phase="Running", created_at_s=NOW_S - age_s,
                      ray_cluster="rc", ray_group=group, ray_node_type="head" if head else "worker")


def ray_node(pod_name: str, gpus: float, idle_for_s: float | None, head: bool = False) -> RayNodeView:
    return RayNodeView(node_id=f"n-{pod_name}", alive=True, is_head=head, instance_id=pod_name,
                       total={"GPU": gpus, "CPU": 8}, available={"GPU": gpus if idle_for_s is not None else 0, "CPU": 8},
                       idle_since_s=None if idle_for_s is None else NOW_S - idle_for_s)


PODS = (pod("rc-head-x", "headgroup", "k0", head=True), pod("rc-gpu-worker-a", "gpu", "k1"),
        pod("rc-gpu-worker-b", "gpu", "k2"), pod("rc-gpu-worker-c", "gpu", "k3"),
        pod("rc-small-worker-d", "small", "k4"))


def ray_view(idle: dict[str, float | None], pgs=()) -> RayView:
    gpus = {"rc-gpu-worker-a": 8, "rc-gpu-worker-b": 8, "rc-gpu-worker-c": 8, "rc-small-worker-d": 1}
    return RayView(nodes=(ray_node("rc-head-x", 0, 100, head=True),
                          *(ray_node(p, gpus[p], idle.get(p)) for p in gpus)), placement_groups=tuple(pgs))


ALL_IDLE = {"rc-gpu-worker-a": 60, "rc-gpu-worker-b": 60, "rc-gpu-worker-c": None, "rc-small-worker-d": 60}


def plan_on(raw: dict, ray: RayView, **policy):
    snap = Snapshot(taken_at_s=NOW_S, cluster="rc", namespace=NS, ray=ray, k8s=K8sView(pods=PODS))
    return plan_reclaim(snap, RayClusterView.from_k8s(raw), ReclaimPolicy(idle_timeout_s=5, **policy), NOW_S)
