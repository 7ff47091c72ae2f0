"""Gang scale-up on the testbed: UNMODIFIED Ray drivers (no ``import raygpu`` in the job) get their gang.

The RayCluster has one 8-GPU worker group at zero replicas (its template) and no in-tree autoscaler: the
sidecar's gang scale-up (``raygpu.io/gang-scale-up: on``, backend coscheduling) is the only scale-up of
placement groups. A plain ``ray.util.placement_group([{"GPU": 8}] * 4, strategy="STRICT_SPREAD")`` sits pending
in Ray; the sidecar reserves a 4-pod gang for it, the pods bind together (one PodGroup), become Ray nodes, and
Ray places the group on them. The job runs a task per bundle, ends, and its placement group goes with it: the
sidecar releases the reservation on Ray's word and nothing is left.
"""

from __future__ import annotations

import textwrap
import time

from raygpu.adapters.kube import KubeAdapter
from raygpu.model.labels import ANNOTATION_PLACEMENT_GROUP, LABEL_CREATED_BY, LABEL_RESERVATION
from tests.integration.gang_helpers import nothing_left
from tests.integration.scale_up_helpers import CLUSTER, PLAIN_PG, scale_up_cluster
from tests.integration.sidecar_helpers import Driver, Sidecar
from tests.integration.util import wait_for



# Ray Train v2 (on by default in Ray 2.60): its controller creates the workers' placement group, PACK, one
# {"GPU": 8} bundle per worker, and re-creates it under a new id when it is not ready within
# RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S (60 s by default; left at its default here)
TRAIN = textwrap.dedent("""
    import json, os, sys, tempfile, ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
    assert "raygpu" not in sys.modules
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    say = lambda **kw: print(json.dumps(kw), flush=True)
    out = tempfile.mkdtemp(prefix="ranks-")

    def train_fn(config):
        import json, os, ray
        from ray import train
        ctx = train.get_context()
        node = ray.get_runtime_context().get_node_id()
        with open(os.path.join(config["out"], f"rank{ctx.get_world_rank()}.json"), "w") as f:
            json.dump({"rank": ctx.get_world_rank(), "node": node}, f)
        train.report({"rank": ctx.get_world_rank()})

    trainer = DataParallelTrainer(train_fn, train_loop_config={"out": out},
                                  scaling_config=ScalingConfig(num_workers=4, use_gpu=True,
                                                               resources_per_worker={"GPU": 8}),
                                  run_config=RunConfig(name="gang-scale-up", storage_path=out))
    say(started=True)
    result = trainer.fit()
    ranks = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out)) if f.startswith("rank")]
    say(error=None if result.error is None else str(result.error))
    say(ranks=ranks)
    labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes()}
    say(labels={r["node"]: labels.get(r["node"], {}) for r in ranks})
    assert "raygpu" not in sys.modules
""")


def test_a_ray_train_data_parallel_trainer_gets_its_gang_every_rank_on_it_and_leaves_nothing(testbed, ns, pool,
                                                                                           kube, tmp_path):
    t0 = time.monotonic()
    admin = KubeAdapter(str(testbed.kubeconfig))
    addr = scale_up_cluster(testbed, ns, pool, kube, gpu_nodes=4)
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar.log")
    driver = Driver(TRAIN, addr, tmp_path / "driver.log")
    try:
        assert driver.next("started", 120) is True
        reserved = side.wait("the sidecar reserves a gang for the trainer's placement group",
                             lambda: side.records("scale-up-reserved"), 120)
        group = reserved[0]["group"]
        assert reserved[0]["pods"] == 4, reserved
        assert driver.next("error", 420) is None, driver.log_path.read_text()[-3000:]
        ranks = driver.next("ranks", 5)
        labels = driver.next("labels", 10)
        assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3], ranks
        # every rank ran on a Ray node of a reservation's pods (its group, or one it followed to a new PG)
        assert all(labels[r["node"]].get(LABEL_RESERVATION, "").startswith("rg-pg-") for r in ranks), labels
        assert driver.proc.wait(60) == 0, driver.log_path.read_text()[-3000:]
        side.wait("every reservation released once the trainer's placement group is gone",
                  lambda: nothing_left(admin, ns, CLUSTER), 180)
        made = {r["reservation"] for r in side.records("scale-up-reserved")}
        print(f"reservations made: {sorted(made)} (first group {group}); "
              f"followed: {len(side.records('scale-up-retarget'))}")
    finally:
        driver.stop()
        side.stop()
    print(f"wall time {time.monotonic() - t0:.0f}s")


def test_a_plain_strict_spread_placement_group_gets_its_gang_runs_and_leaves_nothing(testbed, ns, pool, kube,
                                                                                   tmp_path):
    t0 = time.monotonic()
    admin = KubeAdapter(str(testbed.kubeconfig))
    addr = scale_up_cluster(testbed, ns, pool, kube, gpu_nodes=4)
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar.log")
    driver = Driver(PLAIN_PG, addr, tmp_path / "driver.log")
    try:
        pg_id = driver.next("pg", 120)
        reserved = side.wait("the sidecar reserves a gang for the pending placement group",
                             lambda: side.records("scale-up-reserved", placement_group=pg_id), 90)
        group = reserved[0]["group"]
        assert reserved[0]["pods"] == 4 and reserved[0]["backend"] == "coscheduling", reserved
        assert driver.next("ready", 300) is True, driver.log_path.read_text()[-3000:]
        nodes = driver.next("nodes", 150)
        labels = driver.next("labels", 5)
        assert len(set(nodes)) == 4, nodes  # STRICT_SPREAD: four Ray nodes
        # ... and every one is a node of the reservation's pods
        assert all(labels[n].get(LABEL_RESERVATION) == group for n in nodes), (group, labels)
        states = [cm for cm in admin.list("v1", "ConfigMap", ns, LABEL_RESERVATION)
                  if (cm["metadata"].get("labels") or {}).get(LABEL_CREATED_BY)]
        assert len(states) == 1 and states[0]["metadata"]["annotations"][ANNOTATION_PLACEMENT_GROUP] == pg_id
        assert len(side.records("scale-up-reserved")) == 1  # one reservation for the one placement group
        assert driver.next("done", 60) is True
        side.wait("the reservation released once the placement group is gone",
                  lambda: side.records("released", reason="PlacementGroupGone"), 120)
        wait_for("nothing left", lambda: nothing_left(admin, ns, CLUSTER), 120)
    finally:
        driver.stop()
        side.stop()
    print(f"wall time {time.monotonic() - t0:.0f}s")


# Ray Tune (installed with ray[train]): one trial whose resources are a PlacementGroupFactory of two 8-GPU
# bundles, STRICT_SPREAD; Tune's controller (in the driver) creates the trial's placement group, the trial runs
# on bundle 0 and starts a task on bundle 1.
TUNE = textwrap.dedent("""
    import json, sys, tempfile, ray
    from ray import tune
    assert "raygpu" not in sys.modules
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    say = lambda **kw: print(json.dumps(kw), flush=True)

    def trial(config):
        import ray
        from ray import tune
        from ray.util.placement_group import get_current_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        pg = get_current_placement_group()
        where = ray.remote(num_gpus=8, num_cpus=0)(lambda: ray.get_runtime_context().get_node_id())
        other = ray.get(where.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=1)).remote(), timeout=120)
        tune.report({"nodes": [ray.get_runtime_context().get_node_id(), other], "pg": pg.id.hex()})

    factory = tune.PlacementGroupFactory([{"GPU": 8, "CPU": 0}] * 2, strategy="STRICT_SPREAD")
    tuner = tune.Tuner(tune.with_resources(trial, factory), tune_config=tune.TuneConfig(num_samples=1),
                       run_config=tune.RunConfig(name="gang-scale-up-tune", storage_path=tempfile.mkdtemp()))
    say(started=True)
    results = tuner.fit()
    res = results[0]
    say(error=None if res.error is None else str(res.error))
    say(metrics={"nodes": res.metrics["nodes"], "pg": res.metrics["pg"]})
    labels = {n["NodeID"]: n.get("Labels") or {} for n in ray.nodes()}
    say(labels={n: labels.get(n, {}) for n in res.metrics["nodes"]})
    assert "raygpu" not in sys.modules
""")


def test_a_ray_tune_trial_with_a_placement_group_factory_gets_its_gang_and_leaves_nothing(testbed, ns, pool, kube,
                                                                                         tmp_path):
    t0 = time.monotonic()
    admin = KubeAdapter(str(testbed.kubeconfig))
    addr = scale_up_cluster(testbed, ns, pool, kube, gpu_nodes=2)
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar.log")
    driver = Driver(TUNE, addr, tmp_path / "driver.log")
    try:
        assert driver.next("started", 120) is True
        reserved = side.wait("the sidecar reserves a gang for the trial's placement group",
                             lambda: side.records("scale-up-reserved"), 120)
        assert reserved[0]["pods"] == 2, reserved
        assert driver.next("error", 300) is None, driver.log_path.read_text()[-3000:]
        metrics = driver.next("metrics", 5)
        labels = driver.next("labels", 10)
        assert len(set(metrics["nodes"])) == 2, metrics  # STRICT_SPREAD: two Ray nodes ...
        # ... each a node of the reservation made for this trial's placement group
        assert {labels[n].get(LABEL_RESERVATION) for n in metrics["nodes"]} == {reserved[0]["group"]}, labels
        assert reserved[0]["placement_group"] == metrics["pg"], (reserved, metrics)
        assert driver.proc.wait(60) == 0, driver.log_path.read_text()[-3000:]
        side.wait("the reservation released once the trial's placement group is gone",
                  lambda: nothing_left(admin, ns, CLUSTER), 180)
        assert len(side.records("scale-up-reserved")) == 1
    finally:
        driver.stop()
        side.stop()
    print(f"wall time {time.monotonic() - t0:.0f}s")
