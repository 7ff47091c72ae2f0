"""Processes next to a testbed RayCluster (the testbed benchmarks, ``raygpu demo --unmodified``): Ray's KubeRay
autoscaler and raygpu's sidecar.

``ray_autoscaler_role`` is KubeRay's autoscaler Role bound to a client-certificate
user; ``start_ray_autoscaler`` runs exactly what KubeRay's ``autoscaler`` container
runs (``run_kuberay_autoscaler``) under that user; ``start_sidecar`` runs
``raygpu sidecar``. Each is a :class:`Proc` (own session, log file, stopped by
process group).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RAY_USER = "ray-autoscaler"


def ray_autoscaler_role(ns: str, user: str = RAY_USER) -> list[dict]:
    """KubeRay's autoscaler Role (ray-operator's BuildRole), bound to the certificate's user."""
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "ray-autoscaler", "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
                      {"apiGroups": [""], "resources": ["pods/resize"], "verbs": ["get", "patch"]},
                      {"apiGroups": ["ray.io"], "resources": ["rayclusters"], "verbs": ["get", "patch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "ray-autoscaler", "namespace": ns},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ray-autoscaler"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
    return [role, binding]


class Proc:
    """A subprocess in its own session, output to ``log``; ``stop()`` ends its process group."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self._f = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(argv, env=env, stdout=self._f, stderr=subprocess.STDOUT, cwd=ROOT,
                                  start_new_session=True)

    def alive(self) -> bool:
        return self.p.poll() is None

    def stop(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, 15)
            try:
                self.p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, 9)
                self.p.wait(5)
        self._f.close()


def proc_env() -> dict[str, str]:
    """This environment, unbuffered, with the venv's bin first (Ray's autoscaler runs ``ray health-check``)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1",
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def start_sidecar(cluster: str, ns: str, gcs: str, kubeconfig: Path, log: Path, *extra: str) -> Proc:
    """``raygpu sidecar`` for ``ns/cluster`` (metrics off, JSON logs) with ``extra`` arguments."""
    return Proc("sidecar", [sys.executable, "-m", "raygpu.cli", "sidecar", "--cluster", cluster, "--namespace", ns,
                            "--ray-address", gcs, "--kubeconfig", str(kubeconfig), "--metrics-port", "0",
                            "--json-logs", *extra], proc_env(), log)


def start_ray_autoscaler(tb, cluster: str, ns: str, gcs: str, crt: Path, key: Path, log: Path,
                         env: dict[str, str] | None = None) -> Proc:
    """Ray's KubeRay autoscaler for ``ns/cluster`` (the version in the RayCluster's ``autoscalerOptions``),
    talking to the testbed's API server with the client certificate ``crt``/``key``; ``env``: more environment
    (what ``autoscalerOptions.env`` gives KubeRay's autoscaler container)."""
    env = {**proc_env(), **(env or {}), "KUBERNETES_SERVICE_HOST": "127.0.0.1",
           "KUBERNETES_SERVICE_PORT_HTTPS": str(tb.state["ports"]["apiserver"]),
           "RAY_KUBERAY_CLIENT_CERT_PATH": str(crt), "RAY_KUBERAY_CLIENT_KEY_PATH": str(key),
           "RAY_KUBERAY_CA_CERT_PATH": str(tb.root / "pki" / "ca.crt")}
    return Proc("ray-autoscaler", [sys.executable, "-c",
                                   "import sys; from ray.autoscaler._private.kuberay.run_autoscaler "
                                   "import run_kuberay_autoscaler; "
                                   "run_kuberay_autoscaler(sys.argv[1], sys.argv[2], sys.argv[3])",
                                   cluster, ns, gcs], env, log)
