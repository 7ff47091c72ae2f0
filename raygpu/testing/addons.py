"""Add-ons of the testbed: CRDs, scheduler-plugins, kwok, KubeRay, Kueue, nodes.

Each ``start_*`` launches a real upstream binary against the testbed's API
server; ``wait_ready`` polls each one's health endpoint with a deadline.
"""

from __future__ import annotations

import base64
import urllib.request
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

from raygpu.testing import pki
from raygpu.testing.catalog import node_manifest
from raygpu.testing.kube import apply, dynamic, load_yaml_docs
from raygpu.testing.procs import port_open, wait_for

if TYPE_CHECKING:
    from raygpu.testing.components import Binaries

SP_SCHEDULER_NAME = "scheduler-plugins-scheduler"
# A second profile of the same scheduler process, also running Coscheduling: the name a deployment may give it
# instead (raygpu.io/gang-scheduler-name, scheduler_name=; tests/integration/test_gang_scheduler_name.py)
SP_SECOND_SCHEDULER_NAME = "second-coscheduling"
KUEUE_NAMESPACE = "kueue-system"
KUEUE_FLAVOR = "default-flavor"


class Testbed(Protocol):
    """What the add-ons need of ``raygpu.testing.controlplane.Testbed`` (which imports this module, not back)."""

    root: Path
    state: dict[str, Any]

    @property
    def kubeconfig(self) -> Path: ...

    @property
    def logs(self) -> Path: ...

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None: ...


def install_crds(tb: "Testbed", bins: "Binaries") -> None:
    dyn = dynamic(tb.kubeconfig)
    files = sorted(bins.kuberay_crds.glob("*.yaml")) + sorted(bins.scheduler_plugins_crds.glob("*.yaml"))
    files += sorted((bins.kueue_config / "crd" / "bases").glob("*.yaml"))
    files.append(Path(__file__).parent / "catalog" / "volcano_crd.yaml")
    names = []
    for f in files:
        for doc in load_yaml_docs(f):
            if doc.get("kind") == "CustomResourceDefinition":
                apply(dyn, doc)
                names.append(doc["metadata"]["name"])
    crd = dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")

    def established() -> bool:
        for n in names:
            conds = crd.get(name=n).to_dict().get("status", {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                return False
        return True
    wait_for(f"{len(names)} CRDs Established", established, 60)
    tb.state["crds"] = names


def start_scheduler_plugins(tb: "Testbed", bins: "Binaries", ports: dict[str, int]) -> None:
    cfg = tb.root / "sp-scheduler.yaml"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(tb.kubeconfig)},
        "profiles": [{  # every profile of one scheduler must sort its queue alike: both use Coscheduling's
            "schedulerName": name,
            "plugins": {"multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                        "queueSort": {"enabled": [{"name": "Coscheduling"}], "disabled": [{"name": "*"}]}},
            "pluginConfig": [{"name": "Coscheduling", "args": {"permitWaitingTimeSeconds": 30}}],
        } for name in (SP_SCHEDULER_NAME, SP_SECOND_SCHEDULER_NAME)],
    }))
    tb._start("sp-scheduler", [str(bins.sp_scheduler), f"--config={cfg}", f"--secure-port={ports['sp_scheduler']}",
                               "--bind-address=127.0.0.1", f"--authentication-kubeconfig={tb.kubeconfig}",
                               f"--authorization-kubeconfig={tb.kubeconfig}", "--v=2"])
    # The unschedulable-queue flush stays at its default (5 min), as in a real cluster: Coscheduling requeues
    # the pods it rejected only on a Pod add or a PodGroup add/update, and raygpu's gangs must (and do) cope.
    tb._start("sp-controller", [str(bins.sp_controller), f"--metricsAddr=127.0.0.1:{ports['sp_metrics']}",
                                f"--probeAddr=127.0.0.1:{ports['sp_probe']}"],
              env={"KUBECONFIG": str(tb.kubeconfig)})


def start_kwok(tb: "Testbed", bins: "Binaries", ports: dict[str, int]) -> None:
    stages = []
    for kind in ("node", "pod"):
        for f in sorted((bins.kwok_stages / kind / "fast").glob("*.yaml")):
            if f.name != "kustomization.yaml":
                stages.extend(load_yaml_docs(f))
    cfg = tb.root / "kwok.yaml"
    cfg.write_text(yaml.safe_dump_all(stages))
    tb._start("kwok", [str(bins.kwok), f"--kubeconfig={tb.kubeconfig}", f"--config={cfg}",
                       "--manage-all-nodes=false",
                       "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                       f"--server-address=127.0.0.1:{ports['kwok']}", "--cidr=10.0.0.1/16",
                       "--node-ip=10.0.0.1"])


def start_kuberay(tb: "Testbed", bins: "Binaries", ports: dict[str, int]) -> None:
    tb._start("ray-operator", [str(bins.ray_operator), f"--metrics-addr=127.0.0.1:{ports['kuberay_metrics']}",
                               f"--health-probe-bind-address=127.0.0.1:{ports['kuberay_probe']}",
                               "--enable-leader-election=false", "--log-stdout-encoder=console"],
              env={"KUBECONFIG": str(tb.kubeconfig)})


def start_kueue(tb: "Testbed", bins: "Binaries", ports: dict[str, int]) -> None:
    pkid = tb.root / "pki"
    ca = pki.ensure_ca(pkid)
    certdir = pkid / "kueue-webhook"
    certdir.mkdir(parents=True, exist_ok=True)
    crt, key = pki.ensure_serving_cert(certdir, "tls", ca, ["localhost"])
    # Kueue reads its metrics certificate from a fixed path when internal cert
    # management is off (cmd/kueue/main.go); the testbed runs as root and writes it.
    metrics = Path("/etc/kueue/metrics/certs")
    metrics.mkdir(parents=True, exist_ok=True)
    (metrics / "tls.crt").write_bytes(crt.read_bytes())
    (metrics / "tls.key").write_bytes(key.read_bytes())

    dyn = dynamic(tb.kubeconfig)
    apply(dyn, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}})
    cabundle = base64.b64encode(ca[0].read_bytes()).decode()
    for doc in load_yaml_docs(bins.kueue_config / "webhook" / "manifests.yaml"):
        hooks = []
        for h in doc.get("webhooks", []):
            path = h["clientConfig"]["service"]["path"]
            if "kueue-x-k8s-io" not in path and path not in ("/mutate--v1-pod", "/validate--v1-pod"):
                continue  # only Kueue's own APIs and the plain-pod integration are enabled
            h["clientConfig"] = {"url": f"https://127.0.0.1:{ports['kueue_webhook']}{path}", "caBundle": cabundle}
            hooks.append(h)
        doc["webhooks"] = hooks
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        apply(dyn, doc)
    cfg = tb.root / "kueue.yaml"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue_probe']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue_metrics']}"},
        "webhook": {"port": ports["kueue_webhook"], "host": "127.0.0.1", "certDir": str(certdir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {"frameworks": ["pod"]},
        "clientConnection": {"qps": 50, "burst": 100},
    }))
    tb._start("kueue", [str(bins.kueue), f"--config={cfg}", f"--kubeconfig={tb.kubeconfig}",
                        "--feature-gates=VisibilityOnDemand=false",
                        f"--visibility-server-port={ports['kueue_visibility']}", "--zap-log-level=2"])


def _http_ok(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=2, context=ctx) as r:  # noqa: S310 - loopback only
        return r.status == 200


def wait_ready(tb: "Testbed", ports: dict[str, int]) -> None:
    logs = tb.logs
    pids = tb.state.get("pids", {})

    def wait(what: str, probe, timeout_s: float, component: str) -> None:
        wait_for(what, probe, timeout_s, log=logs / f"{component}.log", pid=pids.get(component))

    wait("scheduler-plugins scheduler /healthz",
         lambda: _http_ok(f"https://127.0.0.1:{ports['sp_scheduler']}/healthz"), 90, "sp-scheduler")
    wait("kube-scheduler /healthz", lambda: _http_ok(f"https://127.0.0.1:{ports['scheduler']}/healthz"), 60,
         "kube-scheduler")
    wait("scheduler-plugins controller /readyz", lambda: _http_ok(f"http://127.0.0.1:{ports['sp_probe']}/readyz"), 60,
         "sp-controller")
    wait("kwok listening", lambda: port_open(ports["kwok"]), 60, "kwok")
    wait("KubeRay operator /readyz", lambda: _http_ok(f"http://127.0.0.1:{ports['kuberay_probe']}/readyz"), 90,
         "ray-operator")
    wait("Kueue /readyz", lambda: _http_ok(f"http://127.0.0.1:{ports['kueue_probe']}/readyz"), 120, "kueue")
    wait("Kueue webhook port", lambda: port_open(ports["kueue_webhook"]), 60, "kueue")
    dyn = dynamic(tb.kubeconfig)
    # Kueue's webhooks validate the flavor: applying it proves they answer.
    wait_for("Kueue webhooks answering (ResourceFlavor accepted)", lambda: apply(dyn, {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": KUEUE_FLAVOR}}), 60,
        log=logs / "kueue.log")


# ------------------------------------------------------------------ nodes
def add_nodes(tb: "Testbed", nodes: dict[str, str], labels: dict[str, str] | None = None) -> list[str]:
    """Create kwok-managed nodes ``{name: catalog shape}`` and wait until kwok marks them Ready."""
    from kubernetes import client as kclient
    from raygpu.testing.kube import api_client
    c = api_client(tb.kubeconfig)
    v1 = kclient.CoreV1Api(c)
    for name, shape in nodes.items():
        body = node_manifest(name, shape, labels)
        try:
            v1.create_node(body)
        except kclient.ApiException as e:
            if e.status != 409:
                raise

    def ready() -> bool:
        for name in nodes:
            conds = v1.read_node(name).status.conditions or []
            if not any(cd.type == "Ready" and cd.status == "True" for cd in conds):
                return False
        return True
    wait_for(f"nodes {sorted(nodes)} Ready (kwok)", ready, 60, log=tb.logs / "kwok.log")
    c.close()
    return list(nodes)


def remove_nodes(tb: "Testbed", names: list[str]) -> None:
    from kubernetes import client as kclient
    from raygpu.testing.kube import api_client
    c = api_client(tb.kubeconfig)
    v1 = kclient.CoreV1Api(c)
    for n in names:
        try:
            v1.delete_node(n)
        except kclient.ApiException as e:
            if e.status != 404:
                raise
    c.close()


def patch_node_status(tb: "Testbed", name: str, status: dict[str, Any]) -> None:
    """Patch a node's status (e.g. ``{"allocatable": {"nvidia.com/gpu": "0"}}``) through the status subresource."""
    from kubernetes import client as kclient
    from raygpu.testing.kube import api_client
    c = api_client(tb.kubeconfig)
    kclient.CoreV1Api(c).patch_node_status(name, {"status": status})
    c.close()
