"""Issue 3: raygpu.placement_group end to end on the testbed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray

import raygpu
from raygpu.adapters.kube import KubeAdapter
from raygpu.model.labels import ANNOTATION_RESERVATION_STATE, LABEL_CLUSTER, LABEL_RESERVATION
from raygpu.model.shapes import GpuKind
from raygpu.testing import manifests as m
from raygpu.testing.kube import apply
from raygpu.testing import procs
from tests.integration.gang_helpers import leftovers, nothing_left
from tests.integration.util import alive_ray_nodes, pods, popen_as_foreground, ray_address, wait_for


EXIT_AFTER_CTRL_C_S = 12  # a user's Ctrl-C returns the prompt within about 10 s


@pytest.mark.k137  # the gang smoke test of the 1.37 pass
def test_bundles_sit_exactly_on_the_reserved_pods(testbed, ns, cluster, core):
    pg = raygpu.placement_group([{"GPU": 8, "CPU": 4}] * 2, strategy="STRICT_SPREAD", cluster=cluster,
                                namespace=ns, backend="none", timeout_s=120, name="exact",
                                kubeconfig=str(testbed.kubeconfig))
    try:
        assert pg.wait(150), f"not ready: {pg.state} {pg.error}"
        reserved = {p["metadata"]["name"] for p in pods(core, ns, f"{LABEL_RESERVATION}=rg-exact")}
        assert len(reserved) == 2
        table = ray.util.placement_group_table(pg.placement_group)
        node_of_bundle = set(table["bundles_to_node_id"].values())
        by_node = {n.node_id: n.instance_id for n in alive_ray_nodes(ray.get_runtime_context().gcs_address)}
        assert {by_node[n] for n in node_of_bundle} == reserved
        assert pg.state.value == "ready"
    finally:
        raygpu.remove_placement_group(pg)
    kube = KubeAdapter(str(testbed.kubeconfig))
    wait_for("reservation released", lambda: nothing_left(kube, ns, cluster), 60)


BAD_REQUESTS = [  # bundles, strategy, backend, cluster, what the error must name
    ([{"GPU": 16}], "PACK", None, "c", "bundle 0"),
    ([{"GPU": 8}], "DIAGONAL", None, "c", "strategy"),
    ([{"GPU": 0}], "PACK", None, "c", "bundle 0"),
    ([{"GPU": -1}], "PACK", None, "c", "bundle 0"),
    ([{"GPU": 8}], "PACK", "slurm", "c", "backend"),
    ([{"GPU": 8}], "PACK", None, "nope", "unknown cluster"),
    ([{"GPU": 0.5}], "PACK", None, "c", "fractional"),
]


def test_bad_requests_fail_fast_and_create_nothing(testbed, ns, cluster):
    kube = KubeAdapter(str(testbed.kubeconfig))
    rv = kube.get_raycluster(ns, cluster).resource_version
    for bundles, strategy, backend, cluster_name, expect in BAD_REQUESTS:
        with pytest.raises(raygpu.RayGpuError) as err:
            raygpu.placement_group(bundles, strategy=strategy, cluster=cluster_name, namespace=ns, backend=backend,
                                   kubeconfig=str(testbed.kubeconfig), name="bad")
        assert expect in str(err.value).lower(), (bundles, strategy, backend, str(err.value))
        assert nothing_left(kube, ns, cluster) is not None, (bundles, strategy, backend)
        assert kube.get_raycluster(ns, cluster).resource_version == rv, f"the RayCluster was written: {bundles}"


def test_infeasible_error_names_bundle_resource_and_limit(testbed, ns, cluster):
    with pytest.raises(raygpu.InfeasibleError) as err:
        raygpu.plan_placement_group([{"GPU": 8}, {"GPU": 16}], cluster=cluster, namespace=ns,
                                    kubeconfig=str(testbed.kubeconfig))
    e = err.value
    assert (e.bundle_index, e.resource, e.requested, e.limit) == (1, "GPU", 16, 8)


def test_timeout_rolls_everything_back(testbed, ns, cluster):
    # 3 x 8 GPUs on a pool of 2 GPU nodes under coscheduling: the gang can never be admitted.
    pg = raygpu.placement_group([{"GPU": 8}] * 3, strategy="STRICT_SPREAD", cluster=cluster, namespace=ns,
                                backend="coscheduling", timeout_s=20, name="late",
                                kubeconfig=str(testbed.kubeconfig))
    kube = KubeAdapter(str(testbed.kubeconfig))
    assert leftovers(kube, ns, cluster)["podgroups"], "the PodGroup exists while reserved"
    assert not pg.wait(40)
    assert pg.state.value == "rolled_back" and "timeout" in (pg.error or "")
    with pytest.raises((ray.exceptions.RayError, raygpu.RayGpuError)):
        ray.get(pg.ready(), timeout=30)
    left = wait_for("nothing left after the timeout", lambda: nothing_left(kube, ns, cluster) or None, 60)
    assert left is not None


@pytest.mark.parametrize("when", ["waiting", "ready"])
def test_interrupted_driver_leaves_nothing(testbed, ns, cluster, tmp_path, when):
    """Ctrl-C while the gang waits (3 x 8 GPUs on 2 nodes, coscheduling: never admitted) or once it is ready
    (2 Running pods with Ray nodes and a placement group on them, whose release takes longer than the exit)."""
    addr = ray.get_runtime_context().gcs_address
    err_path = tmp_path / "driver.stderr"
    bundles, backend, until = ("3", "coscheduling", "created") if when == "waiting" else ("2", "none", "ready")
    never = tmp_path / "never"  # the driver holds its PG until this file appears: it never does
    with open(err_path, "w") as err:
        proc = popen_as_foreground([sys.executable, "-m", "raygpu.demo.driver", "--address", addr, "--mode",
                                    "raygpu", "--cluster", cluster, "--namespace", ns, "--bundles", bundles,
                                    "--backend", backend, "--timeout-s", "150", "--kubeconfig", str(testbed.kubeconfig),
                                    "--name", "ctrlc", "--release-file", str(never)], stdout=subprocess.PIPE,
                                   stderr=err, text=True)
    kube = KubeAdapter(str(testbed.kubeconfig))
    events = []
    for line in proc.stdout:
        events.append(json.loads(line))
        if events[-1]["event"] in (until, "timeout", "error"):
            break
    assert events[-1]["event"] == until, f"the driver did not get to {until!r}: {events}"
    assert leftovers(kube, ns, cluster)["state_configmaps"], "the reservation exists before Ctrl-C"
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=EXIT_AFTER_CTRL_C_S * 3)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # the driver's faulthandler dumps every thread's stack to stderr
        wait_for("the driver's stack dump", lambda: "most recent call first" in err_path.read_text(), 10)
        proc.kill()
        pytest.fail(f"the driver did not exit within {EXIT_AFTER_CTRL_C_S * 3} s of Ctrl-C; its stderr ends:\n"
                    + err_path.read_text()[-6000:])
    exit_s = time.monotonic() - t0
    after = [json.loads(line) for line in proc.stdout.read().splitlines() if line.startswith("{")]
    said = "\n".join(str(e) for e in after) + "\nstderr ends:\n" + err_path.read_text()[-3000:]
    assert exit_s <= EXIT_AFTER_CTRL_C_S, f"the driver took {exit_s:.1f} s to exit after Ctrl-C:\n{said}"
    assert proc.returncode == 130 and any(e["event"] == "interrupted" for e in after), said
    try:
        wait_for("nothing left after Ctrl-C", lambda: nothing_left(kube, ns, cluster) or None, 90)
    except procs.TestbedError:
        logs = sorted(Path(tempfile.gettempdir()).glob(f"raygpu-finisher-{ns}-*.log"))
        pytest.fail(f"left after Ctrl-C: {leftovers(kube, ns, cluster)}\ndriver:\n{said}\nfinisher: "
                    + "\n".join(f"{p}: {p.read_text()[-2000:]}" for p in logs))


def test_mig_bundles_are_planned_as_slices_and_land(testbed, ns, pool, kube):
    pool.add({"cpu": "cpu16", "mig": "a100x8-mig-mixed"})
    apply(kube, m.raycluster("mig", ns, [m.worker_group("slice", gpus={"nvidia.com/mig-3g.40gb": 1}, cpu="4",
                                                        memory="32Gi", pool=pool.name)], pool=pool.name))
    plan = raygpu.plan_placement_group([{"GPU": 1}] * 3, cluster="mig", namespace=ns,
                                       kubeconfig=str(testbed.kubeconfig))
    assert plan.need.gpu_shape.kind is GpuKind.MIG
    assert plan.need.gpu_shape.resource == "nvidia.com/mig-3g.40gb"
    assert plan.pod_count == 3
    ray.init(address=ray_address(testbed, ns, "mig"), logging_level="ERROR", log_to_driver=False)
    try:
        with raygpu.gang_placement_group([{"GPU": 1}] * 3, cluster="mig", namespace=ns, backend="none",
                                         timeout_s=120, name="slices", kubeconfig=str(testbed.kubeconfig)) as pg:
            assert pg.wait(150), pg.error
            ps = [p for p in KubeAdapter(str(testbed.kubeconfig)).ray_pods(ns, "mig") if LABEL_RESERVATION in p.labels]
            assert {p.node_name for p in ps} == {pool.node("mig")}
            assert all(p.limits.get("nvidia.com/mig-3g.40gb") == 1 for p in ps)
    finally:
        ray.shutdown()


def run_example(script: str, testbed, ns: str, cluster: str) -> tuple[str, list[dict]]:
    """Run ``examples/<script>`` on this driver's Ray and the testbed (2 workers, backend none): its stdout and
    the JSON lines it printed, once it exited 0 and its reservation is gone."""
    addr = ray.get_runtime_context().gcs_address
    out = subprocess.run([sys.executable, f"examples/{script}", "--address", addr, "--cluster", cluster,
                          "--namespace", ns, "--workers", "2", "--backend", "none", "--timeout-s", "150",
                          "--kubeconfig", str(testbed.kubeconfig)], capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0, out.stderr[-2000:]
    kube = KubeAdapter(str(testbed.kubeconfig))
    assert wait_for("released after the example", lambda: nothing_left(kube, ns, cluster) or None, 60)
    return out.stdout, [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_example_gang_training_runs(testbed, ns, cluster):
    stdout, shards = run_example("gang_training.py", testbed, ns, cluster)
    assert sorted(s["rank"] for s in shards) == [0, 1]
    assert all(s["pod"].startswith("c-rg-gang-training") for s in shards), shards
    assert all(len(s["gpu_ids"]) == 8 for s in shards)
    assert "trained on 2 reserved pods" in stdout


def test_example_gang_async_runs_without_blocking_its_event_loop(testbed, ns, cluster):
    """examples/gang_async.py: the async face on real Ray and the testbed (issue 16 item 6)."""
    _, lines = run_example("gang_async.py", testbed, ns, cluster)
    shards = [x for x in lines if "rank" in x]
    assert sorted(s["rank"] for s in shards) == [0, 1]
    assert all(s["pod"].startswith("c-rg-gang-async") and len(s["gpu_ids"]) == 8 for s in shards), shards
    turns = next(x["loop_turns_while_waiting"] for x in lines if "loop_turns_while_waiting" in x)
    assert turns > 0  # the heartbeat task ran while the driver awaited the reservation


@pytest.mark.parametrize("state, cluster_label", [("ready", "c"), ("released", "other")])
def test_the_finisher_refuses_what_its_driver_did_not_release(testbed, ns, pool, kube, state, cluster_label):
    """A user's ConfigMap and worker group that look like a reservation: the background finisher leaves both."""
    apply(kube, m.raycluster("c", ns, [m.worker_group("rg-mine", replicas=0, pool=pool.name)], pool=pool.name))
    adapter = KubeAdapter(str(testbed.kubeconfig))
    adapter.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "mine", "namespace": ns, "labels": {LABEL_RESERVATION: "rg-mine", LABEL_CLUSTER: cluster_label},
        "annotations": {ANNOTATION_RESERVATION_STATE: state}}})
    generation = adapter.raw_raycluster(ns, "c")["metadata"]["generation"]  # moves with the spec, not the status
    out = subprocess.run([sys.executable, "-m", "raygpu.gang.finisher", "--namespace", ns, "--cluster", "c",
                          "--reservation", "mine", "--kubeconfig", str(testbed.kubeconfig), "--drain-timeout-s", "5"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stdout + out.stderr
    assert json.loads(out.stdout)["event"] == "refused", out.stdout
    assert adapter.get("v1", "ConfigMap", "mine", ns) is not None
    assert adapter.raw_raycluster(ns, "c")["metadata"]["generation"] == generation, "the user's RayCluster was written"
    assert adapter.get_raycluster(ns, "c").group("rg-mine") is not None
