"""Gang scale-up under faults, on the testbed: the sidecar talks to the API server through the fault proxy.

An unmodified Ray driver (no ``import raygpu``) makes a plain ``[{"GPU": 8}] * 2`` STRICT_SPREAD placement
group and holds it until the test lets it go. While the sidecar makes its reservation, each of its writes
fails once (503 on the state ConfigMap, the PodGroup and the RayCluster patch, and a ConfigMap create that
lands but whose answer is lost); the sidecar is killed in the middle of making one (its RayCluster patch
hangs) and again while it is READY; the placement group is removed while its reservation is being made (its
RayCluster patch is slowed down). Every time: never two reservations (a poller samples the state
ConfigMaps and reservation groups all along), the job runs to its end, and nothing is left.
"""

from __future__ import annotations

import signal
import textwrap
import threading
from pathlib import Path

import pytest

from raygpu.adapters.kube import KubeAdapter
from raygpu.model.labels import LABEL_CREATED_BY, LABEL_RESERVATION
from raygpu.testing.controlplane import ADMIN_TOKEN
from raygpu.testing.faultproxy import Delay, Fail, Hang, Rule, start_for
from tests.integration.gang_helpers import CM_PATH, RC_PATH, body_has, nothing_left
from tests.integration.scale_up_helpers import CLUSTER, UNMODIFIED, scale_up_cluster
from tests.integration.sidecar_helpers import Driver, Sidecar
from tests.integration.util import wait_for

BACKOFF = ("--debug-scale-up-backoff-s", "1")  # a failed attempt is retried in seconds, not 30 s
PG_PATH = r"/apis/scheduling\.x-k8s\.io/v1alpha1/namespaces/[^/]+/podgroups"
HOLD = UNMODIFIED + textwrap.dedent("""
    pg = placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD")
    say(pg=pg.id.hex())
    say(ready=pg.wait(400))

    @ray.remote(num_gpus=8, num_cpus=0)
    class Holder:
        def node(self):
            return ray.get_runtime_context().get_node_id()
    holders = [Holder.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=i)).remote() for i in range(2)]
    say(nodes=ray.get([h.node.remote() for h in holders], timeout=120))
    sys.stdin.readline()  # the job runs until the test says
    say(still=ray.get([h.node.remote() for h in holders], timeout=60))
    remove_placement_group(pg)
    say(done=True)
""")


class Census:
    """Samples, every 0.2 s, the gang scale-up state ConfigMaps and reservation worker groups: the most ever
    seen at once is what 'never a second reservation' is checked on."""

    def __init__(self, kube: KubeAdapter, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.most_configmaps = self.most_groups = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                cms = [c for c in self.kube.list("v1", "ConfigMap", self.ns, LABEL_RESERVATION)
                       if (c["metadata"].get("labels") or {}).get(LABEL_CREATED_BY)]
                groups = [g for g in self.kube.get_raycluster(self.ns, CLUSTER).worker_groups
                          if g.group_name.startswith("rg-") and g.replicas > 0]
                self.most_configmaps = max(self.most_configmaps, len(cms))
                self.most_groups = max(self.most_groups, len(groups))
            except Exception:  # noqa: BLE001 - a sample that fails is skipped
                pass
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def env(testbed, ns, pool, kube, tmp_path, keep_on_failure):
    """The cluster (3 x 8-GPU nodes, an 8-GPU template at 0 replicas, gang scale-up on), the proxy the sidecar
    talks through, and the GCS address."""
    with start_for(testbed) as proxy:
        keep_on_failure("sidecar-proxy.log", proxy.write_log)
        addr = scale_up_cluster(testbed, ns, pool, kube, gpu_nodes=3)
        kc = proxy.kubeconfig_for_token(ADMIN_TOKEN, tmp_path / "sidecar.kubeconfig")
        yield proxy, addr, Path(kc)


def finish(driver: Driver, admin: KubeAdapter, ns: str, side: Sidecar, census: Census) -> None:
    """The job ends as it would have without the faults; then nothing is left and there was never a second."""
    nodes = driver.next("nodes", 150)
    driver.proc.stdin.write("go\n")
    driver.proc.stdin.flush()
    assert driver.next("still", 90) == nodes  # the same Ray nodes held its bundles all along
    assert driver.next("done", 60) is True
    side.wait("the reservation released once the placement group is gone",
              lambda: side.records("released", reason="PlacementGroupGone"), 120)
    wait_for("nothing left", lambda: nothing_left(admin, ns, CLUSTER), 120)
    census.stop()
    assert (census.most_configmaps, census.most_groups) == (1, 1), vars(census)


def test_every_write_of_the_scale_up_failing_once_leaks_nothing_and_makes_one_reservation(env, testbed, ns,
                                                                                         tmp_path):
    proxy, addr, kc = env
    admin = KubeAdapter(str(testbed.kubeconfig))
    ours = body_has(LABEL_CREATED_BY.encode())
    rules = [proxy.add(Rule(verb="POST", path=CM_PATH, action=Fail(503), times=1, when=ours)),
             proxy.add(Rule(verb="POST", path=CM_PATH, action=Fail(500, forward=True), times=1, when=ours)),
             proxy.add(Rule(verb="POST", path=PG_PATH, action=Fail(503), times=1)),
             proxy.add(Rule(verb="PATCH", path=RC_PATH, action=Fail(503), times=1, when=body_has(b'"rg-pg-')))]
    census = Census(admin, ns)
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar.log", *BACKOFF, kubeconfig=kc)
    driver = Driver(HOLD, addr, tmp_path / "driver.log")
    try:
        pg_id = driver.next("pg", 120)
        assert driver.next("ready", 400) is True, driver.log_path.read_text()[-3000:]
        for rule in rules:  # each fault was really injected
            assert proxy.spent(rule), rule
        lost = next(s for s in proxy.log if s.rule is rules[1])
        assert (lost.status, lost.upstream_status) == (500, 201), lost  # it landed; the sidecar heard it failed
        assert len(side.records("scale-up-failed", placement_group=pg_id)) == 4, side.records("scale-up-failed")
        assert len(side.records("scale-up-reserved", placement_group=pg_id)) == 1
        finish(driver, admin, ns, side, census)
    finally:
        census.stop()
        driver.stop()
        side.stop()


def test_a_sidecar_killed_while_reserving_and_again_while_ready_makes_exactly_one(env, testbed, ns, tmp_path):
    proxy, addr, kc = env
    admin = KubeAdapter(str(testbed.kubeconfig))
    hang = proxy.add(Rule(verb="PATCH", path=RC_PATH, action=Hang(), times=1, when=body_has(b'"rg-pg-')))
    census = Census(admin, ns)
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar-1.log", *BACKOFF, kubeconfig=kc)
    driver = Driver(HOLD, addr, tmp_path / "driver.log")
    try:
        pg_id = driver.next("pg", 120)
        wait_for("the sidecar's RayCluster patch hangs", lambda: any(s.rule is hang for s in proxy.log), 90)
        assert side.signal(signal.SIGKILL) is not None  # killed half-way: state ConfigMap and PodGroup made
        proxy.release()
        side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar-2.log", *BACKOFF, kubeconfig=kc)
        # the restarted sidecar finds a reservation still planned with no worker group: rolled back, made again
        side.wait("the half-made reservation rolled back", lambda: side.records(
            "released", reason="Incomplete"), 120)
        side.wait("a new reservation made", lambda: side.records("scale-up-reserved", placement_group=pg_id), 90)
        assert driver.next("ready", 400) is True, driver.log_path.read_text()[-3000:]
        side.wait("the reservation marked ready", lambda: side.records("scale-up-ready"), 60)
        assert side.signal(signal.SIGKILL) is not None  # killed again, while the gang runs
        side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar-3.log", *BACKOFF, kubeconfig=kc)
        side.wait("the restarted sidecar keeps the gang it finds in use", lambda: side.records(
            "gc-decision", reason="InUse"), 60)
        assert not side.records("scale-up-reserved") and not side.records("released")
        finish(driver, admin, ns, side, census)
    finally:
        census.stop()
        driver.stop()
        side.stop()


REMOVE = UNMODIFIED + textwrap.dedent("""
    pg = placement_group([{"GPU": 8}] * 2, strategy="STRICT_SPREAD")
    say(pg=pg.id.hex())
    sys.stdin.readline()  # the test says when: while the sidecar's reservation is being made
    remove_placement_group(pg)
    say(removed=True)
    sys.stdin.readline()
""")


def test_a_placement_group_removed_while_its_reservation_is_made_is_rolled_back_and_nothing_left(env, testbed, ns,
                                                                                                  tmp_path):
    proxy, addr, kc = env
    admin = KubeAdapter(str(testbed.kubeconfig))
    slow = proxy.add(Rule(verb="PATCH", path=RC_PATH, action=Delay(8), times=1, when=body_has(b'"rg-pg-')))
    census = Census(admin, ns)
    side = Sidecar(testbed, ns, CLUSTER, addr, tmp_path / "sidecar.log", *BACKOFF, kubeconfig=kc)
    driver = Driver(REMOVE, addr, tmp_path / "driver.log")
    try:
        pg_id = driver.next("pg", 120)
        wait_for("the sidecar's RayCluster patch is on its way", lambda: any(s.rule is slow for s in proxy.log), 90)
        driver.proc.stdin.write("remove\n")
        driver.proc.stdin.flush()
        assert driver.next("removed", 30) is True
        assert proxy.wait_seen(lambda s: s.rule is slow, 30).upstream_status == 200  # the group landed after
        side.wait("the reservation of the removed placement group released", lambda: side.records(
            "released", reason="PlacementGroupGone"), 120)
        wait_for("nothing left", lambda: nothing_left(admin, ns, CLUSTER), 120)
        census.stop()
        assert (census.most_configmaps, census.most_groups) == (1, 1), vars(census)
        assert len(side.records("scale-up-reserved", placement_group=pg_id)) == 1
    finally:
        census.stop()
        driver.stop()
        side.stop()
