"""Small Kubernetes helpers for the testbed and tests: clients and apply.

Everything goes through the official ``kubernetes`` client's dynamic client
against the real API server; there is no fake anywhere here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

FIELD_MANAGER = "raygpu-testbed"


def api_client(kubeconfig: str | Path) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


def dynamic(kubeconfig_or_client: str | Path | client.ApiClient) -> DynamicClient:
    c = kubeconfig_or_client if isinstance(kubeconfig_or_client, client.ApiClient) else api_client(kubeconfig_or_client)
    return DynamicClient(c)


def load_yaml_docs(path_or_text: str | Path) -> list[dict[str, Any]]:
    text = Path(path_or_text).read_text() if isinstance(path_or_text, Path) else path_or_text
    return [d for d in yaml.safe_load_all(text) if d]


def apply(dyn: DynamicClient, obj: dict[str, Any], namespace: str | None = None) -> Any:
    """Server-side apply ``obj`` (create or update), returning the live object."""
    res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    ns = obj.get("metadata", {}).get("namespace") or (namespace if res.namespaced else None)
    if ns and res.namespaced:
        obj.setdefault("metadata", {})["namespace"] = ns
    return res.server_side_apply(body=obj, name=obj["metadata"]["name"], namespace=ns,
                                 field_manager=FIELD_MANAGER, force_conflicts=True)


def delete(dyn: DynamicClient, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
    """Delete an object; False if it was not there."""
    res = dyn.resources.get(api_version=api_version, kind=kind)
    try:
        res.delete(name=name, namespace=namespace)
        return True
    except NotFoundError:
        return False
