"""The Ray adapters and ``take_snapshot`` against a real local Ray cluster (head + 2 workers).

One module-scoped ``ray.cluster_utils.Cluster``: a head, a worker with 8 fake
GPUs labelled ``raygpu.io/reservation=r1`` (pod ``pod-gpu-0`` of group
``gpu-group``) and a CPU worker (``pod-cpu-0`` of ``cpu-group``). The raylet
reads ``RAY_CLOUD_INSTANCE_ID`` / ``RAY_NODE_TYPE_NAME`` from its environment,
which it inherits from this process when ``add_node`` starts it.
"""

from __future__ import annotations

import os
import socket
import time
from contextlib import contextmanager

import pytest
import ray

from raygpu.adapters.kube import KubeAdapter
from raygpu.adapters.nvml_collect import collect_nvml
from raygpu.adapters.ray_gcs import read_ray_view
from raygpu.model.views import PgState
from raygpu.doctor.snapshot import take_snapshot

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]
SELECTOR = {"raygpu.io/reservation": "r1"}


@contextmanager
def _env(**values: str):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        with _env(RAY_CLOUD_INSTANCE_ID="pod-gpu-0", RAY_NODE_TYPE_NAME="gpu-group"):
            gpu = c.add_node(num_cpus=1, num_gpus=8, labels=SELECTOR)
        with _env(RAY_CLOUD_INSTANCE_ID="pod-cpu-0", RAY_NODE_TYPE_NAME="cpu-group"):
            cpu = c.add_node(num_cpus=1)
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False)
        c.ids = {"gpu": gpu.node_id, "cpu": cpu.node_id, "head": c.head_node.node_id}
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def _by_id(view):
    return {n.node_id: n for n in view.nodes}


def test_nodes_alive_with_gpus_labels_and_identity(cluster):
    now = time.time()
    view = read_ray_view(cluster.address, now_s=now)
    assert view.reachable, view.reason
    nodes = _by_id(view)
    gpu, cpu, head = (nodes[cluster.ids[k]] for k in ("gpu", "cpu", "head"))
    assert all(n.alive for n in (gpu, cpu, head))
    assert (head.is_head, gpu.is_head, cpu.is_head) == (True, False, False)
    assert (gpu.gpu_total, cpu.gpu_total) == (8.0, 0.0)
    assert gpu.labels["raygpu.io/reservation"] == "r1" and "raygpu.io/reservation" not in cpu.labels
    assert (gpu.instance_id, gpu.node_type, cpu.instance_id, cpu.node_type) == (
        "pod-gpu-0", "gpu-group", "pod-cpu-0", "cpu-group")
    assert (head.instance_id, head.node_type) == (None, None)


def test_idle_node_has_idle_since_before_now(cluster):
    deadline = time.time() + 20
    while True:  # the CPU worker goes IDLE once no lease is held on it
        now = time.time()
        cpu = _by_id(read_ray_view(cluster.address, now_s=now))[cluster.ids["cpu"]]
        if cpu.idle_since_s is not None or time.time() > deadline:
            break
        time.sleep(0.5)
    assert cpu.idle_since_s is not None and cpu.idle_since_s <= now


def test_placement_group_table_with_label_selector(cluster):
    from ray.util.placement_group import placement_group, remove_placement_group

    pg = placement_group([{"GPU": 4}, {"GPU": 2}], strategy="STRICT_PACK", name="pinned",
                         bundle_label_selector=[SELECTOR, SELECTOR])
    infeasible = placement_group([{"GPU": 16}], name="too-big")
    try:
        ray.get(pg.ready(), timeout=60)
        view = read_ray_view(cluster.address)
        pgs = {p.pg_id: p for p in view.placement_groups}
        got, pending = pgs[pg.id.hex()], pgs[infeasible.id.hex()]
        assert (got.name, got.state, got.strategy) == ("pinned", PgState.CREATED, "STRICT_PACK")
        assert got.bundles == ({"GPU": 4.0}, {"GPU": 2.0})
        assert got.bundle_node_ids == (cluster.ids["gpu"],) * 2
        assert got.bundle_label_selectors == (SELECTOR, SELECTOR)
        assert got.creator_job_id == ray.get_runtime_context().get_job_id()
        assert (pending.state, pending.bundle_node_ids) == (PgState.PENDING, (None,))
        assert not any("_group_" in r for n in view.nodes for r in n.total)  # PG-derived resources dropped
        deadline = time.time() + 10  # available comes from raylet resource reports: eventually consistent
        while _by_id(read_ray_view(cluster.address))[cluster.ids["gpu"]].gpu_available != 2.0:
            assert time.time() < deadline, "GPU availability never showed the placed bundles"
            time.sleep(0.2)
    finally:
        remove_placement_group(pg)
        remove_placement_group(infeasible)
    time.sleep(0.5)
    after = {p.pg_id: p for p in read_ray_view(cluster.address).placement_groups}
    assert pg.id.hex() not in after or after[pg.id.hex()].state is PgState.REMOVED


@pytest.mark.parametrize("address", ["127.0.0.1:1", "not an address"])
def test_unreachable_address_is_a_value(address):
    t0 = time.monotonic()
    view = read_ray_view(address, timeout_s=5)
    assert not view.reachable and view.reason and not view.nodes
    assert time.monotonic() - t0 < 5


def test_silent_gcs_times_out():
    with socket.socket() as server:  # accepts TCP, never speaks gRPC
        server.bind(("0.0.0.0", 0))  # Ray rewrites 127.0.0.1 to this node's IP
        server.listen()
        t0 = time.monotonic()
        view = read_ray_view(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=2)
    assert not view.reachable and "did not answer within 2s" in view.reason
    assert time.monotonic() - t0 < 4


def test_collect_nvml_pins_a_probe_to_every_node(cluster):
    unknown = "ab" * 28
    views = collect_nvml([*cluster.ids.values(), unknown], timeout_s=60)
    assert set(views) == {*cluster.ids.values(), unknown}
    for node_id in cluster.ids.values():  # NVML answered (a GPU here, or NVML's own reason): the probe ran
        v = views[node_id]
        assert v.node_id == node_id and (v.available or v.reason.startswith("NVML unavailable: ")), v.reason
    assert views[unknown].reason.startswith("probe failed: TaskUnschedulableError")
    late = collect_nvml([cluster.ids["head"]], timeout_s=0.001)[cluster.ids["head"]]
    assert late.reason == "probe failed: no answer within 0.001s"


def _gone_api_server(tmp_path):
    """A kubeconfig for an API server that answered discovery, then went away.

    ``KubeAdapter()`` needs discovery (``/version``, ``/api``, ``/apis``) to be
    constructed; the reads after that hit a closed port.
    """
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    docs = {"/version": {"major": "1", "minor": "34", "gitVersion": "v1.34.4"},
            "/api": {"kind": "APIVersions", "versions": ["v1"]}, "/apis": {"kind": "APIGroupList", "groups": []}}

    class Discovery(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = json.dumps(docs.get(self.path.split("?")[0], {})).encode()
            self.send_response(200 if self.path.split("?")[0] in docs else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Discovery)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.server_port}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: x}}]\n")
    return kubeconfig, server


def test_snapshot_reads_ray_and_reports_unreachable_kubernetes(cluster, tmp_path):
    kubeconfig, server = _gone_api_server(tmp_path)
    kube = KubeAdapter(str(kubeconfig))
    server.shutdown()
    server.server_close()
    snap = take_snapshot(kube, cluster.address, "default", "rc", now_s=time.time(), with_nvml=True)
    assert snap.ray.reachable and len(snap.ray.nodes) == 3
    assert not snap.k8s.reachable and "TransientError" in snap.k8s.reason, snap.k8s.reason
    assert set(snap.nvml) == set(cluster.ids.values())
    ray.shutdown()  # without a driver, take_snapshot connects one for the probe and disconnects it
    try:
        alone = take_snapshot(None, cluster.address, None, None, now_s=time.time(), with_nvml=True)
        assert set(alone.nvml) == set(cluster.ids.values()) and not ray.is_initialized()
        assert not any(v.reason.startswith("probe failed") for v in alone.nvml.values() if v.reason)
    finally:
        ray.init(address=cluster.address, log_to_driver=False)
    none = take_snapshot(None, "127.0.0.1:1", None, None, now_s=0.0, with_nvml=True)
    assert (none.ray.reachable, none.k8s.reachable, none.nvml) == (False, False, {})
    assert none.k8s.reason == "no Kubernetes client"
