"""A keep-warm state ConfigMap as the sidecar writes it (``raygpu.reclaim.warm``), to seed a history.

Tests and the testbed benchmark use it to start a cluster in ``idle-timeout: auto``
from a history, as after a sidecar restart: the object carries the labels and
the ownerReference that prove raygpu wrote it, so the sidecar loads (and then
updates) it.
"""

from __future__ import annotations

from typing import Any

from raygpu.model.labels import LABEL_CLUSTER, LABEL_WARM_STATE, WARM_STATE_KEY, dns_label, warm_state_name
from raygpu.model.warm import GroupHistory, WarmHistory, encode_history


def warm_state_configmap(namespace: str, cluster: str, cluster_uid: str,
                         groups: dict[str, GroupHistory]) -> dict[str, Any]:
    """The ConfigMap ``<cluster>-raygpu-warm`` holding ``groups``, owned by the RayCluster ``cluster_uid``."""
    label = dns_label(cluster)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": warm_state_name(cluster), "namespace": namespace,
                         "labels": {LABEL_CLUSTER: label, LABEL_WARM_STATE: label},
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster,
                                              "uid": cluster_uid}]},
            "data": {WARM_STATE_KEY: encode_history(WarmHistory(groups=groups))}}
