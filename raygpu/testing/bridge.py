"""The Ray bridge: a real Ray node for every Ray pod that kwok marks Running.

kwok runs no containers, so this process plays the kubelet's part for Ray
pods only. For each pod labelled ``ray.io/is-ray-node=yes`` that is Running,
bound and not being deleted, it runs the exact ``ray start`` command KubeRay
generated for that pod (the container env ``KUBERAY_GEN_RAY_START_CMD``:
``--num-gpus`` from ``nvidia.com/gpu``/MIG limits or ``rayStartParams``,
``--labels`` from the group's labels), with the pod's env
(``RAY_CLOUD_INSTANCE_ID`` = pod name, ``RAY_NODE_TYPE_NAME`` = group) and
only these changes, all forced by running many nodes on one host:

* ``--address`` points at the head started for the pod's RayCluster on 127.0.0.1,
* ports that KubeRay fixes (metrics 8080, agent 52365, GCS 6379, client 10001)
  are replaced by free ports, and the dashboard is off,
* ``--object-store-memory`` is 80 MB (the host's memory is not the pod's).

A pod that goes away (deleted, deleting, not Running) has its Ray node stopped
(SIGTERM to its process group: the raylet unregisters from the GCS).

Fault injection for tests (``raygpu doctor``), one pod annotation,
``raygpu.io/testbed-ray``:

* ``stopped``: stop this pod's Ray node and do not restart it while the pod
  stays Running (a raylet dead under a live pod: an orphan pod);
* ``keep``: when this worker pod goes away, keep its Ray node running until its
  cluster's head stops (a raylet that outlived its pod: a ghost Ray node).
  Read when the Ray node starts and on every pass while the pod exists, so put
  it on the group's pod template to be sure it is seen before a deletion.

Run as ``python -m raygpu.testing.bridge --kubeconfig K --run-dir D``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time

from raygpu.model.labels import ANNOTATION_TESTBED_RAY
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("raygpu.bridge")

MARKER_ENV = "RAYGPU_TESTBED_RAY"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
STOP_GRACE_S = 5.0  # SIGTERM -> SIGKILL
START_GATE_S = 45.0  # a node still starting after this no longer holds back the next one
# flags whose values must change when many Ray nodes share one host
_DROP = {"address", "block", "port", "dashboard-port", "dashboard-host", "metrics-export-port",
         "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "ray-client-server-port",
         "object-store-memory", "include-dashboard", "node-ip-address"}


@dataclass
class RayProc:
    pod_uid: str
    pod: str
    namespace: str
    cluster: str
    is_head: bool
    proc: subprocess.Popen
    address: str | None = None  # head only: GCS address
    ready: bool = False  # "Ray runtime started" seen in its log
    started_at: float = 0.0  # monotonic
    keep: bool = False  # annotation "keep": outlive the pod


def parse_ray_start(cmd: str) -> tuple[bool, dict[str, str | None]]:
    """Split ``ray start [--head] --k=v --flag ...`` into (is_head, {k: v or None})."""
    tokens = shlex.split(cmd)
    if tokens[:2] != ["ray", "start"]:
        raise ValueError(f"not a ray start command: {cmd!r}")
    params: dict[str, str | None] = {}
    is_head = False
    i = 2
    while i < len(tokens):
        t = tokens[i]
        if t == "--head":
            is_head = True
        elif t.startswith("--"):
            key, eq, val = t[2:].partition("=")
            if eq:
                params[key] = val
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                params[key] = tokens[i + 1]
                i += 1
            else:
                params[key] = None
        i += 1
    return is_head, params


def _free_port() -> int:
    from raygpu.testing.procs import free_port
    return free_port()


def build_argv(is_head: bool, params: dict[str, str | None], head_address: str | None) -> list[str]:
    """The ``ray start`` argv the bridge runs for one pod (see module docstring)."""
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats"]
    if is_head:
        argv += ["--head", f"--port={_free_port()}", "--include-dashboard=false",
                 f"--ray-client-server-port={_free_port()}"]
    else:
        argv += [f"--address={head_address}"]
    argv += ["--node-ip-address=127.0.0.1", f"--object-store-memory={OBJECT_STORE_BYTES}",
             f"--metrics-export-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}"]
    for k, v in params.items():
        if k in _DROP:
            continue
        argv.append(f"--{k}" if v is None else f"--{k}={v}")
    return argv


def pod_env(pod: dict[str, Any]) -> dict[str, str]:
    """Plain ``value`` env vars of the Ray container, plus the downward-API ones KubeRay sets."""
    c = pod["spec"]["containers"][0]
    env = {}
    for e in c.get("env") or []:
        if "value" in e and e["value"] is not None:
            env[e["name"]] = e["value"]
    labels = pod["metadata"].get("labels") or {}
    env.setdefault("RAY_CLOUD_INSTANCE_ID", pod["metadata"]["name"])
    env.setdefault("RAY_NODE_TYPE_NAME", labels.get("ray.io/group", "headgroup"))
    return env


class Bridge:
    def __init__(self, kubeconfig: str, run_dir: Path) -> None:
        from kubernetes import client, config
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.run_dir = run_dir
        (run_dir / "clusters").mkdir(parents=True, exist_ok=True)
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, RayProc] = {}
        self.heads: dict[tuple[str, str], RayProc] = {}
        self.stopping: dict[int, tuple[subprocess.Popen, float]] = {}  # pid -> (proc, SIGKILL deadline)
        self.exiting = False

    # -------------------------------------------------------------- loop
    def run(self, interval_s: float = 0.3) -> None:
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "exiting", True))
        signal.signal(signal.SIGINT, lambda *_: setattr(self, "exiting", True))
        while not self.exiting:
            try:
                self.reconcile()
            except Exception:  # noqa: BLE001 - keep bridging; the API server may blink
                log.exception("reconcile failed")
            time.sleep(interval_s)
        for uid in list(self.procs):
            self._stop(uid, "bridge stopping")
        deadline = time.monotonic() + STOP_GRACE_S + 2
        while self.stopping and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.2)

    def reconcile(self) -> None:
        self._reap()
        pods = self.api.list_pod_for_all_namespaces(label_selector="ray.io/is-ray-node=yes",
                                                    _preload_content=False)
        items = json.loads(pods.data)["items"]
        wanted = {}
        for p in items:
            md, st = p["metadata"], p.get("status") or {}
            hook = (md.get("annotations") or {}).get(ANNOTATION_TESTBED_RAY)
            if md["uid"] in self.procs and hook == "keep":
                self.procs[md["uid"]].keep = True
            if md.get("deletionTimestamp") and md.get("finalizers") and st.get("phase") == "Running":
                self._terminate(p)
            if md.get("deletionTimestamp") or st.get("phase") != "Running" or not p["spec"].get("nodeName"):
                continue
            if hook == "stopped":
                continue
            wanted[md["uid"]] = p
        for uid in list(self.procs):
            rp = self.procs[uid]
            if uid not in wanted:
                if rp.keep and not rp.is_head and rp.proc.poll() is None and (rp.namespace, rp.cluster) in self.heads:
                    continue  # testbed hook "keep": a Ray node that outlives its pod
                self._stop(uid, "pod gone or not Running")
            elif rp.proc.poll() is not None:
                log.warning("ray node for pod %s/%s exited with %s", rp.namespace, rp.pod, rp.proc.returncode)
                self._stop(uid, "ray start exited")
        # heads first so that workers find their GCS in the same pass
        # One Ray node starts at a time: raylets starting together on one host
        # look each other up by IP and time out ("Failed to get node info").
        if any(not self._started(rp) and time.monotonic() - rp.started_at < START_GATE_S for rp in self.procs.values()):
            return
        for p in sorted(wanted.values(), key=lambda p: (p["metadata"]["labels"].get("ray.io/node-type") != "head")):
            if p["metadata"]["uid"] not in self.procs and self._start(p):
                return

    def _terminate(self, pod: dict[str, Any]) -> None:
        """A deleted pod that a finalizer keeps (Kueue's): as the kubelet does, report it Failed once its
        containers (here: its Ray node) are gone, so the finalizer's owner can finish it."""
        md = pod["metadata"]
        try:
            self.api.patch_namespaced_pod_status(md["name"], md["namespace"], {"status": {
                "phase": "Failed", "reason": "Terminated", "message": "deleted; Ray node stopped by the testbed bridge"}})
        except Exception:  # noqa: BLE001 - next pass
            log.exception("could not mark pod %s/%s Failed", md["namespace"], md["name"])

    # ------------------------------------------------------------ actions
    def _start(self, pod: dict[str, Any]) -> bool:
        """Start the Ray node of ``pod``; False when it cannot start yet (or ever)."""
        md = pod["metadata"]
        ns, name, uid = md["namespace"], md["name"], md["uid"]
        cluster = md["labels"].get("ray.io/cluster", "")
        env = pod_env(pod)
        cmd = env.get("KUBERAY_GEN_RAY_START_CMD")
        if not cmd:
            log.warning("pod %s/%s has no KUBERAY_GEN_RAY_START_CMD; skipped", ns, name)
            return False
        is_head, params = parse_ray_start(cmd)
        head = self.heads.get((ns, cluster))
        if not is_head and (head is None or not self._started(head)):
            return False  # the head is not up yet; next pass (a worker started earlier fails after ~40 s)
        argv = build_argv(is_head, params, head.address if head else None)
        full_env = dict(os.environ)
        full_env.update(env)
        # RAY_AUTH_MODE: Ray >= 2.5x's `ray start` turns token auth on by itself when ~/.ray/auth_token exists
        # (any local ray.init() or ray.cluster_utils.Cluster on this machine writes one), while a driver that
        # connects to an address does not: every ray.init to a testbed head then fails "InvalidAuthToken".
        # These are loopback test clusters: auth off, explicitly.
        full_env.update({MARKER_ENV: str(self.run_dir), "RAY_prestart_worker_first_driver": "0",
                         "RAY_enable_worker_prestart": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
        full_env.pop("KUBERAY_GEN_RAY_START_CMD", None)
        logf = open(self.run_dir / "logs" / f"{ns}__{name}.log", "wb")  # noqa: SIM115 - fresh: readiness reads it
        proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=full_env, start_new_session=True)
        rp = RayProc(uid, name, ns, cluster, is_head, proc, started_at=time.monotonic(),
                     keep=(md.get("annotations") or {}).get(ANNOTATION_TESTBED_RAY) == "keep")
        if is_head:
            port = next(a.split("=", 1)[1] for a in argv if a.startswith("--port="))
            rp.address = f"127.0.0.1:{port}"
            self.heads[(ns, cluster)] = rp  # the cluster file is written once the head is ready
        self.procs[uid] = rp
        (self.run_dir / "nodes").mkdir(exist_ok=True)
        (self.run_dir / "nodes" / f"{uid}.pid").write_text(str(proc.pid))
        log.info("started ray %s for pod %s/%s: %s", "head" if is_head else "worker", ns, name, shlex.join(argv))
        return True

    def _started(self, rp: RayProc) -> bool:
        """``ray start`` printed that the runtime started (for a head: GCS and raylet up)."""
        if rp.ready:
            return True
        try:
            rp.ready = b"Ray runtime started" in (self.run_dir / "logs" / f"{rp.namespace}__{rp.pod}.log").read_bytes()
        except OSError:
            return False
        if rp.ready and rp.is_head:
            self._write_cluster(rp)
        return rp.ready

    def _write_cluster(self, rp: RayProc) -> None:
        f = self.run_dir / "clusters" / f"{rp.namespace}__{rp.cluster}.json"
        f.write_text(json.dumps({"namespace": rp.namespace, "cluster": rp.cluster, "address": rp.address,
                                 "head_pod": rp.pod, "pid": rp.proc.pid}))

    def _stop(self, uid: str, why: str) -> None:
        """SIGTERM the node's process group (the raylet unregisters) without blocking the loop."""
        rp = self.procs.pop(uid)
        log.info("stopping ray node of pod %s/%s (%s)", rp.namespace, rp.pod, why)
        try:
            os.killpg(rp.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.stopping[rp.proc.pid] = (rp.proc, time.monotonic() + STOP_GRACE_S)
        (self.run_dir / "nodes" / f"{uid}.pid").unlink(missing_ok=True)
        if rp.is_head:
            self.heads.pop((rp.namespace, rp.cluster), None)
            (self.run_dir / "clusters" / f"{rp.namespace}__{rp.cluster}.json").unlink(missing_ok=True)

    def _reap(self) -> None:
        """SIGKILL process groups still alive past their grace period; forget the dead ones."""
        for pid, (proc, deadline) in list(self.stopping.items()):
            group_alive = True
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                group_alive = False
            proc.poll()
            if not group_alive:
                del self.stopping[pid]
            elif time.monotonic() > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def ray_clusters(run_dir: Path) -> list[dict[str, Any]]:
    """The Ray heads the bridge runs now: namespace, cluster, address, head pod."""
    from raygpu.testing.procs import alive
    out = []
    for f in sorted((run_dir / "clusters").glob("*.json")) if (run_dir / "clusters").exists() else []:
        try:
            d = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if alive(d.get("pid", 0)):
            out.append(d)
    return out


def head_address(run_dir: Path, namespace: str, cluster: str) -> str | None:
    """The GCS address of RayCluster namespace/cluster's head, when the bridge runs it now."""
    return next((c["address"] for c in ray_clusters(run_dir)
                 if c["namespace"] == namespace and c["cluster"] == cluster), None)


def stop_all_ray(run_dir: Path) -> int:
    """Kill every process that carries this testbed's Ray marker (after the bridge is gone)."""
    from raygpu.testing.procs import stop
    n = 0
    marker = f"{MARKER_ENV}={run_dir}".encode()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if marker in (p / "environ").read_bytes().split(b"\0"):
                os.kill(int(p.name), signal.SIGKILL)
                n += 1
        except (OSError, ProcessLookupError):
            continue
    for f in (run_dir / "clusters").glob("*.json") if (run_dir / "clusters").exists() else []:
        f.unlink(missing_ok=True)
    del stop
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--run-dir", required=True, type=Path)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    Bridge(args.kubeconfig, args.run_dir).run()


if __name__ == "__main__":
    main()
