"""The sidecar integration tests' helpers: the sidecar and driver subprocesses, a pod-deletion watch, cluster reads."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from kubernetes import watch

from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from raygpu.testing.procs import free_port
from tests.integration.util import alive_ray_nodes, pods, ray_address, wait_for

REPO = Path(__file__).resolve().parents[2]
ON_5S = {"raygpu.io/reclaim": "on", "raygpu.io/idle-timeout": "5s"}
GPU_RES = {"nvidia.com/gpu": 8}
BRIDGE_WAIT_S = 240


# ------------------------------------------------------------------ helpers
class Sidecar:
    """``raygpu sidecar`` in a subprocess with JSON logs, parsed as they come."""

    def __init__(self, testbed, ns: str, cluster: str, address: str, log_path: Path, *extra: str,
                 kubeconfig: Path | None = None) -> None:
        self.metrics_port = free_port()
        argv = [sys.executable, "-m", "raygpu.cli", "sidecar", "--cluster", cluster, "--namespace", ns,
                "--ray-address", address, "--kubeconfig", str(kubeconfig or testbed.kubeconfig),
                "--interval-s", "1", "--startup-grace-s", "0", "--metrics-port", str(self.metrics_port),
                "--json-logs", *extra]
        self.log_path = log_path
        self.lines: list[dict] = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        with open(self.log_path, "a") as f:
            for line in self.proc.stdout:
                f.write(line)
                f.flush()
                try:
                    rec = json.loads(line)
                except ValueError:
                    rec = {"event": "non-json", "line": line.rstrip()}
                with self._lock:
                    self.lines.append(rec)

    def records(self, event: str | None = None, **fields) -> list[dict]:
        with self._lock:
            return [r for r in self.lines if (event is None or r.get("event") == event)
                    and all(r.get(k) == v for k, v in fields.items())]

    def wait(self, what: str, probe, timeout_s: float):
        return wait_for(what, probe, timeout_s, log=self.log_path)

    def signal(self, sig: int) -> int | None:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(20)
        finally:
            self._reader.join(5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Driver:
    """A Ray driver in a subprocess that prints one JSON object per line (stderr to a log file; other stdout
    lines, such as Ray Tune's progress tables, are kept in ``other``)."""

    def __init__(self, script: str, address: str, log_path: Path) -> None:
        self.log_path = log_path
        self._err = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-c", script, address], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err, text=True, cwd=REPO)
        self._q: queue.Queue = queue.Queue()
        self.other: list[str] = []  # stdout lines that are not the driver's JSON (a library's own output)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            try:
                msg = json.loads(line)
            except ValueError:
                msg = None
            if isinstance(msg, dict):
                self._q.put(msg)
            else:
                self.other.append(line)

    def next(self, key: str, timeout_s: float):
        """The value of ``key`` in the next line that has it; fails after ``timeout_s`` quoting the driver's log."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = self._q.get(timeout=min(left, 1.0))
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if key in msg:
                return msg[key]
        raise AssertionError(f"driver printed no {key!r} within {timeout_s:.0f}s (exit {self.proc.poll()}):\n"
                             + self.log_path.read_text()[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.terminate()
            self.proc.wait(30)
        self._err.close()


class PodDeletions:
    """Counts DELETED watch events per pod name in a namespace (the ground truth of 'deleted twice')."""

    def __init__(self, core, ns: str) -> None:
        self.counts: dict[str, int] = {}
        self.created: set[str] = set()
        self._w = watch.Watch()
        self._stopped = False
        rv = core.list_namespaced_pod(ns).metadata.resource_version
        self._t = threading.Thread(target=self._run, args=(core, ns, rv), daemon=True)
        self._t.start()

    def _run(self, core, ns, rv) -> None:
        while not self._stopped:  # the server ends a watch after timeout_seconds: go on from the last version
            try:
                for ev in self._w.stream(core.list_namespaced_pod, ns, resource_version=rv, deserialize=False,
                                         timeout_seconds=300):
                    name = ev["object"]["metadata"]["name"]
                    rv = ev["object"]["metadata"]["resourceVersion"]
                    if ev["type"] == "DELETED":
                        self.counts[name] = self.counts.get(name, 0) + 1
                    elif ev["type"] == "ADDED":
                        self.created.add(name)
            except Exception:  # noqa: BLE001 - the namespace goes away at the end
                return

    def wait_deleted(self, names: list[str], timeout_s: float) -> dict[str, int | None]:
        """Wait until every pod of ``names`` has its DELETED event (a pod marked for deletion is removed a
        moment later, after its graceful termination); returns their counts, None where none came."""
        wait_for(f"DELETED events of {names}", lambda: all(self.counts.get(n) for n in names), timeout_s)
        return {n: self.counts.get(n) for n in names}

    def stop(self) -> None:
        self._stopped = True
        self._w.stop()


def _cluster(kube, ns: str, pool: str, groups: list[dict], annotations: dict[str, str], name: str = "rc") -> dict:
    rc = m.raycluster(name, ns, groups, pool=pool, annotations=annotations)
    apply(kube, rc)
    return rc


def _workers(core, ns: str, group: str | None = None) -> list[str]:
    sel = "ray.io/node-type=worker" + (f",ray.io/group={group}" if group else "")
    return sorted(p["metadata"]["name"] for p in pods(core, ns, sel) if not p["metadata"].get("deletionTimestamp"))


def _ready(testbed, core, ns: str, cluster: str, n_workers: int) -> tuple[str, list[str]]:
    """Wait for n Running worker pods and as many alive Ray worker nodes; returns (GCS address, pod names)."""
    def running():
        ws = [p for p in pods(core, ns, "ray.io/node-type=worker") if p["status"].get("phase") == "Running"]
        return sorted(p["metadata"]["name"] for p in ws) if len(ws) == n_workers else None
    names = wait_for(f"{n_workers} worker pods Running", running, 90, log=testbed.logs / "ray-operator.log")
    # the bridge starts one Ray node at a time for every test on the testbed: allow for a queue
    addr = ray_address(testbed, ns, cluster, timeout_s=BRIDGE_WAIT_S)
    wait_for(f"{n_workers} Ray worker nodes alive",
             lambda: sorted(n.instance_id for n in alive_ray_nodes(addr) if n.instance_id in names) == names,
             BRIDGE_WAIT_S, log=testbed.logs / "bridge.log")
    return addr, names


def _events(core, ns: str, reason: str, name: str = "rc") -> list:
    return core.list_namespaced_event(ns, field_selector=f"involvedObject.name={name},reason={reason}").items


def _spec_groups(kube, ns: str, name: str = "rc") -> dict[str, dict]:
    rc = kube.resources.get(api_version="ray.io/v1", kind="RayCluster").get(name=name, namespace=ns).to_dict()
    return {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}


def _merge_patch(kube, ns: str, body: dict, name: str = "rc") -> None:
    kube.resources.get(api_version="ray.io/v1", kind="RayCluster").patch(
        name=name, namespace=ns, body=body, content_type="application/merge-patch+json")


DRIVER = textwrap.dedent("""
    import json, sys, ray
    from ray.util.placement_group import placement_group, placement_group_table
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    say = lambda **kw: print(json.dumps(kw), flush=True)
    held = placement_group([{"GPU": 8}], name="held")
    ray.get(held.ready(), timeout=60)
    say(held=list(placement_group_table(held)["bundles_to_node_id"].values()))
    wide = placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD", name="wide")
    say(wide_state=placement_group_table(wide)["state"])
    ray.get(wide.ready(), timeout=240)
    say(wide=list(placement_group_table(wide)["bundles_to_node_id"].values()))
    sys.stdin.read()  # hold both placement groups until the test closes stdin
""")


def refusals(records: list[dict]) -> list[dict]:
    """The sidecar log records that report an API refusal: a value saying forbidden/denied or ``(403)``,
    or a ``status`` of 403. Not a bare "403" anywhere in the record: a timestamp (``17:36:17.403``) or a
    uid has those digits by chance, and CI once failed on exactly that."""
    def refused(v, key: str = "") -> bool:
        if isinstance(v, dict):
            return any(refused(x, str(k)) for k, x in v.items())
        if isinstance(v, (list, tuple)):
            return any(refused(x, key) for x in v)
        if isinstance(v, int) and not isinstance(v, bool):
            return key in ("status", "code") and v == 403
        text = str(v).lower()
        return "forbidden" in text or "denied" in text or "(403)" in text or (key in ("status", "code") and text == "403")
    return [r for r in records if refused(r)]
