"""The local testbed: a real Kubernetes control plane, KubeRay, gang schedulers and Ray.

``Testbed.up()`` starts, on 127.0.0.1 and without containers, in this order:

1. etcd, 2. kube-apiserver (RBAC, token auth, ServiceAccount token signing; with
   ``kubernetes="1.37"`` v1.37.2 serving the Workload API too, components.FEATURE_GATES),
3. kube-controller-manager (garbage collection) and kube-scheduler,
4. CRDs from the modules the binaries were built from (KubeRay, scheduler-plugins,
   Kueue) and Volcano's PodGroup CRD, 5. scheduler-plugins' coscheduling
   scheduler and PodGroup controller, 6. kwok with its fast stages,
7. the KubeRay operator, 8. Kueue with its webhooks served on loopback,
9. the Ray bridge (a real Ray node for every Running Ray pod), 10. default nodes.

State (ports, pids, kubeconfig, the Kubernetes version and every pinned version) lives in ``run_dir/state.json`` so that
``raygpu testbed status`` and ``down`` work from another process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from raygpu.testing import addons, components, pki
from raygpu.testing.catalog import node_manifest
from raygpu.testing.procs import TestbedError, alive, free_port, spawn, stop, wait_for

ADMIN_TOKEN = "raygpu-testbed-admin-token"
CODE_ROOT = str(Path(__file__).resolve().parents[1])  # the raygpu package this testbed code runs from

# Audit every request but the testbed's own (every component and the tests' admin client use the admin
# token): what a ServiceAccount or a client certificate under test does is then counted exactly, e.g. the
# API load benchmark's sidecar and Ray autoscaler. Metadata level: who, verb, resource, status; no bodies.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: None
  users: ["admin", "system:apiserver", "system:kube-controller-manager", "system:kube-scheduler"]
- level: None
  userGroups: ["system:nodes"]
- level: Metadata
"""
DEFAULT_NODES = {"gpu-a": "h100x8", "gpu-b": "h100x8", "mig-a": "a100x8-mig-mixed", "t4-a": "t4x1",
                 "cpu-a": "cpu16"}
STOP_ORDER = ["bridge", "kueue", "ray-operator", "kwok", "sp-controller", "sp-scheduler", "kube-scheduler",
              "kube-controller-manager", "kube-apiserver", "etcd"]


def run_dir() -> Path:
    return Path(os.environ.get("RAYGPU_TESTBED_DIR", components.cache_dir() / "testbed"))


class Testbed:
    """Handle on a testbed described by ``run_dir/state.json``, wanted with the control plane ``kubernetes``
    (``components.KUBERNETES``; default ``$RAYGPU_TESTBED_KUBERNETES``, else ``components.DEFAULT_KUBERNETES``).
    Raises ValueError for a version the testbed does not run."""

    def __init__(self, root: Path | None = None, kubernetes: str | None = None) -> None:
        self.kubernetes = components.selected_kubernetes(kubernetes)
        self.versions = components.versions(self.kubernetes)
        self.root = root or run_dir()
        self.state_file = self.root / "state.json"
        self.state: dict[str, Any] = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}

    @staticmethod
    def recorded_kubernetes(root: Path) -> str | None:
        """The control plane version the testbed in ``root`` was (last) started with, if it is one we run."""
        f = root / "state.json"
        k = json.loads(f.read_text()).get("kubernetes") if f.exists() else None
        return k if k in components.KUBERNETES else None

    # ------------------------------------------------------------ accessors
    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """The API server's audit log: one JSON line per request of every identity but the testbed's own."""
        return self.logs / "audit.log"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def is_up(self) -> bool:
        """True when a start finished (``ready_s`` recorded) and every component it started is alive. A start
        killed half-way (SIGKILL, SIGTERM: no cleanup runs) leaves some components running and no
        ``ready_s``: that is not up, and ``up()`` stops the leftovers and starts afresh."""
        pids = self.state.get("pids", {})
        return ("ready_s" in self.state and bool(pids) and all(alive(p) for p in pids.values())
                and self.is_ours())

    def is_ours(self) -> bool:
        """The running testbed was started by this checkout's code with these component versions. One from
        another checkout (its bridge runs that checkout's raygpu) or other versions (another KubeRay, another
        Kubernetes) is not reused: ``up()`` stops it and starts afresh, so a test never runs against what it
        did not pin."""
        return self.state.get("versions") == self.versions and self.state.get("code") == CODE_ROOT

    def _save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps(self.state, indent=2))

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        proc = spawn(name, argv, self.logs, env=env, cwd=self.root)
        self.state.setdefault("pids", {})[name] = proc.pid
        self._save()

    # ------------------------------------------------------------------ up
    def up(self, progress=print, nodes: dict[str, str] | None = None) -> dict[str, Any]:
        """Start every component and wait until each is ready. Idempotent if already up.

        If a component died because its port was taken between choosing and binding it, the whole
        start is tried once more with fresh ports (ports are chosen before any component starts).
        """
        if self.is_up():
            progress(f"testbed already up ({self.root})")
            return self.status()
        if self.state.get("ready_s") is not None and not self.is_ours():
            progress(f"the running testbed was started by {self.state.get('code')} with versions "
                     f"{self.state.get('versions')}: stopping it, starting this checkout's")
        for attempt in (1, 2):
            try:
                return self._up_once(progress, nodes)
            except TestbedError as exc:
                if attempt == 2 or "address already in use" not in str(exc):
                    raise
                progress(f"a port was taken while starting ({str(exc).splitlines()[0]}); starting again "
                         "with fresh ports")
        raise AssertionError("unreachable")

    def _up_once(self, progress, nodes: dict[str, str] | None) -> dict[str, Any]:
        self.down(quiet=True)
        bins = components.ensure_built(progress, self.kubernetes)
        t0 = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in ("etcd-data", "pki"):
            _rmtree(self.root / stale)
        self.state = {"started_at": time.time(), "pids": {}, "ports": {}, "kubernetes": self.kubernetes,
                      "versions": self.versions, "code": CODE_ROOT, "kubeconfig": str(self.kubeconfig)}
        ports = self.state["ports"]
        for name in ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "sp_scheduler", "sp_metrics", "sp_probe",
                     "kwok", "kuberay_metrics", "kuberay_probe", "kueue_webhook", "kueue_metrics", "kueue_probe",
                     "kueue_visibility"):
            ports[name] = free_port()
        try:
            self._up_core(bins, ports, progress)
            self._up_addons(bins, ports, progress)
            addons.add_nodes(self, nodes if nodes is not None else DEFAULT_NODES)
            self.state["ready_s"] = round(time.monotonic() - t0, 1)
            self._save()
            progress(f"testbed ready in {self.state['ready_s']} s; kubeconfig {self.kubeconfig}")
        except BaseException:
            progress(f"testbed failed to start; logs in {self.logs}")
            self.down(quiet=True)
            raise
        return self.status()

    def _up_core(self, bins: components.Binaries, ports: dict[str, int], progress) -> None:
        pkid = self.root / "pki"
        ca = pki.ensure_ca(pkid)
        api_crt, api_key = pki.ensure_serving_cert(pkid, "apiserver", ca, [
            "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local"])
        sa_key = pki.ensure_rsa_key(pkid / "sa.key")
        pki.write_token_file(pkid / "tokens.csv", ADMIN_TOKEN, "admin", ("system:masters",))
        (pkid / "audit-policy.yaml").write_text(AUDIT_POLICY)
        self._write_kubeconfig(self.kubeconfig, ports["apiserver"], ca[0], "admin", {"token": ADMIN_TOKEN})

        progress("starting etcd")
        self._start("etcd", [str(bins.etcd), "--data-dir", str(self.root / "etcd-data"), "--unsafe-no-fsync",
                             "--listen-client-urls", f"http://127.0.0.1:{ports['etcd']}",
                             "--advertise-client-urls", f"http://127.0.0.1:{ports['etcd']}",
                             "--listen-peer-urls", f"http://127.0.0.1:{ports['etcd_peer']}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{ports['etcd_peer']}",
                             "--initial-cluster", f"default=http://127.0.0.1:{ports['etcd_peer']}",
                             "--log-level", "warn"])
        progress("starting kube-apiserver")
        self._start("kube-apiserver", [
            str(bins.kube_apiserver), f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
            f"--secure-port={ports['apiserver']}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--tls-cert-file={api_crt}", f"--tls-private-key-file={api_key}", f"--client-ca-file={ca[0]}",
            f"--cert-dir={pkid}", "--service-cluster-ip-range=10.0.0.0/24", "--allow-privileged=true",
            "--authorization-mode=Node,RBAC", f"--token-auth-file={pkid / 'tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
            "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition", "--enable-priority-and-fairness=false",
            "--endpoint-reconciler-type=none", "--v=1",
            f"--audit-policy-file={pkid / 'audit-policy.yaml'}", f"--audit-log-path={self.audit_log}",
            "--audit-log-maxsize=200", "--audit-log-maxbackup=1", *self._feature_flags(runtime_config=True)])
        from kubernetes import client as kclient

        def readyz() -> bool:
            import ssl
            import urllib.request
            ctx = ssl.create_default_context(cafile=str(ca[0]))
            req = urllib.request.Request(f"https://127.0.0.1:{ports['apiserver']}/readyz",
                                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            with urllib.request.urlopen(req, timeout=2, context=ctx) as r:  # noqa: S310 - loopback
                return r.status == 200
        wait_for("kube-apiserver /readyz", readyz, 120, log=self.logs / "kube-apiserver.log",
                 pid=self.state["pids"].get("kube-apiserver"))
        progress("starting kube-controller-manager and kube-scheduler")
        self._start("kube-controller-manager", [
            str(bins.kube_controller_manager), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            f"--service-account-private-key-file={sa_key}", f"--root-ca-file={ca[0]}",
            "--use-service-account-credentials=false", f"--secure-port={ports['kcm']}", "--bind-address=127.0.0.1",
            # kwok nodes have no kubelet: no node lifecycle/IPAM/cloud controllers.
            "--controllers=*,-node-lifecycle-controller,-node-ipam-controller",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--v=1", *self._feature_flags()])
        self._start("kube-scheduler", [
            str(bins.kube_scheduler), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            f"--secure-port={ports['scheduler']}", "--bind-address=127.0.0.1",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--v=1", *self._feature_flags()])
        self._wait_namespace_sa("default", kclient)

    def _feature_flags(self, runtime_config: bool = False) -> list[str]:
        """What this control plane turns on beyond its defaults (components.FEATURE_GATES, RUNTIME_CONFIG)."""
        gates, rc = components.FEATURE_GATES[self.kubernetes], components.RUNTIME_CONFIG[self.kubernetes]
        if runtime_config:  # the API server's own list
            gates = components.APISERVER_FEATURE_GATES[self.kubernetes]
        return ([f"--feature-gates={gates}"] if gates else []) + (
            [f"--runtime-config={rc}"] if rc and runtime_config else [])

    def _wait_namespace_sa(self, ns: str, kclient) -> None:
        from raygpu.testing.kube import api_client
        c = api_client(self.kubeconfig)
        v1 = kclient.CoreV1Api(c)
        wait_for("ServiceAccount default/default (controller-manager running)",
                 lambda: v1.read_namespaced_service_account("default", ns), 90,
                 log=self.logs / "kube-controller-manager.log", pid=self.state["pids"].get("kube-controller-manager"))
        c.close()

    def _up_addons(self, bins: components.Binaries, ports: dict[str, int], progress) -> None:
        progress("installing CRDs (KubeRay, scheduler-plugins, Kueue, Volcano PodGroup)")
        addons.install_crds(self, bins)
        progress("starting scheduler-plugins (coscheduling scheduler + PodGroup controller)")
        addons.start_scheduler_plugins(self, bins, ports)
        progress("starting kwok")
        addons.start_kwok(self, bins, ports)
        progress("starting KubeRay operator")
        addons.start_kuberay(self, bins, ports)
        progress("starting Kueue (webhooks on 127.0.0.1)")
        addons.start_kueue(self, bins, ports)
        progress("starting the Ray bridge")
        self._start("bridge", [sys.executable, "-m", "raygpu.testing.bridge", "--kubeconfig", str(self.kubeconfig),
                               "--run-dir", str(self.root / "ray")])
        addons.wait_ready(self, ports)

    def _write_kubeconfig(self, path: Path, port: int, ca: Path, user: str, credentials: dict[str, str]) -> None:
        """A kubeconfig for the testbed's API server, mode 0600 (it may hold a token); ``credentials`` is the
        kubeconfig ``user`` entry (``{"token": ...}`` or ``{"client-certificate": ..., "client-key": ...}``)."""
        import yaml
        pki.write_private(path, yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "raygpu-testbed",
            "clusters": [{"name": "raygpu-testbed", "cluster": {
                "server": f"https://127.0.0.1:{port}", "certificate-authority": str(ca)}}],
            "users": [{"name": user, "user": dict(credentials)}],
            "contexts": [{"name": "raygpu-testbed", "context": {"cluster": "raygpu-testbed", "user": user}}],
        }))

    def kubeconfig_for_token(self, token: str, user: str, path: Path) -> Path:
        """A kubeconfig that authenticates with ``token`` (e.g. a minted ServiceAccount token)."""
        self._write_kubeconfig(path, self.state["ports"]["apiserver"], self.root / "pki" / "ca.crt", user,
                               {"token": token})
        return path

    def kubeconfig_for_client_cert(self, user: str, path: Path, groups: tuple[str, ...] = ()) -> tuple[Path, Path, Path]:
        """A client certificate for ``user`` (in ``groups``) and a kubeconfig using it; returns (kubeconfig, crt, key).

        For a component that authenticates with a certificate, such as Ray's KubeRay node provider
        (``RAY_KUBERAY_CLIENT_CERT_PATH`` / ``..._KEY_PATH``); RBAC applies to ``user`` as to anyone.
        """
        ca = self.root / "pki" / "ca.crt"
        crt, key = pki.ensure_client_cert(self.root / "pki", user, (ca, self.root / "pki" / "ca.key"), groups)
        self._write_kubeconfig(path, self.state["ports"]["apiserver"], ca, user,
                               {"client-certificate": str(crt), "client-key": str(key)})
        return path, crt, key

    # ---------------------------------------------------------------- down
    def down(self, quiet: bool = False) -> list[str]:
        """Stop every component (process groups, SIGTERM then SIGKILL). Returns what was stopped."""
        stopped = []
        pids = dict(self.state.get("pids", {}))
        for name in STOP_ORDER + [n for n in pids if n not in STOP_ORDER]:
            pid = pids.get(name)
            if pid and alive(pid):
                stop(pid)
                stopped.append(name)
        from raygpu.testing.bridge import stop_all_ray
        stop_all_ray(self.root / "ray")
        if self.state:
            self.state["pids"] = {}
            self._save()
        if stopped and not quiet:
            print(f"stopped: {', '.join(stopped)}")
        return stopped

    # -------------------------------------------------------------- status
    def status(self) -> dict[str, Any]:
        pids = self.state.get("pids", {})
        comps = {}
        versions = self.state.get("versions", self.versions)
        vmap = {"etcd": "etcd", "kube-apiserver": "kubernetes", "kube-controller-manager": "kubernetes",
                "kube-scheduler": "kubernetes", "sp-scheduler": "scheduler-plugins", "sp-controller": "scheduler-plugins",
                "kwok": "kwok", "ray-operator": "kuberay", "kueue": "kueue"}
        for name, pid in pids.items():
            comps[name] = {"pid": pid, "alive": alive(pid), "version": versions.get(vmap.get(name, ""), None)}
            if name.startswith("sp-") and "scheduler-plugins-kubernetes" in versions:  # the version skew
                comps[name]["version"] += f" (built with k8s {versions['scheduler-plugins-kubernetes']})"
        if "bridge" in comps:
            import ray
            comps["bridge"]["version"] = f"ray {ray.__version__}"
        from raygpu.testing.bridge import ray_clusters
        return {
            "up": self.is_up(),
            "kubernetes": self.state.get("kubernetes", components.DEFAULT_KUBERNETES if self.state else None),
            "run_dir": str(self.root),
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.exists() else None,
            "apiserver": f"https://127.0.0.1:{self.state['ports']['apiserver']}" if self.state.get("ports") else None,
            "ready_s": self.state.get("ready_s"),
            "audit_log": str(self.audit_log),
            "components": comps,
            "ray_clusters": ray_clusters(self.root / "ray"),
            "build_seconds": components.build_seconds(self.kubernetes),
            "ports": self.state.get("ports", {}),
        }


def _rmtree(p: Path) -> None:
    import shutil
    shutil.rmtree(p, ignore_errors=True)


def node(name: str, shape: str, extra_labels: dict[str, str] | None = None) -> dict[str, Any]:
    return node_manifest(name, shape, extra_labels)


__all__ = ["Testbed", "TestbedError", "run_dir", "ADMIN_TOKEN"]
